"""`python -m app`: the catalog listing, settings errors, and the app it starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from ports import free_port

from app.__main__ import DEMO_VARIANTS, catalog_markdown, default_model, offered, with_demo_models
from app.cards import CARDS_DIR, load_cards
from app.config import Settings

ROOT = Path(__file__).resolve().parent.parent
CARDS = load_cards()


def run_app(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "APP_GPU_COUNT": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_command_line_lists_the_catalog_with_availability():
    result = run_app("--list")
    assert result.returncode == 0, result.stderr
    assert "62 model cards" in result.stdout
    assert "qwen2_5_vl" in result.stdout and "needs 8 GPUs" in result.stdout
    available = run_app("--list", "--available")
    assert "llama4" not in available.stdout and "qwen2_5_vl" in available.stdout


def test_command_line_stops_on_a_broken_card_naming_it(tmp_path: Path):
    shutil.copy(CARDS_DIR / "llava.yaml", tmp_path / "llava.yaml")
    (tmp_path / "llava.yaml").write_text(
        (tmp_path / "llava.yaml").read_text(encoding="utf-8") + "surprise: 1\n", encoding="utf-8"
    )
    result = run_app(APP_CARDS_DIR=str(tmp_path))
    assert result.returncode == 2
    assert "llava.yaml" in result.stderr and "surprise" in result.stderr
    assert "Traceback" not in result.stderr


def test_command_line_flags_override_settings_and_name_unknown_models():
    remote = run_app("--list", "--remote-engine", "qwen2_5_vl=http://gpu-box:8000/v1", "--available")
    assert remote.returncode == 0, remote.stderr
    assert "qwen2_5_vl" in remote.stdout
    typo = run_app("--model-folder", "qwen2_5_vll=/models/q")
    assert typo.returncode == 2
    assert "APP_MODEL_FOLDERS names ['qwen2_5_vll']" in typo.stderr and "Traceback" not in typo.stderr
    unknown = run_app("--models", "qwen2_5_vl,no_such_model")
    assert unknown.returncode == 2 and "APP_MODELS names ['no_such_model']" in unknown.stderr


def test_a_gpu_machine_defaults_to_a_small_strong_model_and_gets_no_demo_models(tmp_path: Path):
    settings = Settings(gpu_count=1, demo_dir=tmp_path)
    cards = with_demo_models(CARDS, settings)
    assert not set(DEMO_VARIANTS) & set(cards)
    assert default_model(cards, settings) == "qwen2_5_vl"
    only = Settings(gpu_count=1, models=("llava", "phi3_v"))
    assert set(offered(CARDS, only)) == {"llava", "phi3_v"}
    # phi3_v comes first among the preferred, but runs remote code, which is not allowed here.
    assert default_model(offered(CARDS, only), only) == "llava"


def test_a_machine_that_can_serve_nothing_gets_the_demo_models(tmp_path: Path):
    settings = Settings(gpu_count=0, demo_dir=tmp_path)
    cards = with_demo_models(CARDS, settings)
    assert set(DEMO_VARIANTS) <= set(cards)
    assert default_model(cards, settings) == "demo_tiny_a"
    assert (tmp_path / "tiny-a" / "config.json").exists()
    assert "random weights" in cards["demo_tiny_a"].display_name
    # A remote engine makes a real model servable, so no demo models unless asked for.
    remote = Settings(gpu_count=0, demo_dir=tmp_path, remote_engines={"qwen2_5_vl": "http://gpu:8000/v1"})
    assert not set(DEMO_VARIANTS) & set(with_demo_models(CARDS, remote))
    forced = Settings(gpu_count=0, demo_dir=tmp_path, demo_models=True, remote_engines=remote.remote_engines)
    assert set(DEMO_VARIANTS) <= set(with_demo_models(CARDS, forced))


@pytest.mark.slow
def test_the_run_command_serves_the_page_with_labelled_demo_models(tmp_path: Path):
    """The README's run command on a machine with no GPU: the page comes up offering the demo
    models, labelled as random weights, and the real models as unavailable."""
    port = free_port()
    env = {**os.environ, "APP_GPU_COUNT": "0", "APP_PORT": str(port), "APP_DEMO_DIR": str(tmp_path / "demo")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    app = subprocess.Popen(
        [sys.executable, "-m", "app"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        config = None
        deadline = time.monotonic() + 120
        while config is None and time.monotonic() < deadline and app.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=5) as response:
                    config = json.loads(response.read())
            except OSError:
                time.sleep(0.5)
        assert config is not None, app.stdout.read() if app.poll() is not None else "no page in 120 s"
        text = json.dumps(config)
        assert "Tiny random Qwen2-VL (tiny-a, random weights: for trying the interface)" in text
        assert "Qwen2.5-VL 3B Instruct (unavailable)" in text
    finally:
        app.terminate()
        app.wait(30)


def test_the_readme_catalog_table_matches_the_cards():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- catalog:start -->\n")[1].split("<!-- catalog:end -->")[0]
    assert table == catalog_markdown(CARDS), "run `python -m app --list --markdown` into the README"
    assert table.count("\n") == len(CARDS) + 2


def test_the_readme_shows_each_main_view_from_the_browser_tests():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for view in ("chat.png", "chat-video.png", "loading.png", "compare.png"):
        assert f"docs/screenshots/{view}" in readme
        assert (ROOT / "docs" / "screenshots" / view).stat().st_size > 10_000
