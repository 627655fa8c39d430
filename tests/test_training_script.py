"""`scripts/train_seeing_model.py` refuses steps it cannot train, and a seed of lesson two it
would not use, before it trains anything; a lesson two of another seed is stamped with it."""

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


@pytest.mark.parametrize("without", [[], ["--second-lesson-from", "static/seeing-model", "--evaluate-only"]])
def test_another_answers_seed_needs_lesson_two_on_its_own(without: list[str], tmp_path: Path):
    """The whole recipe's lesson two keeps the recipe's seed: its weights are the app's; and an
    evaluation trains nothing, so a seed there would be ignored."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "model"), "--answers-seed", "5", *without],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("--answers-seed needs --second-lesson-from (lesson two on a saved model's tower)")
    )
    assert list(tmp_path.iterdir()) == []


ONE_STEP_OF_LESSON_TWO = ["--per-kind", "0", "--answer-steps", "1", "--named-steps", "0", "--box-steps", "0"]


@pytest.mark.slow  # three trainings of a step, about 13 s
def test_lesson_two_of_another_seed_learns_otherwise_and_is_stamped_with_it(tmp_path: Path):
    """`--answers-seed K`: lesson two draws other questions (other weights from the same
    tower), and the stamp says so, so that the app never takes them for the recipe's; a later
    lesson run on them keeps saying it."""
    from safetensors.torch import load_file

    from app.demo import seeing_model
    from app.demo.models import SEEING_FOLDER

    def run(*arguments: str) -> None:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *ONE_STEP_OF_LESSON_TWO, *arguments],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]

    for name, seed in (("recipe's", []), ("other", ["--answers-seed", "5"])):
        run("--second-lesson-from", str(SEEING_FOLDER), "--out", str(tmp_path / name), *seed)
    run("--fourth-lesson-from", str(tmp_path / "other"), "--box-steps", "1", "--out", str(tmp_path / "later"))
    steps = seeing_model.Steps(vision=12000, answers=1, named=0, boxes=0)
    assert seeing_model.made_by(tmp_path / "recipe's", seeing_model.training_stamp(steps))
    other = seeing_model.training_stamp(steps, seeing_model.SEED + 5)
    assert other["answers_seed"] == seeing_model.SEED + 5
    assert seeing_model.made_by(tmp_path / "other", other)
    assert not seeing_model.made_by(tmp_path / "other", seeing_model.training_stamp(steps))
    later = seeing_model.stamp_of(tmp_path / "later")
    assert later["answers_seed"] == seeing_model.SEED + 5 and later["steps"]["boxes"] == 1
    weights = [load_file(tmp_path / name / "model.safetensors") for name in ("recipe's", "other")]
    assert any(not weights[0][key].equal(weights[1][key]) for key in weights[0])
