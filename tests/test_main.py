"""`python -m app`: the catalog listing, settings errors, and the app it starts."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from ports import free_port

from app.__main__ import catalog_markdown, default_model, reach_from_elsewhere
from app.catalog.cards import CARDS_DIR, load_cards
from app.config import Settings, env_name, flag_name
from app.demo.models import DEMO_MODELS, DEMO_TWINS, offered, with_demo_models

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
    assert "qwen2_5_vl" in result.stdout and "needs 8 NVIDIA GPUs" in result.stdout
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


def test_the_arena_and_the_default_model_can_name_the_demo_models():
    named = ",".join(DEMO_MODELS[:2])
    listed = run_app("--list", APP_GPU_COUNT="0", APP_ARENA_MODELS=named, APP_DEFAULT_MODEL=DEMO_MODELS[0])
    assert listed.returncode == 0, listed.stderr
    assert run_app("--list", APP_ARENA_MODELS="demo_no_such").returncode == 2


def test_a_gpu_machine_defaults_to_a_small_strong_model_and_gets_no_demo_models(tmp_path: Path):
    settings = Settings(gpu_count=1, demo_dir=tmp_path)
    cards = with_demo_models(CARDS, settings)
    assert not set(DEMO_TWINS) & set(cards)
    assert default_model(cards, settings) == "qwen2_5_vl"
    only = Settings(gpu_count=1, models=("llava", "phi3_v"))
    assert set(offered(CARDS, only)) == {"llava", "phi3_v"}
    # phi3_v comes first among the preferred, but runs remote code, which is not allowed here.
    assert default_model(offered(CARDS, only), only) == "llava"


def test_a_machine_that_can_serve_nothing_gets_the_demo_models(tmp_path: Path):
    settings = Settings(gpu_count=0, demo_dir=tmp_path)
    cards = with_demo_models(CARDS, settings)
    assert set(DEMO_MODELS) <= set(cards)
    # The model that answers meaningfully first (the twins' answers are nonsense).
    assert default_model(cards, settings) == "demo_seeing"
    assert (tmp_path / "qwen2_vl" / "config.json").exists()
    # The demo models are the real cards, served from their twins, and labelled so.
    for key, of in DEMO_TWINS.items():
        assert cards[key].display_name == f"{CARDS[of].display_name}: random-weight twin"
        assert cards[key].prompt == CARDS[of].prompt and cards[key].engine_args["load_format"] == "dummy"
    assert cards["demo_qwen2_vl"].prompt != cards["demo_llava"].prompt
    # A remote engine makes a real model servable, so no demo models unless asked for.
    remote = Settings(gpu_count=0, demo_dir=tmp_path, remote_engines={"qwen2_5_vl": "http://gpu:8000/v1"})
    assert not set(DEMO_TWINS) & set(with_demo_models(CARDS, remote))
    forced = Settings(gpu_count=0, demo_dir=tmp_path, demo_models=True, remote_engines=remote.remote_engines)
    assert set(DEMO_TWINS) <= set(with_demo_models(CARDS, forced))


@pytest.mark.slow
def test_the_run_command_serves_the_page_with_labelled_demo_models(tmp_path: Path):
    """The README's run command on a machine with no GPU: the page comes up offering the demo
    models, labelled as random-weight twins, and the real models as unavailable."""
    port = free_port()
    env = {**os.environ, "APP_GPU_COUNT": "0", "APP_PORT": str(port), "APP_DEMO_DIR": str(tmp_path / "demo")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["XDG_DATA_HOME"] = str(tmp_path / "data")  # where the history goes by default
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
        assert "Qwen2-VL 7B Instruct: random-weight twin" in text
        assert "LLaVA 1.5 7B: random-weight twin" in text
        assert "Shapes and colours: tiny demo model trained here" in text
        # Models this machine cannot serve are listed with the reason, not offered in the picker.
        assert "Qwen2.5-VL 3B Instruct**: needs an NVIDIA GPU" in text
        # The history database, migrated, in the data folder.
        assert (tmp_path / "data" / "vlm-playground" / "playground.db").is_file()
    finally:
        app.terminate()
        app.wait(30)
    # On loopback, its first lines say how to open it from another machine (a GPU box).
    output = app.stdout.read()
    assert f"VLM Playground on http://127.0.0.1:{port}" in output
    assert f"ssh -L {port}:127.0.0.1:{port} " in output and "--host 0.0.0.0" in output


def test_a_page_on_the_network_needs_no_tunnel_line():
    assert reach_from_elsewhere(Settings(gpu_count=0, host="0.0.0.0")) is None  # noqa: S104
    assert "ssh -L 7861:127.0.0.1:7861" in reach_from_elsewhere(Settings(gpu_count=0, port=7861))


def test_a_history_database_that_cannot_be_opened_stops_the_app_with_one_line(tmp_path: Path):
    url = "postgresql+psycopg://someone:secret@127.0.0.1:1/history"
    env = {**os.environ, "APP_GPU_COUNT": "0", "APP_PORT": str(free_port()), "APP_DATABASE_URL": url}
    run = subprocess.run(
        [sys.executable, "-m", "app"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot open the history database"), lines
    assert "secret" not in run.stderr and "Traceback" not in run.stderr


def test_the_catalog_table_matches_the_cards():
    page = (ROOT / "docs" / "CATALOG.md").read_text(encoding="utf-8")
    table = page.split("<!-- catalog:start -->\n")[1].split("<!-- catalog:end -->")[0]
    assert table == catalog_markdown(CARDS), "run `python -m app --list --markdown` into docs/CATALOG.md"
    assert table.count("\n") == len(CARDS) + 2


def test_the_readme_is_short_and_links_every_page_of_the_docs():
    """A newcomer reads the README; everything else is one link away, and every link works."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count("\n") <= 200
    for page in (ROOT / "docs").glob("*.md"):
        assert f"](docs/{page.name})" in readme, page.name
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")]
    for page in pages:
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), (page.name, target)


def test_the_readme_shows_each_main_view_from_the_browser_tests():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for view in ("chat.png", "chat-video.png", "loading.png", "compare.png"):
        assert f"docs/screenshots/{view}" in readme
        assert (ROOT / "docs" / "screenshots" / view).stat().st_size > 10_000


def help_lines() -> dict[str, str]:
    """`python -m app --help`, each option's text on one line, by its first flag."""
    result = run_app("--help")
    assert result.returncode == 0, result.stderr
    options: list[str] = []
    for line in result.stdout.splitlines():
        if line.startswith("  -"):
            options.append(line.strip())
        elif line.startswith("    ") and options:
            options[-1] += " " + line.strip()
    return {option.split()[0].rstrip(","): option for option in options}


def test_help_lists_a_flag_for_every_setting_with_its_variable_and_default():
    lines = help_lines()
    for name in Settings.model_fields:
        flag, variable = flag_name(name), env_name(name)
        assert flag in lines, f"no flag for {name}"
        assert f"({variable}; default: " in lines[flag], lines[flag]
    for flag, default in [
        ("--port", "7860"),
        ("--quantum-s", "30"),
        ("--queue-size", "64"),
        ("--max-upload", "200MB"),
    ]:
        assert f"default: {default})" in lines[flag]
    for flag in ("--allow-remote-code", "--gpu-count", "--cards-dir", "--tensor-parallel-size"):
        assert flag in lines


@pytest.mark.parametrize(
    ("variable", "flag", "text"),
    [
        ("APP_MAX_RESIDENT", "--max-resident", "0"),
        ("APP_GPU_COUNT", "--gpu-count", "abc"),
        ("APP_PORT", "--port", "http"),
        ("APP_QUANTUM_S", "--quantum-s", "-1"),
        ("APP_MEMORY_BUDGET", "--memory-budget", "0"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_variable_or_flag_the_same_way(
    variable: str, flag: str, text: str
):
    from_env = run_app("--list", **{variable: text})
    from_flag = run_app("--list", flag, text)
    for result, name in ((from_env, variable), (from_flag, flag)):
        assert result.returncode == 2, result.stdout
        assert "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1 and f"{name}={text!r}: write " in result.stderr, result.stderr
    assert from_flag.stderr == from_env.stderr.replace(variable, flag)


def test_the_list_has_a_header_and_the_demo_models_a_machine_without_a_gpu_serves(tmp_path: Path):
    demo = {"APP_GPU_COUNT": "0", "APP_DEMO_DIR": str(tmp_path / "demo")}
    listing = run_app("--list", **demo)
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split() == ["key", "model", "repository", "media", "available"]
    served = {row.split()[0] for row in rows if row.rstrip().endswith(" yes")}
    assert served == set(DEMO_MODELS)
    why_not = "no: needs an NVIDIA GPU; this machine has none"
    assert any(row.startswith("llava ") and why_not in row for row in rows)
    # The demo models are named by the repositories they copy, not by folders on this server.
    assert str(tmp_path) not in listing.stdout
    assert any(row.startswith("demo_llava ") and "twin of llava-hf/" in row for row in rows)
    available = run_app("--list", "--available", **demo)
    assert available.returncode == 0, available.stderr
    header, *rows = available.stdout.splitlines()
    assert header.split()[0] == "key"
    assert {row.split()[0] for row in rows if row.strip() and not row.startswith(" ")} >= set(DEMO_MODELS)
    assert not any(row.startswith("llava ") for row in rows)


def test_a_busy_port_is_one_line_before_anything_is_built(tmp_path: Path):
    """Gradio's own refusal was the address line, then a 20-line traceback naming its variable."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {**os.environ, "APP_GPU_COUNT": "0", "APP_DEMO_DIR": str(tmp_path / "demo")}
        done = subprocess.run(
            [sys.executable, "-m", "app", "--port", str(port)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert f"port {port} on 127.0.0.1 cannot be used" in done.stderr and "--port" in done.stderr
    assert not (tmp_path / "demo").exists()  # refused before the demo models were built


def test_vllm_sockets_fit_however_deep_the_apps_folder_is(tmp_path: Path):
    """Under a deep folder (a long APP_DEMO_DIR, a test's temporary folder), every engine build
    failed: vLLM's socket path went past the 107 bytes a Unix socket's name may have."""
    import tempfile
    import uuid

    from app.demo.models import ONEDNN_KERNELS_KEPT, use_local_vllm_environment

    short = Path(tempfile.mkdtemp(prefix="vllm-test-"))
    # The app's folder for vLLM does not exist before its first engine: vLLM binds its socket
    # there without making it (the first build of a fresh `python -m app eval` failed so).
    for scratch in (short / "fresh" / "vllm", tmp_path / ("deep-" * 20) / "vllm"):
        environ: dict[str, str] = {}
        use_local_vllm_environment(scratch, environ)
        folder = Path(environ["VLLM_RPC_BASE_PATH"])
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(folder / str(uuid.uuid4())))  # as vLLM names its sockets
        assert environ["VLLM_CACHE_ROOT"].startswith(str(scratch))
        # A cache the environment already names is kept (the tests share one across processes).
        kept = {"VLLM_CACHE_ROOT": str(short / "kept")}
        use_local_vllm_environment(scratch, kept)
        assert kept["VLLM_CACHE_ROOT"] == str(short / "kept")
        # oneDNN's cache of kernels bounded (an engine grew with each new prompt length), unless
        # the operator bounds it otherwise.
        assert environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_KERNELS_KEPT)
        assert kept["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_KERNELS_KEPT)
        own = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8", "OMP_NUM_THREADS": "3"}
        use_local_vllm_environment(scratch, own)
        assert own["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "8"
        # Each engine half the cores (two answering at once oversubscribed them), unless the
        # operator says otherwise.
        assert environ["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
        assert own["OMP_NUM_THREADS"] == "3"
        empty = {"VLLM_CACHE_ROOT": ""}
        use_local_vllm_environment(scratch, empty)
        assert empty["VLLM_CACHE_ROOT"].startswith(str(scratch))
        if folder != scratch:  # a folder of its own, private to the app
            assert folder.stat().st_mode & 0o077 == 0
        shutil.rmtree(folder)
    assert folder != scratch


def test_vllm_sockets_fit_where_the_systems_temporary_folder_is_deep_too(tmp_path: Path, monkeypatch):
    """A deep folder for the app and a deep TMPDIR (a cluster job's, a test worker's): the
    fallback under the system's temporary folder was too long as well, and every build failed."""
    import tempfile
    import uuid

    from app.demo.models import use_local_vllm_environment

    deep = tmp_path / ("deep-" * 20)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    environ: dict[str, str] = {}
    use_local_vllm_environment(deep / "vllm", environ)
    folder = Path(environ["VLLM_RPC_BASE_PATH"])
    try:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(folder / str(uuid.uuid4())))  # as vLLM names its sockets
        assert folder.stat().st_mode & 0o077 == 0  # a folder of its own, private to the app
    finally:
        shutil.rmtree(folder, ignore_errors=True)
