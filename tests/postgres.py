"""A private PostgreSQL server on loopback for the history tests: Debian's `postgresql` package
(installed by `scripts/setup-cpu-env.sh`), a fresh cluster in a temporary folder, stopped and
deleted afterwards. As root, the server runs as the `postgres` user (it refuses root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ports import free_port


def server_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


@contextmanager
def postgres_server() -> Iterator[str]:
    """Starts a server; yields its SQLAlchemy URL (database `postgres`, no password, loopback)."""
    binaries = server_bin()
    if binaries is None:
        raise RuntimeError("PostgreSQL is not installed: run scripts/setup-cpu-env.sh")
    folder = Path(tempfile.mkdtemp(prefix="pg-tests-"))
    data, port = folder / "data", free_port()
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    if as_postgres:
        shutil.chown(folder, "postgres")

    def run(*command: str) -> None:
        subprocess.run([*as_postgres, *command], check=True, capture_output=True, timeout=120)

    run(str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
    run(str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)
