"""Scheduling benchmark: one multi-user trace replayed through the real `EngineManager` on the
SIMULATED GPU (bench/simulated_gpu.py), under the app's policy and two baselines, in one run.

- playground: residency by memory, evicted engines sleep (weights to host memory), a quantum;
- rebuild on change (text-generation-webui's way): one engine at a time, no sleep, the GPU goes
  to the next model as soon as the current one's answers end;
- LRU without sleep (Ollama's way): residency by memory, least recently used engines unloaded.

The trace: 16 users over an hour of virtual time, each with a favourite model among six (a
3B to a 24B model on one 80 GB GPU, more than fits at once), sending a message, reading the
answer, thinking (exponential, mean 90 s), and sometimes switching model. Reported: p50 and p95
wait to first token, builds, wakes, and GPU time spent loading.

    .venv/bin/python bench/bench_scheduler.py [--users 16] [--hours 1] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulated_gpu import (
    SimulatedFactory,
    SimulatedMachine,
    SimulatedModel,
    VirtualTimeLoop,
    simulated_cards,
)

from app.config import Settings
from app.engines.base import EngineError, ModelStatus, SamplingSettings
from app.engines.manager import EngineManager
from app.engines.memory import GIB

# Sizes of real catalog models at bf16 (AWQ where named), KV reserve for a few long sequences.
MODELS = [
    SimulatedModel("qwen2_5_vl_3b", 7.5, kv_gb=4),
    SimulatedModel("qwen2_vl_7b", 16.6, kv_gb=4),
    SimulatedModel("llava_next_7b", 15.1, kv_gb=4),
    SimulatedModel("idefics3_8b", 17.0, kv_gb=4),
    SimulatedModel("pixtral_12b", 25.0, kv_gb=6),
    SimulatedModel("mistral_small_24b", 48.0, kv_gb=6),
]
GPU_BUDGET = int(0.9 * 80e9)
HOST_BUDGET = 128 * GIB  # half of a 256 GB GPU box


@dataclass(frozen=True)
class Policy:
    name: str
    max_awake: int | None
    sleep: bool
    quantum_s: float


POLICIES = [
    Policy("playground (memory, sleep, quantum)", None, True, 30.0),
    Policy("rebuild on change (text-generation-webui)", 1, False, 0.0),
    Policy("LRU unload without sleep (Ollama)", None, False, 30.0),
]


@dataclass(frozen=True)
class Message:
    user: int
    model: int
    tokens: int
    think_s: float


def make_trace(users: int, hours: float, seed: int) -> list[list[Message]]:
    """Each user's messages in order; a user sends the next one after the answer and a pause."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible trace, not a secret
    weights = [6, 4, 3, 3, 2, 1]  # small models are asked more often
    trace = []
    for user in range(users):
        favourite = rng.choices(range(len(MODELS)), weights)[0]
        messages, elapsed = [], rng.uniform(0, 300)
        while elapsed < hours * 3600:
            model = favourite if rng.random() < 0.8 else rng.choices(range(len(MODELS)), weights)[0]
            think = rng.expovariate(1 / 90)
            messages.append(Message(user, model, rng.randint(100, 600), think))
            elapsed += think + 20
        trace.append(messages)
    return trace


@dataclass
class Result:
    policy: Policy
    waits: list[float]
    builds: int
    wakes: int
    loading_s: float
    errors: int
    violations: int

    def percentile(self, q: float) -> float:
        return statistics.quantiles(self.waits, n=100)[int(q) - 1] if len(self.waits) > 1 else self.waits[0]


def replay(trace: list[list[Message]], policy: Policy) -> Result:
    loop = VirtualTimeLoop()
    machine = SimulatedMachine((GPU_BUDGET,), HOST_BUDGET, clock=loop.time)
    factory = SimulatedFactory(machine, MODELS, sleep_mode=policy.sleep)
    settings = Settings(
        gpu_count=1,
        max_resident=policy.max_awake,
        quantum_s=policy.quantum_s,
        drain_timeout_s=60.0,
        idle_unload_s=1800.0,
    )
    manager = EngineManager(
        simulated_cards(MODELS), settings, factory, clock=loop.time, progress_interval_s=5.0
    )
    keys = [m.key for m in MODELS]
    waits: list[float] = []
    errors = 0
    chat = [{"role": "user", "content": [{"type": "text", "text": "Describe the image."}]}]

    async def user(messages: list[Message], start: float) -> None:
        nonlocal errors
        await asyncio.sleep(start)
        for message in messages:
            asked = loop.time()
            first: float | None = None
            try:
                sampling = SamplingSettings(max_tokens=message.tokens, ignore_eos=True)
                async with contextlib.aclosing(manager.stream(keys[message.model], chat, sampling)) as events:
                    async for event in events:
                        if first is None and not isinstance(event, ModelStatus):
                            first = loop.time()
            except EngineError:
                errors += 1
            if first is not None:
                waits.append(first - asked)
            await asyncio.sleep(message.think_s)

    async def main() -> None:
        rng = random.Random(1)  # noqa: S311 - a reproducible trace, not a secret
        await asyncio.gather(*(user(messages, rng.uniform(0, 300)) for messages in trace))
        await manager.close()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return Result(
        policy,
        waits,
        len(machine.builds),
        len(machine.wakes),
        machine.loading_s,
        errors,
        len(machine.violations),
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trace = make_trace(args.users, args.hours, args.seed)
    started = time.perf_counter()
    results = [replay(trace, policy) for policy in POLICIES]
    wall = time.perf_counter() - started
    command = "bench/bench_scheduler.py " + " ".join(sys.argv[1:])
    print(f"## Scheduling benchmark ({datetime.now(UTC):%Y-%m-%d}, {platform.node() or 'this machine'})")
    print(
        f"\n`.venv/bin/python {command.strip()}`: {args.users} users, {len(MODELS)} models, "
        f"{args.hours:g} h of virtual time, {sum(map(len, trace))} messages; simulated one 80 GB GPU "
        f"(budget 72 GB), host budget 128 GiB; replayed in {wall:.1f} s of wall time.\n"
    )
    print(
        "| policy | answers | p50 wait (s) | p95 wait (s) | builds | wakes | GPU time loading (s) | errors |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r.policy.name} | {len(r.waits)} | {r.percentile(50):.1f} | {r.percentile(95):.1f} | "
            f"{r.builds} | {r.wakes} | {r.loading_s:.0f} | {r.errors} |"
        )
    ours, baselines = results[0], results[1:]
    best = min(b.percentile(95) for b in baselines)
    ratio = ours.percentile(95) / best if best else float("inf")
    met = ratio <= 0.5
    print(
        f"\np95 wait: {ours.percentile(95):.1f} s against the better baseline's {best:.1f} s: "
        f"{ratio:.2f} of it (target at most 0.5: {'met' if met else 'NOT met'})."
    )
    if any(r.violations for r in results):
        print("memory budget exceeded in the simulation:", {r.policy.name: r.violations for r in results})
        return 1
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
