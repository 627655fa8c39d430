"""Every command the docs give a reader is run by a test or by CI, or, where it needs what these
machines lack (a GPU, Docker, a 72B model), checked as far as can be here.

The commands are the lines of the docs' `bash` blocks (continuations joined) and the README's
two. Each must match an entry of `RUN_BY`, which names the test that runs it; the test must
exist, so renaming or deleting it breaks the link here. A new command in the docs fails this
test until someone says what runs it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

# (what the command starts with, the test that runs it, or how it is checked where it cannot run)
RUN_BY: list[tuple[str, str]] = [
    ("make test", ".ci/run (CI runs it on a clean clone)"),
    ("make run", "tests/test_main.py::test_the_run_command_serves_the_page_with_labelled_demo_models"),
    (
        "APP_REMOTE_ENGINES=",
        "tests/test_remote_engine.py::test_image_and_video_answers_stream_through_a_remote_server",
    ),
    (
        ".venv/bin/python -m app eval",
        "tests/test_grid.py::test_the_command_line_runs_a_set_into_reports_and_resumes",
    ),
    ("python -m app add-user", "tests/test_sign_in.py::test_add_user_writes_an_account_from_standard_input"),
    (
        "APP_SIGN_IN=password",
        "tests/test_sign_in.py::test_with_passwords_gradios_login_page_signs_in_and_the_account_keeps_its_history",
    ),
    # Needs a GPU and many hours of downloads: its flags are parsed by vLLM's own parser below.
    ("vllm serve", "tests/test_docs_commands.py::test_the_vllm_serve_commands_parse_with_vllms_own_parser"),
    # No Docker here: hadolint (make lint) and the Dockerfile's checks against the base image.
    ("docker build", "tests/test_shipping.py::test_the_user_step_runs_on_the_base_images_user_table"),
    (
        "docker run",
        "tests/test_shipping.py::test_the_image_serves_on_7860_as_a_user_with_a_health_check_and_a_cache_volume",
    ),
    (
        ".venv/bin/python bench/memory_table.py",
        "tests/test_memory.py::test_the_memory_table_in_the_docs_is_what_the_script_prints",
    ),
    # The script's training and evaluation are the functions the seeing tests call (the script
    # trains with the arithmetic pinned; `tests/test_training_script.py` runs it).
    (
        ".venv/bin/python scripts/train_seeing_model.py",
        "tests/test_seeing.py::test_held_out_accuracy_is_above_the_floor_for_every_question_kind",
    ),
]


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for each line of every `bash` block in the docs, and the README's two."""
    found = []
    for page in DOCS:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"^ *```(?:bash|sh|shell)\n(.*?)^ *```", text, re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                command = line.split("  #")[0].strip()
                if command and not command.startswith("#"):
                    found.append((page.relative_to(ROOT).as_posix(), command))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found += [
        ("README.md", command) for command in re.findall(r"^Run the (?:app|tests): `([^`]+)`", readme, re.M)
    ]
    return found


def test_the_readmes_two_commands_are_found():
    assert [command for where, command in documented_commands() if where == "README.md"][:2] == [
        "make run",
        "make test",
    ]


def test_every_documented_command_is_run_by_a_test_or_by_ci():
    unaccounted = [
        f"{where}: {command}"
        for where, command in documented_commands()
        if not any(command.startswith(start) for start, _ in RUN_BY)
    ]
    assert not unaccounted, "say in RUN_BY what runs these: " + "; ".join(unaccounted)


@pytest.mark.parametrize("start, runner", RUN_BY)
def test_each_named_test_exists(start: str, runner: str):
    if runner.startswith(".ci/run"):
        assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
        return
    path, name = runner.split("::")
    assert re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), runner


@pytest.mark.vllm
def test_the_vllm_serve_commands_parse_with_vllms_own_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    serves = [
        shlex.split(command)[2:] for _, command in documented_commands() if command.startswith("vllm serve")
    ]
    assert serves
    for arguments in serves:
        parsed = parser.parse_args(arguments)
        assert parsed.model_tag == arguments[0] and parsed.limit_mm_per_prompt
    with pytest.raises(SystemExit):
        parser.parse_args(["a/model", "--no-such-flag", "1"])
