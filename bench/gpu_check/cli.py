"""GPU check: the engine lifecycle on real model sizes, with nothing downloaded.

On a machine with an NVIDIA GPU and vLLM's CUDA build, this writes two model folders (configs,
tokenizer and processor, no weights) with the sizes of Qwen2-VL-2B-Instruct and
Qwen2-VL-7B-Instruct, builds vLLM engines on them with random weights (`load_format="dummy"`;
the real weights where a model is wholly in the Hugging Face cache, tokenizer included, so
rebuilds read them from disk) and the KV cache given in bytes as the app gives it
(`kv_cache_memory_bytes`), and measures. The pair is chosen from the GPU's memory: both models
where they fit in 0.9 of it at once (about 32 GB and up), else two engines of the 2B-class model
(24 GB); the two-engine phases are sized from what each build was measured to take, so a 16 GB
card runs them where the measured footprints fit. It measures:

- build, sleep (level 1), wake, shutdown and rebuild times of each model, with the GPU memory
  after each step (NVML) and one answer before sleeping and one after waking;
- two engines resident at once (each sized with `gpu_memory_utilization` so both fit), each
  answering a request;
- GPU memory before and after repeated swaps between the two models: sleep/wake alternations
  with both engines built, and build/shutdown alternations with one engine at a time;
- one swap through the app's own manager (`EngineManager` with `VllmEngineFactory`, one GPU,
  one engine awake at a time), with the app's memory estimate of each card (and of the catalog's
  Qwen2-VL 7B card) against what its build took;
- each build's footprint against the expected weights + KV cache + overhead.

The summary starts with a table ready for docs/BENCHMARKS.md.

Each step that fails is recorded with its error and the check goes on. The summary (date, GPU,
vLLM version, command, every measurement and the checks' verdicts) is printed as markdown and
written as JSON to `--out` (as markdown where the name ends in `.md`). Exit status: 0 when every
check passed, 1 when one failed, 2 where there is no GPU or no CUDA build of vLLM.

    .venv-gpu/bin/python bench/gpu_check --out docs/gpu-check.json
    .venv/bin/python bench/gpu_check --dry-run    # any machine: write and check the folders
    python3 bench/gpu_check --readings            # torch's CUDA build, no vLLM: the app's readings

`--dry-run` needs no GPU and no vLLM engine: it writes the two folders and checks with
transformers that each config and processor loads, that the model the config describes has the
published parameter count, and (where vLLM is installed) that vLLM's model config accepts it.

`--readings` needs a CUDA build of torch and NVML, not vLLM: it checks the app's own GPU
readings (GPUs found, CUDA_VISIBLE_DEVICES, totals, use, per-process memory, the metrics gauge)
against processes that hold a known amount on the GPU (`readings.py`).
"""

# The docstring above is the command's --help text; the package's layout is in __init__.py.

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from . import common, engines
from .common import choose_pair, describe_model, fitted_utilization, log
from .dry_run import dry_run
from .engine_check import PHASES, run_check
from .folders import cached_weights, write_model_folders
from .machine import Gpu, describe_machine, why_no_cuda, why_not_runnable
from .phase import Model, Plan
from .readings import readings_markdown, run_readings
from .report import write_report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="write the summary here (JSON; markdown for *.md)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--dry-run", action="store_true", help="only write the model folders and check them")
    parser.add_argument("--models-dir", type=Path, help="where the model folders go (default: a temp dir)")
    parser.add_argument("--swaps", type=int, default=20, help="swaps in each swap phase (default 20)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens in each answer (default 16)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}")
    parser.add_argument("--util-small", type=float, help="gpu_memory_utilization of the 2B-class engine")
    parser.add_argument("--util-large", type=float, help="gpu_memory_utilization of the 7B-class engine")
    parser.add_argument("--step-timeout", type=float, default=900.0, help="seconds any one step may take")
    parser.add_argument("--verbose", action="store_true", help="vLLM's INFO logs (default: warnings only)")
    only.add_argument(
        "--readings",
        action="store_true",
        help="only check the app's GPU readings against known allocations (torch's CUDA build, no vLLM)",
    )
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if unknown := sorted(set(phases) - set(PHASES)):
        parser.error(f"unknown phases {unknown}; choose from {', '.join(PHASES)}")

    if args.readings:
        check_readings(args.out)

    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    models_dir = args.models_dir or scratch / "models"
    if args.dry_run:
        report = dry_run(models_dir)
        write_report(report, args.out)
        sys.exit(0 if report["ok"] else 1)

    reason = why_not_runnable()
    if reason is not None:
        print(
            f"gpu_check needs an NVIDIA GPU and vLLM's CUDA build ({reason}); "
            "--dry-run only writes and checks the model folders.",
            file=sys.stderr,
        )
        sys.exit(2)

    # Offline; a compile cache of its own, so the first build is cold and the rebuilds warm (set
    # VLLM_CACHE_ROOT to keep one across runs); CUDA and NVML numbering the GPUs alike.
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(scratch / "vllm-cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(scratch / "inductor-cache"))
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if args.verbose else "WARNING")

    total = Gpu.get().total()
    capability = Gpu.get().capability()
    if capability is not None and capability < (8, 0):
        common.DTYPE = "float16"  # vLLM refuses bfloat16 below compute capability 8.0
    specs = choose_pair(total)
    folders = write_model_folders(models_dir, specs)
    models = {}
    for role, spec in specs.items():
        cached = cached_weights(spec)
        util = {"small": args.util_small, "large": args.util_large}[role] or fitted_utilization(spec, total)
        models[role] = Model(spec, cached or folders[role], util, "auto" if cached else "dummy")
    plan = Plan(models, swaps=args.swaps, tokens=args.tokens, timeout_s=args.step_timeout, total=total)
    utils = {role: model.util for role, model in models.items()}
    meta = describe_machine(gpu=True)
    log(f"{meta['gpu']}, {meta['vllm']}; shares of the GPU {utils}; phases {phases}")
    started = time.perf_counter()
    result = asyncio.run(run_check(plan, phases))
    meta["wall_s"] = round(time.perf_counter() - started, 1)
    report = {
        "mode": "engine check",
        "meta": meta,
        "models": {
            role: {
                **describe_model(m.spec, m.folder, m.util),
                "weights": "dummy" if m.load_format == "dummy" else "real",
            }
            for role, m in models.items()
        },
        **result,
    }
    write_report(report, args.out)
    code = 0 if report["ok"] else 1
    if engines.leaked.is_set():
        # A build that timed out still runs in its thread; do not wait for it.
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


def check_readings(out: Path | None) -> None:
    """`--readings`: the app's GPU readings (see `readings.py`); exits with the check's status."""
    reason = why_no_cuda()
    if reason is not None:
        print(f"gpu_check --readings needs an NVIDIA GPU and torch's CUDA build ({reason}).", file=sys.stderr)
        sys.exit(2)
    report = {"meta": describe_machine(gpu=True), **run_readings()}
    print(readings_markdown(report))
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if report["ok"] else 1)
