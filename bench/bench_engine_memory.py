"""Memory of a CPU engine's processes under chats of many prompt lengths, with oneDNN's cache of
compiled kernels as the app bounds it (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, `app.demo.models`)
against oneDNN's own default (1,024), side by side in one run on the Qwen2-VL demo twin (random
weights, CPU). Each variant runs the same seeded stream of 16 chats at once for the same time in
a fresh process: histories of 0 to 3 turns, greedy and sampled answers of 32 to 512 tokens, some
stopped early.

    .venv/bin/python bench/bench_engine_memory.py [--seconds 240] [--capacities default,64]

oneDNN compiles a kernel for each new shape of a matrix product (each prompt length's prefill)
and keeps it: found by this script, the engine process grew by about 0.9 MiB per chat of a new
length with the default, the vLLM engines' growth in the 30-minute visitors run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEY = "demo_qwen2_vl"
CONCURRENT = 16
PICTURES = ("one_shape.png", "three_shapes.png", "green_square.png")


async def drive(seconds: float) -> dict[str, object]:
    """One variant, in this process: the chats for `seconds`, the engine tree's memory every 20 s."""
    from app.demo.models import default_demo_dir, demo_cards, use_local_vllm_environment

    use_local_vllm_environment(Path(tempfile.mkdtemp(prefix="bench-engine-memory-")))
    import psutil
    from PIL import Image

    from app.catalog.cards import load_cards
    from app.config import Settings
    from app.engines.base import SamplingSettings, StreamEnd, TextDelta
    from app.engines.manager import EngineManager
    from app.engines.vllm_engine import VllmEngineFactory

    pictures = [Image.open(ROOT / "static" / "examples" / name).convert("RGB") for name in PICTURES]
    settings = Settings(gpu_count=0)
    card = demo_cards(load_cards(), default_demo_dir())[KEY]
    manager = EngineManager({KEY: card}, settings, VllmEngineFactory(settings))
    rng = random.Random(1)  # noqa: S311 (the same chats in every variant)
    chats, tokens = [0], [0]

    async def chat(number: int) -> None:
        history: list[dict[str, object]] = []
        for turn in range(rng.randint(0, 3)):
            history.append({"role": "user", "content": f"earlier {number} {turn} " * rng.randint(1, 20)})
            history.append({"role": "assistant", "content": "x" * rng.randint(1, 200)})
        question = [
            {"type": "image", "image": pictures[number % 3]},
            {"type": "text", "text": f"chat {number}"},
        ]
        sampling = SamplingSettings(
            temperature=rng.choice([0.0, 0.7, 1.0]), max_tokens=rng.choice([32, 128, 512])
        )
        stop_after = rng.choice([None, None, 5, 20])
        said = 0
        async for event in manager.stream(KEY, [*history, {"role": "user", "content": question}], sampling):
            if isinstance(event, TextDelta):
                said += 1
                if stop_after and said >= stop_after:
                    break
            elif isinstance(event, StreamEnd):
                break
        chats[0] += 1
        tokens[0] += said

    def engines_mib() -> float:
        children = psutil.Process().children(recursive=True)
        return sum(child.memory_info().rss for child in children) / 2**20

    readings: list[tuple[float, int, float]] = []
    pending: set[asyncio.Future[None]] = set()
    number, started, last = 0, time.monotonic(), 0.0
    while time.monotonic() - started < seconds:
        while len(pending) < CONCURRENT:
            pending.add(asyncio.ensure_future(chat(number)))
            number += 1
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if time.monotonic() - last >= 20:
            last = time.monotonic()
            readings.append((round(last - started), chats[0], round(engines_mib())))
    await asyncio.gather(*pending)
    elapsed = time.monotonic() - started
    await manager.close()
    return {"chats": chats[0], "tokens": tokens[0], "seconds": elapsed, "readings": readings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--capacities", default="default,64", help="oneDNN cache capacities to compare")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in a child process
    args = parser.parse_args()
    if args.variant is not None:
        print(json.dumps(asyncio.run(drive(args.seconds))))
        return
    rows = []
    for capacity in args.capacities.split(","):
        environ = os.environ.copy()
        environ.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
        # "default": what oneDNN does unbounded by the app (its own 1,024).
        environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "1024" if capacity == "default" else capacity
        done = subprocess.run(  # noqa: S603 (this script, its own arguments)
            [sys.executable, __file__, "--variant", capacity, "--seconds", str(args.seconds)],
            env=environ,
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        readings = result["readings"]
        first, end = readings[0], readings[-1]
        minute = next((r for r in readings if r[0] >= 60), first)
        rows.append(
            f"| {capacity} | {result['chats']} | {result['tokens'] / result['seconds']:.1f} | "
            f"{first[2]} | {minute[2]} | {end[2]} | {end[2] - first[2]:+} |"
        )
        print(f"{capacity}: {readings}", file=sys.stderr, flush=True)
    print(f"{platform.machine()}, {os.cpu_count()} cores, {args.seconds:.0f} s a variant\n")
    header = ["oneDNN cache capacity", "chats", "tokens/s", "engine MiB at the first answer", "after 1 min"]
    print("| " + " | ".join([*header, "at the end", "growth"]) + " |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
