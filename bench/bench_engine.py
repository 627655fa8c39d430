"""Engine benchmark on the demo models (random-weight twins of Qwen2-VL and LLaVA-1.5; CPU by
default), all in one run:

- wall time of 1, 4, 8 and 16 concurrent streams through the manager, and the ratio to one;
- time to first token and per-token time through the manager against calling the same
  `AsyncLLM` directly, alternating the two so both see the same machine state;
- build, swap and shutdown times, and the process tree's memory after repeated swaps.

    .venv/bin/python bench/bench_engine.py [--swaps 10] [--tokens 64]

Targets: 8 concurrent streams take at most 1.5x as long as one; the manager adds at most 5%
to the time to first token over direct `AsyncLLM`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.demo.models import use_local_vllm_environment

SCRATCH = Path(tempfile.mkdtemp(prefix="bench-engine-"))
use_local_vllm_environment(SCRATCH)
os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from PIL import Image  # noqa: E402

from app.catalog.cards import load_cards  # noqa: E402
from app.config import Settings  # noqa: E402
from app.demo.models import demo_cards  # noqa: E402
from app.engines.base import SamplingSettings, StreamEnd, TextDelta  # noqa: E402
from app.engines.manager import EngineManager  # noqa: E402
from app.engines.vllm_engine import VllmEngineFactory, engine_prompt, process_tree_memory  # noqa: E402

# Short keys for the two demo models.
BENCH_KEYS = {"tiny-a": "demo_qwen2_vl", "tiny-b": "demo_llava"}

ROUNDS = 40


class RecordingFactory:
    def __init__(self, settings: Settings) -> None:
        self.real = VllmEngineFactory(settings)
        self.engines: dict[str, Any] = {}

    def capacity(self) -> Any:
        return self.real.capacity()

    def memory_need(self, card: Any) -> Any:
        return self.real.memory_need(card)

    async def build(self, card: Any, report: Any, devices: tuple[int, ...]) -> Any:
        self.engines[card.key] = await self.real.build(card, report, devices)
        return self.engines[card.key]


def question(seed: int) -> list[dict[str, Any]]:
    pixels = np.random.default_rng(seed).integers(0, 255, (224, 224, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    return [
        {
            "role": "user",
            "content": [{"type": "image", "image": image}, {"type": "text", "text": "Describe."}],
        }
    ]


async def through_manager(
    manager: EngineManager, key: str, messages: list, sampling: SamplingSettings
) -> tuple:
    start = time.perf_counter()
    first = None
    async for event in manager.stream(key, messages, sampling):
        if isinstance(event, TextDelta) and first is None:
            first = time.perf_counter()
        elif isinstance(event, StreamEnd):
            first = first or time.perf_counter()
            return first - start, time.perf_counter() - start, event.completion_tokens
    raise RuntimeError("no end")


async def direct(
    engine: Any, card: Any, messages: list, sampling: SamplingSettings, request_id: str
) -> tuple:
    """The same request on the same `AsyncLLM`, without the manager (prompt rendered here too)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from app.catalog.adapters import render

    start = time.perf_counter()
    rendered = render(card, messages, engine._owner)
    params = SamplingParams(
        temperature=sampling.temperature,
        max_tokens=sampling.max_tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
    )
    first, tokens = None, 0
    async for output in engine._engine.generate(engine_prompt(card, rendered), params, request_id):
        tokens += len(output.outputs[0].token_ids)
        if first is None and output.outputs[0].text:
            first = time.perf_counter()
    return first - start, time.perf_counter() - start, tokens


async def run(swaps: int, tokens: int) -> None:
    # The demo models (random-weight twins of Qwen2-VL and LLaVA-1.5) under short keys.
    demo = demo_cards(load_cards(), SCRATCH / "twins")
    cards = {key: demo[demo_key].model_copy(update={"key": key}) for key, demo_key in BENCH_KEYS.items()}
    # One engine at a time: the swap figures below need a swap per model change.
    settings = Settings(gpu_count=0, cpu_kv_cache_bytes=128 * 2**20, idle_unload_s=0, max_resident=1)
    factory = RecordingFactory(settings)
    manager = EngineManager(cards, settings, factory)
    sampling = SamplingSettings(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    rows: list[tuple[str, str]] = []

    start = time.perf_counter()
    await through_manager(manager, "tiny-a", question(0), replace(sampling, max_tokens=1))
    rows.append(
        ("build tiny-a (first request to first token, cold process)", f"{time.perf_counter() - start:.2f} s")
    )

    # Concurrency: each level twice, the second timed (warm).
    single = None
    for n in (1, 4, 8, 16):
        for _ in range(2):
            start = time.perf_counter()
            await asyncio.gather(
                *(through_manager(manager, "tiny-a", question(i), sampling) for i in range(n))
            )
            wall = time.perf_counter() - start
        single = single or wall
        rows.append(
            (f"{n:2d} concurrent streams x {tokens} tokens", f"{wall:.3f} s ({wall / single:.2f}x one)")
        )

    # Manager against direct AsyncLLM, alternating, same engine, same prompt.
    engine, card = factory.engines["tiny-a"], cards["tiny-a"]
    via_manager: list[tuple] = []
    via_direct: list[tuple] = []
    for i in range(ROUNDS):
        # Fresh pictures for each request (an image seen before would hit vLLM's caches), and
        # the order alternated so neither side always runs on a just-warmed engine.
        manager_turn = through_manager(manager, "tiny-a", question(1000 + 2 * i), sampling)
        direct_turn = direct(engine, card, question(1001 + 2 * i), sampling, f"direct-{i}")
        if i % 2:
            via_direct.append(await direct_turn)
            via_manager.append(await manager_turn)
        else:
            via_manager.append(await manager_turn)
            via_direct.append(await direct_turn)
    for name, samples in (("manager", via_manager), ("direct AsyncLLM", via_direct)):
        ttft = statistics.median(s[0] for s in samples)
        per_token = statistics.median((s[1] - s[0]) / max(1, s[2] - 1) for s in samples)
        rows.append(
            (
                f"TTFT / per-token, {name} (median of {ROUNDS})",
                f"{ttft * 1000:.1f} ms / {per_token * 1000:.2f} ms",
            )
        )
    overhead = statistics.median(m[0] for m in via_manager) / statistics.median(d[0] for d in via_direct) - 1
    rows.append(("manager's added time to first token", f"{overhead:+.1%}"))

    # Swaps with one engine resident.
    baseline = process_tree_memory()
    swap_times = []
    for i in range(swaps):
        key = ("tiny-b", "tiny-a")[i % 2]
        start = time.perf_counter()
        await through_manager(manager, key, question(i), replace(sampling, max_tokens=1))
        swap_times.append(time.perf_counter() - start)
        if i == 1:
            baseline = process_tree_memory()
    after = process_tree_memory()
    rows.append(
        (
            f"swap (unload one, build the other, first token), median of {swaps}",
            f"{statistics.median(swap_times):.2f} s",
        )
    )
    rows.append(
        (
            f"process tree after swaps 2..{swaps}",
            f"{baseline[0] >> 20} -> {after[0] >> 20} MiB, children {baseline[1]} -> {after[1]}",
        )
    )
    engine = factory.engines["tiny-b" if swaps % 2 else "tiny-a"]
    start = time.perf_counter()
    await manager.close()
    rows.append(("shutdown (engine stopped, its process gone)", f"{time.perf_counter() - start:.2f} s"))

    print(f"# {time.strftime('%Y-%m-%d')} {platform.machine()}, {os.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}")  # fmt: skip
    print("| measurement | result |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--swaps", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(run(args.swaps, args.tokens))


if __name__ == "__main__":
    main()
