"""Stopping `python -m app` with a signal (issue 11): SIGTERM, as Docker and Hugging Face stop a
container, and SIGINT (Ctrl-C) shut the engines down while an answer streams, and the app exits
in time with no engine process, resource tracker or vLLM socket file left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from ports import free_port

from app.shutdown import SHUTDOWN_TIMEOUT_S

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 180


def start_app(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "APP_GPU_COUNT": "0",
        "APP_HOST": "127.0.0.1",
        "APP_PORT": str(port),
        # vLLM's sockets go next to the demo folder, or, in a folder as deep as a worker's
        # temporary one, to a short folder of their own (`socket_folder_of` finds them).
        "APP_DEMO_DIR": str(tmp_path / "demo"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "TMPDIR": str(temporary_folder(tmp_path)),
    }
    log = (tmp_path / "app.log").open("w")
    app = subprocess.Popen(
        [sys.executable, "-m", "app"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and app.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "config", timeout=5).status_code == 200:
                return app, url
        time.sleep(0.5)
    raise AssertionError(f"no page in {START_TIMEOUT_S} s:\n{log_of(tmp_path)}")


def temporary_folder(tmp_path: Path) -> Path:
    """The app's TMPDIR, as deep as a test worker's: vLLM's sockets must still fit (the app
    falls back to /tmp), and what the app leaves there at exit can be seen."""
    folder = tmp_path / "tmp"
    folder.mkdir(exist_ok=True)
    return folder


def log_of(tmp_path: Path) -> str:
    return (tmp_path / "app.log").read_text(encoding="utf-8", errors="replace")[-6000:]


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def socket_folder_of(processes: list[psutil.Process]) -> Path:
    """Where the app told vLLM to put its sockets, read from an engine process's environment."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if folder := process.environ().get("VLLM_RPC_BASE_PATH"):
                return Path(folder)
    raise AssertionError("no engine process carries VLLM_RPC_BASE_PATH")


def sockets_in(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_socket()] if folder.exists() else []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_answer_stops_the_engines_and_leaves_nothing_behind(
    vllm_model_infos: Path, tmp_path: Path, signum: int
):
    from gradio_client import Client

    app, url = start_app(tmp_path)
    children: list[psutil.Process] = []
    try:
        client = Client(url, verbose=False)
        message = {"text": "Count from one to a thousand, one number a line.", "files": []}
        job = client.submit(message, "demo_qwen2_vl", "", 0.0, 1.0, 2000, 0, api_name="/chat")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and not (job.outputs() and children) and not job.done():
            time.sleep(0.2)
            children = psutil.Process(app.pid).children(recursive=True)
        assert job.outputs() and children, f"no answer started:\n{log_of(tmp_path)}"
        assert not job.done(), "the answer ended before the signal; it should still be streaming"
        children = psutil.Process(app.pid).children(recursive=True)
        sockets = socket_folder_of(children)
        assert sockets_in(sockets), f"vLLM's sockets are expected in {sockets}"

        started = time.monotonic()
        os.kill(app.pid, signum)
        try:
            code = app.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {SHUTDOWN_TIMEOUT_S} s after {signum!r}:\n{log_of(tmp_path)}")
        took = time.monotonic() - started
        print(f"{signal.Signals(signum).name}: exited with {code} after {took:.1f} s")
        assert code == 0, log_of(tmp_path)
        # An orphan would be reparented, not ended, so give exiting children a moment only.
        _, left = psutil.wait_procs(children, timeout=2)
        left = [process for process in left if alive(process)]
        assert not left, f"left running: {[(p.pid, p.name()) for p in left]}\n{log_of(tmp_path)}"
        assert not sockets_in(sockets), log_of(tmp_path)
        # The leaderboard's exports are the app's own: its folder goes with it (it stayed before).
        left_behind = sorted(path.name for path in temporary_folder(tmp_path).glob("vlm-playground-*"))
        assert not left_behind, left_behind
        # The first engine's AsyncLLM is collected only as the interpreter exits (a traceback vLLM
        # stores on import keeps the worker frame that built it); its second shutdown there used
        # to print a TypeError traceback. None is printed now.
        log = log_of(tmp_path)
        assert "Traceback" not in log, log
    finally:
        if app.poll() is None:
            app.kill()
            app.wait(10)
        for process in children:
            with contextlib.suppress(psutil.Error):
                process.kill()
