"""Two CPU engines answering at once, with each engine's OpenMP threads as the app sets them
(`app.demo.models.engine_threads`: half the cores) against torch's own default (every core),
side by side in one run. Each variant starts two processes at the same moment; each builds the
seeing demo model's engine (committed weights) through the app's engine manager and asks it the
same held-out questions (`app.demo.seeing_llava.accuracy`, 24 of each of its 12 kinds). The time
counted is the questions' only, after a warm-up; the answers' accuracy is printed beside it.

    .venv/bin/python bench/bench_engine_threads.py [--per-kind 24] [--threads default,app]

This is what compare, the arena and two visitors on two models do on a CPU box.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def answer(per_kind: int) -> dict[str, float]:
    """One engine's side, in this process: its time for the questions and its accuracy."""
    import asyncio
    import tempfile

    from app.demo.models import use_local_vllm_environment

    use_local_vllm_environment(Path(tempfile.mkdtemp(prefix="bench-threads-")))
    from app.catalog.cards import load_cards
    from app.config import Settings
    from app.demo.models import SEEING_FOLDER
    from app.demo.seeing_llava import accuracy
    from app.demo.seeing_model import BASE_CARD, SEEING_KEY, seeing_card
    from app.engines.manager import EngineManager
    from app.engines.vllm_engine import VllmEngineFactory

    card = seeing_card(load_cards()[BASE_CARD], SEEING_FOLDER)
    settings = Settings(gpu_count=0, cpu_kv_cache_bytes=64 * 2**20, idle_unload_s=0, max_resident=1)
    manager = EngineManager({SEEING_KEY: card}, settings, VllmEngineFactory(settings))

    async def run() -> dict[str, float]:
        await accuracy(manager, SEEING_KEY, 1, seed=1)  # the build and a warm-up
        started = time.monotonic()
        scores = await accuracy(manager, SEEING_KEY, per_kind, seed=7)
        seconds = time.monotonic() - started
        await manager.close()
        return {"seconds": seconds, "right": sum(scores.values()) / len(scores)}

    return asyncio.run(run())


def variant(threads: str, per_kind: int) -> list[dict[str, float]]:
    """Two engines at once, each in a process of its own with `threads` OpenMP threads."""
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    command = [sys.executable, __file__, "--side", "--per-kind", str(per_kind)]
    sides = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)  # noqa: S603 (this script)
        for _ in range(2)
    ]
    return [json.loads(side.communicate()[0].strip().splitlines()[-1]) for side in sides]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-kind", type=int, default=24)
    parser.add_argument("--threads", default="default,app", help="comma-separated: default, app, or a number")
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(answer(args.per_kind)), flush=True)
        return
    from app.demo.models import engine_threads

    cores = len(os.sched_getaffinity(0))
    print(f"{time.strftime('%Y-%m-%d')} · {platform.machine()}, {cores} cores · {' '.join(sys.argv)}")
    results = {}
    for threads in args.threads.split(","):
        # torch's default is a thread per core; the app's setting would replace an unset one.
        chosen = {"app": str(engine_threads()), "default": str(cores)}.get(threads, threads)
        sides = variant(chosen, args.per_kind)
        results[threads] = max(side["seconds"] for side in sides)
        shown = ", ".join(f"{side['seconds']:.1f} s ({side['right']:.0%} right)" for side in sides)
        label = f"{threads}: {chosen} per engine" if threads != "default" else f"torch's default: {chosen}"
        print(f"| {label} | {shown} |", flush=True)
    if {"default", "app"} <= set(results):
        print(f"the app's threads against the default: {results['default'] / results['app']:.2f}x faster")


if __name__ == "__main__":
    main()
