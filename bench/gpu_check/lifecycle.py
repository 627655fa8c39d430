"""The `lifecycle` phase: one model's engine through its whole life.

Build, answer, sleep (level 1), wake, answer, shut down, rebuild, answer, shut down: each step's
time and the GPU memory after it, the memory sleep frees against the weights' size, and whether
the memory is back after each shutdown.
"""

from __future__ import annotations

from typing import Any

from .common import SPECS, gib
from .engines import answer, build, sleep, stop, wake
from .machine import gpu_used, memory_snapshot
from .phase import Engines, Phase, Plan


async def lifecycle(plan: Plan, role: str) -> dict[str, Any]:
    """Build, answer, sleep, wake, answer, shut down, rebuild, answer, shut down."""
    spec = SPECS[role]
    phase = Phase(f"lifecycle {spec.title}", plan.timeout_s)
    engines = Engines()
    target = gpu_used()
    phase.notes["gpu_before"] = memory_snapshot()
    folder, util = plan.folders[role], plan.utils[role]
    try:
        for attempt in ("build", "rebuild"):

            async def start() -> dict[str, Any]:
                engines.live[role] = await build(folder, util)
                return {"gpu_used_gib": gib(gpu_used())}

            await phase.run(attempt, start)
            engine = engines.live.get(role)
            missing = None if engine is not None else f"no engine ({attempt} failed)"
            before = await phase.run(
                f"answer after {attempt}", lambda engine=engine: answer(engine, plan.tokens), missing
            )
            if attempt == "build":
                slept = await phase.run("sleep (level 1)", lambda engine=engine: sleep(engine), missing)
                if slept is not None:
                    freed = slept.get("_freed")
                    phase.check("asleep after sleep", slept["is_sleeping"])
                    if freed is not None:
                        phase.check(
                            "sleep frees at least the weights' size",
                            freed >= 0.9 * spec.weights_bytes,
                            f"{gib(freed)} GiB freed, weights {gib(spec.weights_bytes)} GiB",
                        )
                woken = await phase.run("wake", lambda engine=engine: wake(engine), missing)
                if woken is not None:
                    phase.check("awake after wake", not woken["is_sleeping"])
                after = await phase.run(
                    "answer after wake", lambda engine=engine: answer(engine, plan.tokens), missing
                )
                if before is not None and after is not None:
                    # Information, not a verdict: random weights give near-equal logits.
                    phase.notes["same_answer_after_wake"] = before["_token_ids"] == after["_token_ids"]
            stopped = await phase.run(
                f"shutdown after {attempt}", lambda: stop(engines.live.pop(role), target), missing
            )
            if stopped is not None and stopped.get("memory_back") is not None:
                phase.check(
                    f"GPU memory back after the shutdown after {attempt}",
                    stopped["memory_back"],
                    f"{stopped.get('above_before_gib')} GiB above before",
                )
    finally:
        await engines.close(phase, target)
    return phase.record()
