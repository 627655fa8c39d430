"""Stopping on SIGTERM (how Docker and Hugging Face stop a container) and SIGINT (Ctrl-C).

The first signal wakes the main thread, which stops the app in order (engines, web server,
video decoders); a second signal, or a watchdog when the stop takes too long, cleans up and
exits at once. The cleanup is a last resort: it kills this process's children still running and
removes the vLLM socket files this run left behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

log = logging.getLogger(__name__)

# Longest a stop by SIGTERM or SIGINT takes, from the signal to the process's exit.
SHUTDOWN_TIMEOUT_S = 30.0
ENGINES_CLOSE_S = SHUTDOWN_TIMEOUT_S - 10  # what is left: the web server and the cleanup
FORCE_MARGIN_S = 2.0  # the forced exit starts this long before the limit


class Shutdown:
    """Turns SIGTERM and SIGINT into an orderly stop (see the module's docstring): the first
    signal wakes `wait` in the main thread, which then stops the app; a second one, or the
    watchdog the first one starts, cleans up and exits at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, ipc_dir: Path) -> None:
        self.ipc_dir = ipc_dir
        self.signum: int | None = None
        self.since: float | None = None  # time.monotonic() at the first signal
        self._requested = threading.Event()
        self._sockets_before = socket_files(ipc_dir)

    def install(self) -> None:
        """Call from the main thread (signal handlers run there), before any engine starts."""
        for signum in self.SIGNALS:
            signal.signal(signum, self._on_signal)

    def wait(self) -> None:
        """Blocks until a stop signal arrives (the web server runs in its own thread)."""
        while not self._requested.wait(1.0):
            pass

    def _on_signal(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            self.force(f"{name} received while stopping")
        self.signum, self.since = signum, time.monotonic()
        log.info("%s received: stopping (within %s s)", name, SHUTDOWN_TIMEOUT_S)
        reason = f"not stopped {SHUTDOWN_TIMEOUT_S - FORCE_MARGIN_S:.0f} s after {name}"
        watchdog = threading.Timer(SHUTDOWN_TIMEOUT_S - FORCE_MARGIN_S, self.force, [reason])
        watchdog.daemon = True
        watchdog.start()
        self._requested.set()

    def force(self, reason: str) -> NoReturn:
        log.warning("exiting at once: %s", reason)
        try:
            self.reap()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(128 + (self.signum or signal.SIGTERM))

    def reap(self) -> None:
        """Last resort: kills this process's children still running (the engines' processes
        and theirs; not multiprocessing's resource tracker, which exits by itself with this
        process and cleans up after it), then removes the socket files vLLM left in its IPC
        folder during this run that no other process listens on."""
        from multiprocessing import resource_tracker

        import psutil

        tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
        children = [p for p in psutil.Process().children(recursive=True) if p.pid != tracker]
        for child in children:
            with contextlib.suppress(psutil.Error):
                log.warning("killing %s (pid %s), still running", child.name(), child.pid)
                child.kill()
        psutil.wait_procs(children, timeout=5)
        others = listening_elsewhere()
        for path in socket_files(self.ipc_dir) - self._sockets_before - others:
            with contextlib.suppress(OSError):
                path.unlink()


def socket_files(folder: Path) -> set[Path]:
    """The Unix socket files directly in `folder` (where vLLM puts its IPC sockets)."""
    found = set()
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    found.add(Path(entry.path))
    return found


def listening_elsewhere() -> set[Path]:
    """Socket files bound by a socket this process does not hold: another live process's
    (Linux's /proc; none known elsewhere)."""
    mine = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith("socket:["):
                    mine.add(target[len("socket:[") : -1])
    bound = set()
    with contextlib.suppress(OSError), open("/proc/net/unix", encoding="utf-8", errors="replace") as table:
        next(table, None)
        for line in table:
            fields = line.split(None, 7)
            if len(fields) == 8 and fields[6] not in mine:
                bound.add(Path(fields[7].rstrip("\n")))
    return bound
