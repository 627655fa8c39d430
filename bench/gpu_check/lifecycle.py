"""The `lifecycle` phase: one model's engine through its whole life.

Build, answer, sleep (level 1), wake, answer, shut down, rebuild, answer, shut down: each step's
time and the GPU memory after it, the memory sleep frees against the weights' size, and whether
the memory is back after each shutdown.
"""

from __future__ import annotations

from typing import Any

from .common import ENGINE_MARGIN_BYTES, gib
from .engines import answer, build, sleep, stop, wake
from .machine import gpu_used, memory_snapshot
from .phase import Engines, Phase, Plan


async def lifecycle(plan: Plan, role: str) -> dict[str, Any]:
    """Build, answer, sleep, wake, answer, shut down, rebuild, answer, shut down."""
    model = plan.models[role]
    spec = model.spec
    phase = Phase(f"lifecycle {spec.title}", plan.timeout_s)
    engines = Engines()
    target = gpu_used()
    phase.notes["gpu_before"] = memory_snapshot()
    phase.notes["weights"] = "real, from the Hugging Face cache" if model.load_format != "dummy" else "dummy"
    try:
        for attempt in ("build", "rebuild"):

            async def start() -> dict[str, Any]:
                engines.live[role] = await build(model)
                used = gpu_used()
                taken = None if used is None or target is None else used - target
                return {"gpu_used_gib": gib(used), "footprint_gib": gib(taken), "_footprint": taken}

            built = await phase.run(attempt, start)
            if attempt == "build" and built is not None and built.get("_footprint"):
                # What the engine really takes: the two-engine phases are sized from it.
                taken = plan.measured[role] = built["_footprint"]
                phase.notes["footprint_against_expected"] = {
                    "measured_gib": gib(taken),
                    "expected_gib": gib(spec.need_bytes),
                    "weights_gib": gib(spec.weights_bytes),
                    "kv_cache_gib": gib(spec.kv_reserve_bytes),
                    "overhead_measured_gib": gib(taken - spec.weights_bytes - spec.kv_reserve_bytes),
                    "overhead_expected_gib": gib(ENGINE_MARGIN_BYTES),
                }
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
