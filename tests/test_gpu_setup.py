"""The GPU set-up (`scripts/setup-gpu-env.sh`, what `make run` runs on a GPU box) on machines
it was never run on: `python3`, `nvidia-smi`, the compiler, `uv` and the package install are
played by small programs on the PATH, each answering as a real one does on such a machine. The
script is the repository's own, run from a copy of the repository's layout."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A Python: `-c` answers the script's probe (version, ensurepip, include folder) from the
# environment; `-m venv DIR` makes DIR/bin/python, a venv's Python that logs its installs.
FAKE_PYTHON = r"""#!/bin/bash
if [ "$1" = "-c" ]; then
  [ -n "$FAKE_PY_VERSION" ] || exit 1
  echo "$FAKE_PY_VERSION ${FAKE_ENSUREPIP:-1} $FAKE_INCLUDE"
  exit 0
fi
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  cp "$FAKE_BIN/venv-python" "$3/bin/python"
  printf '#!%s/bin/python\n' "$(cd "$3" && pwd)" > "$3/bin/pip"
  echo "venv $3" >> "$FAKE_LOG"
  exit 0
fi
exit 2
"""

# A venv's Python: pip installs are logged (and fail on FAKE_PIP_RC); `import vllm, gradio`
# works unless FAKE_IMPORT_FAILS.
VENV_PYTHON = r"""#!/bin/bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "pip $*" >> "$FAKE_LOG"
  exit "${FAKE_PIP_RC:-0}"
fi
if [ "$1" = "-c" ]; then
  echo "import" >> "$FAKE_LOG"
  [ -z "$FAKE_IMPORT_FAILS" ] || { echo "ModuleNotFoundError: No module named 'vllm'" >&2; exit 1; }
  exit 0
fi
exit 2
"""

FAKE_SMI = """#!/bin/bash
echo "$FAKE_DRIVER"
"""

FAKE_UV = r"""#!/bin/bash
echo "uv $*" >> "$FAKE_LOG"
if [ "$1" = "venv" ]; then
  folder="${@: -1}"
  mkdir -p "$folder/bin"
  cp "$FAKE_BIN/venv-python" "$folder/bin/python"
fi
exit 0
"""


def program(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


class Machine:
    """A machine the set-up runs on: a copy of the repository's script and requirements, and a
    PATH with only the programs this machine has (plus the shell's own tools)."""

    def __init__(self, root: Path) -> None:
        self.repo = root / "repo"
        (self.repo / "scripts").mkdir(parents=True)
        shutil.copy(ROOT / "scripts" / "setup-gpu-env.sh", self.repo / "scripts")
        shutil.copy(ROOT / "requirements.txt", self.repo)
        self.bin = root / "bin"
        self.bin.mkdir()
        self.include = root / "include"
        self.include.mkdir()
        self.log = root / "log"
        self.log.touch()
        program(self.bin, "venv-python", VENV_PYTHON)
        # The shell's tools, and no python, compiler or driver unless a test gives them.
        self.tools = root / "tools"
        self.tools.mkdir()
        for tool in (
            "bash",
            "cat",
            "cmp",
            "cp",
            "mkdir",
            "rm",
            "mv",
            "grep",
            "sed",
            "xargs",
            "head",
            "tr",
            "pwd",
            "dirname",
            "basename",
            "chmod",
            "env",
        ):
            found = shutil.which(tool)
            assert found, tool
            (self.tools / tool).symlink_to(found)
        self.env = {
            "PATH": f"{self.bin}:{self.tools}",
            "FAKE_BIN": str(self.bin),
            "FAKE_LOG": str(self.log),
            "FAKE_INCLUDE": str(self.include),
            "FAKE_DRIVER": "580.65.06",
            "HOME": str(root),
        }

    def give(self, name: str, text: str = "#!/bin/bash\nexit 0\n") -> None:
        program(self.bin, name, text)

    def typical(self, version: str = "3.12") -> Machine:
        """An Ubuntu box as it should be: driver, compiler, python with venv and headers."""
        self.give("nvidia-smi", FAKE_SMI)
        self.give("cc")
        self.give(f"python{version}", FAKE_PYTHON)
        self.env["FAKE_PY_VERSION"] = version
        (self.include / "Python.h").touch()
        return self

    def set_up(self, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [shutil.which("bash") or "/bin/bash", "scripts/setup-gpu-env.sh"],
            cwd=self.repo,
            env=self.env | env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def logged(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def refused_in_one_line(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_typical_box_builds_once_and_then_only_checks(machine: Machine):
    first = machine.typical().set_up()
    assert first.returncode == 0, first.stderr
    venv = machine.repo / ".venv-gpu"
    assert (venv / ".gpu-env-ready").is_file() and not (machine.repo / ".venv-gpu.partial").exists()
    # Shows pip's progress (no --quiet), installs the pinned requirements, then imports.
    installs = [line for line in machine.logged() if line.startswith("pip")]
    pip = "pip -m pip install --disable-pip-version-check --progress-bar on -r requirements.txt"
    assert installs == [pip]
    assert machine.logged()[-1] == "import"
    # Scripts in bin/ name the folder the environment is in now, not the one it was built in.
    assert (venv / "bin" / "pip").read_text() == f"#!{venv}/bin/python\n"
    machine.log.write_text("")
    again = machine.set_up()
    assert again.returncode == 0 and machine.logged() == []  # nothing run, nothing downloaded


def test_an_older_python_is_refused_before_any_download(machine: Machine):
    machine.typical()
    (machine.bin / "python3.12").unlink()
    machine.give("python3", FAKE_PYTHON)
    line = refused_in_one_line(machine.set_up(FAKE_PY_VERSION="3.10"), "Python 3.11 or newer", "uv")
    assert "python3.12-venv" in line
    assert machine.logged() == [] and not list(machine.repo.glob(".venv-gpu*"))


def test_without_venv_or_headers_it_names_the_package_to_install(machine: Machine):
    machine.typical("3.11")
    refused_in_one_line(machine.set_up(FAKE_ENSUREPIP="0"), "python3.11-venv")
    (machine.include / "Python.h").unlink()
    refused_in_one_line(machine.set_up(), "python3.11-dev", "Python.h")
    assert machine.logged() == [] and not list(machine.repo.glob(".venv-gpu*"))


@pytest.mark.parametrize(
    ("missing", "words"),
    [
        ("nvidia-smi", ("no NVIDIA driver", "580")),
        ("cc", ("no C compiler", "build-essential")),
    ],
)
def test_a_missing_driver_or_compiler_is_named(machine: Machine, missing: str, words: tuple[str, ...]):
    machine.typical()
    (machine.bin / missing).unlink()
    refused_in_one_line(machine.set_up(), *words)
    assert machine.logged() == []


def test_a_driver_older_than_cuda_13_needs_is_refused(machine: Machine):
    machine.typical()
    refused_in_one_line(machine.set_up(FAKE_DRIVER="550.144.03"), "550.144.03", "580 or newer")
    assert machine.logged() == []


def test_a_failed_build_is_never_taken_for_a_built_one(machine: Machine):
    machine.typical()
    broken = machine.set_up(FAKE_IMPORT_FAILS="1")
    assert broken.returncode != 0 and "does not import vllm and gradio" in broken.stderr
    assert not (machine.repo / ".venv-gpu").exists()  # nothing in place to be mistaken
    failed_download = machine.set_up(FAKE_PIP_RC="1")
    assert failed_download.returncode != 0 and not (machine.repo / ".venv-gpu").exists()
    fixed = machine.set_up()
    assert fixed.returncode == 0, fixed.stderr
    assert (machine.repo / ".venv-gpu" / ".gpu-env-ready").is_file()


def test_uv_builds_it_and_brings_a_python_where_the_machine_has_none_new_enough(machine: Machine):
    machine.typical()
    (machine.bin / "python3.12").unlink()
    machine.give("python3", FAKE_PYTHON)
    machine.give("uv", FAKE_UV)
    result = machine.set_up(FAKE_PY_VERSION="3.10")
    assert result.returncode == 0, result.stderr
    uv = [line for line in machine.logged() if line.startswith("uv")]
    assert uv[0].startswith("uv venv") and "--python 3.12" in uv[0] and "--relocatable" in uv[0]
    assert uv[1] == "uv pip install --python .venv-gpu.partial/bin/python -r requirements.txt"
    assert (machine.repo / ".venv-gpu" / ".gpu-env-ready").is_file()


def test_the_script_is_what_make_run_runs_on_a_gpu_box():
    makefile = (ROOT / "Makefile").read_text()
    assert "bash scripts/setup-gpu-env.sh\n\t.venv-gpu/bin/python -m app" in makefile
    assert os.access(ROOT / "scripts" / "setup-gpu-env.sh", os.R_OK)
