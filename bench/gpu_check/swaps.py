"""The `swaps_sleep` and `swaps_build` phases: GPU memory over repeated swaps between the two
models, the two ways the app can swap.

Through sleep mode (both engines built, one awake at a time) it checks that memory does not grow
over the swaps; by rebuilding (one engine at a time) it times cold and warm builds. Both check
that the memory is back at the end.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable
from typing import Any

from .common import MEMORY_RETURN_TIMEOUT_S, MEMORY_SLACK_BYTES, describe_error, gib, log
from .engines import answer, build, sleep, stop
from .machine import gpu_used, memory_snapshot, wait_for_memory
from .phase import Engines, Phase, Plan


def drift(series: list[int | None]) -> dict[str, Any]:
    """How the GPU memory in use moved over the swaps, comparing like with like: each parity's
    last reading against its first (even swaps leave one model awake, odd ones the other)."""
    readings = [v for v in series if v is not None]
    if len(readings) != len(series) or len(series) < 4:
        return {"readings_gib": [gib(v) for v in series]}
    growth = max(series[-2] - series[0], series[-1] - series[1])
    return {
        "first_gib": [gib(series[0]), gib(series[1])],
        "last_gib": [gib(series[-2]), gib(series[-1])],
        "growth_gib": gib(growth),
        "_growth": growth,
    }


async def swaps_sleep(plan: Plan) -> dict[str, Any]:
    """Both engines built; `swaps` times: the awake one sleeps, the other wakes and answers."""
    phase = Phase(f"{plan.swaps} sleep/wake swaps", plan.timeout_s)
    fits, why = plan.fits_together()
    if not fits:
        phase.notes["skipped"] = why
        return phase.record()
    engines = Engines()
    target = gpu_used()
    phase.notes["gpu_before"] = memory_snapshot(torch_probe=True)
    try:
        for role in ("small", "large"):

            async def start(role: str = role) -> None:
                engines.live[role] = await build(plan.models[role], plan.util(role))

            await phase.run(f"build {plan.title(role)}", start)
        both = len(engines.live) == 2
        await phase.run(
            f"sleep {plan.title('large')} (start)",
            lambda: sleep(engines.live["large"]),
            None if both else "an engine is missing",
        )
        awake = "small"
        times: dict[str, list[float]] = {"sleep": [], "wake": [], "answer": []}

        async def timed(kind: str, step: Awaitable[Any]) -> None:
            start = time.perf_counter()
            await asyncio.wait_for(step, plan.timeout_s)
            times[kind].append(time.perf_counter() - start)

        series: list[int | None] = []
        failures = []
        for number in range(plan.swaps if both else 0):
            other = "large" if awake == "small" else "small"
            try:
                await timed("sleep", engines.live[awake].sleep(level=1))
                await timed("wake", engines.live[other].wake_up())
                await timed("answer", answer(engines.live[other], plan.tokens))
                awake = other
            except Exception as error:
                failures.append(f"swap {number + 1}: {describe_error(error)}")
                log(f"{phase.name}: swap {number + 1} FAILED: {describe_error(error)}")
                break
            series.append(gpu_used())
            log(f"{phase.name}: swap {number + 1}: {plan.title(awake)} awake, {gib(series[-1])} GiB used")
        phase.notes["swaps_done"] = len(series)
        phase.notes["median_s"] = {k: round(statistics.median(v), 3) for k, v in times.items() if v}
        phase.notes["max_s"] = {k: round(max(v), 3) for k, v in times.items() if v}
        moved = drift(series)
        phase.notes["gpu_used_over_swaps"] = {k: v for k, v in moved.items() if not k.startswith("_")}
        if both:
            phase.check(f"{plan.swaps} swaps done", not failures, "; ".join(failures))
        if "_growth" in moved:
            phase.check(
                "GPU memory does not grow over the swaps",
                moved["_growth"] <= MEMORY_SLACK_BYTES,
                f"{moved['growth_gib']} GiB",
            )
        for role in ("small", "large"):
            if role in engines.live:
                await phase.run(
                    f"shutdown {plan.title(role)}", lambda role=role: stop(engines.live.pop(role), None)
                )
        await check_memory_back(phase, target, "GPU memory back after the swaps and shutdowns")
    finally:
        await engines.close(phase, target)
    return phase.record()


async def check_memory_back(phase: Phase, target: int | None, name: str) -> None:
    """Waits for the GPU's memory to come back to `target` and checks it, where NVML reads it."""
    back = await asyncio.to_thread(wait_for_memory, target)
    phase.notes["gpu_after"] = {**memory_snapshot(torch_probe=True), **back}
    if back.get("memory_back") is not None:
        phase.check(name, back["memory_back"], f"{back.get('above_before_gib')} GiB above before")


async def swaps_build(plan: Plan) -> dict[str, Any]:
    """One engine at a time; `swaps` times: shut the current one down, build the other, answer."""
    phase = Phase(f"{plan.swaps} build/shutdown swaps", plan.timeout_s)
    engines = Engines()
    target = gpu_used()
    phase.notes["gpu_before"] = memory_snapshot(torch_probe=True)
    times: dict[str, list[float]] = {"build": [], "answer": [], "shutdown": []}
    after_shutdowns: list[int | None] = []
    failures = []
    try:
        for number in range(plan.swaps):
            role = ("small", "large")[number % 2]
            try:
                start = time.perf_counter()
                engines.live[role] = await asyncio.wait_for(build(plan.models[role]), plan.timeout_s)
                times["build"].append(time.perf_counter() - start)
                start = time.perf_counter()
                await asyncio.wait_for(answer(engines.live[role], plan.tokens), plan.timeout_s)
                times["answer"].append(time.perf_counter() - start)
                start = time.perf_counter()
                stopped = await asyncio.wait_for(stop(engines.live.pop(role), target), plan.timeout_s)
                times["shutdown"].append(time.perf_counter() - start)
            except Exception as error:
                failures.append(f"swap {number + 1} ({plan.title(role)}): {describe_error(error)}")
                log(f"{phase.name}: swap {number + 1} FAILED: {describe_error(error)}")
                await engines.close(phase, None)
                continue
            after_shutdowns.append(gpu_used())
            log(
                f"{phase.name}: swap {number + 1}: {plan.title(role)} built in {times['build'][-1]:.1f} s, "
                f"{gib(after_shutdowns[-1])} GiB used after its shutdown"
            )
            if stopped.get("memory_back") is False:
                failures.append(f"swap {number + 1}: memory not back within {MEMORY_RETURN_TIMEOUT_S:.0f} s")
        phase.notes["swaps_done"] = len(after_shutdowns)
        phase.notes["median_s"] = {k: round(statistics.median(v), 2) for k, v in times.items() if v}
        phase.notes["max_s"] = {k: round(max(v), 2) for k, v in times.items() if v}
        phase.notes["first_build_s"] = round(times["build"][0], 2) if times["build"] else None
        readings = [v for v in after_shutdowns if v is not None]
        if target is not None and readings:
            phase.notes["after_shutdowns_max_above_before_gib"] = gib(max(readings) - target)
        phase.check(f"{plan.swaps} swaps done", not failures, "; ".join(failures))
        await check_memory_back(phase, target, "GPU memory back after the swaps")
    finally:
        await engines.close(phase, target)
    return phase.record()
