"""The GPU check's decisions that need no GPU (bench/gpu_check): which two models a card runs,
how the two-engine phases are sized from measured footprints, when real weights are used, and
the table it prints for docs/BENCHMARKS.md. Its engine phases need a GPU and vLLM's CUDA build
(none here); `--dry-run` runs here in full."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from gpu_check import readings
from gpu_check.common import BUDGET_FRACTION, ENGINE_MARGIN_BYTES, SPECS, choose_pair
from gpu_check.folders import cached_weights
from gpu_check.machine import why_no_cuda
from gpu_check.phase import Model, Plan
from gpu_check.readings import within
from gpu_check.report import markdown
from ui_pages import poll

from app.engines.memory import GPU_ENGINE_OVERHEAD_BYTES

GB = 10**9
ROOT = Path(__file__).resolve().parent.parent


def plan_for(total: int) -> Plan:
    specs = choose_pair(total)
    models = {role: Model(spec, Path("/m") / spec.key, 0.4) for role, spec in specs.items()}
    return Plan(models, swaps=2, tokens=4, timeout_s=60.0, total=total)


@pytest.mark.parametrize(
    ("gpu_gb", "second", "together"),
    [
        (80, "Qwen2-VL-7B-class", True),
        (40, "Qwen2-VL-7B-class", True),
        (24, "Qwen2-VL-2B-class", True),
        (16, "Qwen2-VL-2B-class", False),
    ],
)
def test_the_pair_is_chosen_from_the_gpus_memory_so_two_engines_fit(gpu_gb: int, second: str, together: bool):
    """On a 24 GB card the 2B- and 7B-class models do not fit at once (8.1 + 20.7 GB against a
    21.6 GB budget): two 2B-class engines do, so sleep against rebuild is still measured."""
    plan = plan_for(gpu_gb * GB)
    assert plan.models["small"].spec is SPECS["small"]
    assert plan.models["large"].spec.title.startswith(second)
    assert plan.models["large"].spec.key != plan.models["small"].spec.key  # two folders, two cards
    assert plan.fits_together()[0] is together


def test_on_16_gb_the_measured_footprints_decide_and_size_the_shares():
    plan = plan_for(16 * GB)
    fits, why = plan.fits_together()
    assert not fits and "expected" in why and "14.901 GiB" in why  # 16 GB
    # The 2B-class build took 6.5 GB (its real overhead below the expected 3 GiB): both fit.
    plan.measured.update(small=int(6.5 * GB), large=int(6.5 * GB))
    assert plan.fits_together() == (True, "")
    assert plan.util("small") == pytest.approx(0.44)  # (6.5 GB + 0.5 GiB) / 16 GB, rounded up
    assert plan.util("small") + plan.util("large") <= 0.95


def test_the_checks_expected_overhead_is_the_apps():
    """One figure: the app books engines by it, the check measures it (docs/MEMORY.md)."""
    assert ENGINE_MARGIN_BYTES == GPU_ENGINE_OVERHEAD_BYTES
    assert SPECS["large"].need_bytes + SPECS["small"].need_bytes > BUDGET_FRACTION * 24 * GB


def _cache(root: Path, repo: str, files: dict[str, str]) -> None:
    commit = "1" * 40
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    for name, text in files.items():
        (folder / "snapshots" / commit / name).write_text(text)


def test_real_weights_are_used_only_where_the_whole_model_and_its_tokenizer_are_in_the_cache(tmp_path: Path):
    spec = SPECS["small"]
    index = json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}})
    partial = tmp_path / "partial"
    _cache(
        partial,
        spec.repo,
        {"config.json": "{}", "model.safetensors.index.json": index, "model-1.safetensors": ""},
    )
    assert cached_weights(spec, partial) is None
    weights_only = {
        "config.json": "{}",
        "model.safetensors.index.json": index,
        "model-1.safetensors": "",
        "model-2.safetensors": "",
    }
    _cache(tmp_path / "weights-only", spec.repo, weights_only)
    assert cached_weights(spec, tmp_path / "weights-only") is None  # no tokenizer: the build would fail
    whole = tmp_path / "whole"
    tokenizer = {"tokenizer_config.json": "{}", "tokenizer.json": "{}", "preprocessor_config.json": "{}"}
    _cache(whole, spec.repo, {**weights_only, **tokenizer})
    folder = cached_weights(spec, whole)
    assert folder is not None and (folder / "model-2.safetensors").is_file()
    assert cached_weights(spec, tmp_path / "empty") is None


def test_the_summary_starts_with_a_table_for_the_benchmarks_page():
    def lifecycle(build: float, freed: float, measured: float) -> dict:
        steps = {
            "build": {"seconds": build},
            "rebuild": {"seconds": build / 2},
            "sleep (level 1)": {"seconds": 0.8, "freed_gib": freed},
            "wake": {"seconds": 0.5},
        }
        return {
            "steps": steps,
            "footprint_against_expected": {"measured_gib": measured, "expected_gib": 8.1},
            "checks": [],
        }

    report = {
        "mode": "engine check",
        "meta": {"date": "2026-11-26", "gpu": "NVIDIA L4"},
        "models": {
            "small": {"title": "Qwen2-VL-2B-class", "parameters": 2, "weights_gib": 4.1, "weights": "dummy"},
            "large": {"title": "Qwen2-VL-2B-class (second engine)", "parameters": 2, "weights_gib": 4.1},
        },
        "phases": {
            "lifecycle_small": lifecycle(41.0, 4.0, 7.4),
            "swaps_sleep": {"median_s": {"sleep": 0.7, "wake": 0.6, "answer": 0.2}, "checks": []},
            "swaps_build": {"median_s": {"build": 30.0, "answer": 0.2, "shutdown": 3.0}, "checks": []},
        },
        "checks": [],
        "ok": True,
    }
    text = markdown(report)
    assert "| | Qwen2-VL-2B-class |" in text
    assert "| build (cold), s | 41.00 |" in text and "| rebuild (warm), s | 20.50 |" in text
    assert "| GPU memory taken, measured / expected, GiB | 7.4 / 8.1 |" in text
    assert "by sleep and wake (median): 1.30 s; by shutdown and rebuild (median): 33.00 s (25.4x)." in text


@pytest.mark.slow
def test_the_dry_run_writes_folders_transformers_and_vllm_accept(tmp_path: Path):
    """`bench/gpu_check --dry-run`: both folders written, their configs, processors and parameter
    counts as published, and vLLM's model config built with the check's engine arguments (the KV
    cache in bytes included)."""
    out = tmp_path / "dry.json"
    command = [
        sys.executable,
        "bench/gpu_check",
        "--dry-run",
        "--models-dir",
        str(tmp_path / "m"),
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["ok"] and len(report["checks"]) == 8


def test_engines_cap_pictures_and_fall_back_to_float16_on_older_gpus(monkeypatch):
    """Every engine gets the folders' pixel range (a cached real model's processor would let a
    picture reach 16,384 tokens) and the dtype the GPU takes (no bfloat16 below capability 8.0)."""
    from gpu_check import common
    from gpu_check.engines import engine_args

    args = engine_args(Path("/m"), 0.4, 2**30)
    assert args["mm_processor_kwargs"] == common.PIXELS and args["dtype"] == "bfloat16"
    assert args["kv_cache_memory_bytes"] == 2**30
    monkeypatch.setattr(common, "DTYPE", "float16")
    assert engine_args(Path("/m"), 0.4)["dtype"] == "float16"


@pytest.mark.skipif(why_no_cuda() is None, reason="a GPU here: --readings would run")
def test_the_readings_check_says_in_one_line_why_it_cannot_run_here():
    """`--readings` needs torch's CUDA build and NVML, not vLLM (the H200 lent on 2026-11-29 had
    no vLLM); on this machine it stops with one line and status 2, before touching anything."""
    command = [sys.executable, "bench/gpu_check", "--readings"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "--readings needs an NVIDIA GPU and torch's CUDA build" in done.stderr


def test_a_reading_of_a_held_allocation_is_the_allocation_and_at_most_a_context_more():
    held = 8 * 2**30
    assert within(int(8.596 * 2**30), held)  # the H200's per-process figure, context included
    assert not within(held - 1, held) and not within(held + 3 * 2**30, held) and not within(None, held)


def test_a_process_group_lives_while_a_member_runs_and_not_once_only_its_zombie_is_left():
    """What a holder's kill waits for: a stuck holder's child, killed, was once still running
    when the check went on (CI, on a loaded machine); on a GPU it would still hold its memory."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert readings.group_alive(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        poll(lambda: not readings.group_alive(process.pid), 10)
        # Dead but not yet waited for: a zombie, which holds nothing.
        assert psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE
        assert readings.group_alive(other.pid)  # another group is another matter
    finally:
        for each in (process, other):
            each.kill()
            each.wait()
    assert not readings.group_alive(process.pid) and not readings.group_alive(other.pid)


@pytest.mark.parametrize("via_parent", [False, True])
def test_a_holder_says_when_it_holds_and_goes_when_told(monkeypatch, via_parent: bool):
    """The holders' protocol, without a GPU: a stand-in that holds nothing says "ready", lives
    until its standard input closes (directly, or as the child of a process that waits for it),
    and one that never says so is given up on at the deadline instead of hanging the check."""
    monkeypatch.setattr(readings, "HOLDER", "import sys; print('ready', 7, flush=True); sys.stdin.read()")
    holder = readings.Holder(0, via_parent=via_parent)
    assert holder.reserved == 7 and holder.process.poll() is None
    holder.close()
    assert holder.process.returncode == 0
    stuck = f"import time; time.sleep(60)  # stuck holder {via_parent}"
    monkeypatch.setattr(readings, "HOLDER", stuck)
    monkeypatch.setattr(readings, "READY_TIMEOUT_S", 1.0)
    with pytest.raises(RuntimeError, match="did not allocate"):
        readings.Holder(0, via_parent=via_parent)
    # Nothing of it is left, the parent's child included (on a GPU, it would hold memory).
    left = [p for p in psutil.process_iter(["cmdline"]) if stuck in " ".join(p.info["cmdline"] or [])]
    assert not left
