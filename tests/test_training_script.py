"""`scripts/train_seeing_model.py` refuses steps it cannot train before it trains anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "train_seeing_model.py"


REFUSED = [["--answer-steps", "0"], ["--vision-steps", "0"], ["--box-steps", "-1"], ["--named-steps", "-5"]]


@pytest.mark.parametrize("steps", REFUSED)
def test_steps_it_cannot_train_are_refused_in_one_line_before_training(steps: list[str], tmp_path: Path):
    out = tmp_path / "model"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--per-kind", "0", *steps],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("--vision-steps and --answer-steps take 1 or more, the later lessons' 0 or more")
    )
    assert "Traceback" not in done.stderr and not out.exists()
    assert list(tmp_path.iterdir()) == []  # no scratch folder either
