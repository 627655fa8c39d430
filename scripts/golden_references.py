"""Writes tests/golden/references.json again from the reference examples in ../shared/seeds (or
APP_REFERENCE_SEEDS): runs the catalog tests with the references executed instead of read, and
records every call they make. Run it after a change to the seeds or to what the tests ask.

    python scripts/golden_references.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_adapters.py", "tests/test_cards.py"]


def main() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from reference_scripts import SEEDS_DIR

    if not SEEDS_DIR.is_dir():
        print(f"error: no seeds at {SEEDS_DIR}: set APP_REFERENCE_SEEDS to the seeds folder", file=sys.stderr)
        return 2
    env = {**os.environ, "REFERENCES_RECORD": "1"}
    # -p no:xdist: one process records every call into one file.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *TESTS]
    done = subprocess.run(command, cwd=ROOT, env=env, check=False)  # noqa: S603 (our own command)
    golden = ROOT / "tests" / "golden" / "references.json"
    print(f"wrote {golden}" if done.returncode == 0 else "the tests failed: nothing written")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
