"""The `two_resident` phase: both engines on the GPU at once, each with its fitted share
(`gpu_memory_utilization`), answering at the same time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .common import gib
from .engines import answer, build, stop
from .machine import gpu_used, memory_snapshot
from .phase import Engines, Phase, Plan


async def two_resident(plan: Plan) -> dict[str, Any]:
    """Both engines built (each with its fitted share of the GPU), each answering at once."""
    phase = Phase("two engines resident", plan.timeout_s)
    fits, why = plan.fits_together()
    if not fits:
        phase.notes["skipped"] = why
        return phase.record()
    engines = Engines()
    target = gpu_used()
    try:
        for role in ("small", "large"):

            async def start(role: str = role) -> dict[str, Any]:
                engines.live[role] = await build(plan.models[role], plan.util(role))
                return {"gpu_used_gib": gib(gpu_used())}

            await phase.run(f"build {plan.title(role)}", start)
        both = len(engines.live) == 2
        phase.notes["gpu_with_both"] = memory_snapshot(torch_probe=True) if both else None

        async def answer_both() -> dict[str, Any]:
            small, large = await asyncio.gather(
                answer(engines.live["small"], plan.tokens), answer(engines.live["large"], plan.tokens)
            )
            private = ("_token_ids",)
            return {
                role: {k: v for k, v in result.items() if k not in private}
                for role, result in (("small", small), ("large", large))
            }

        answered = await phase.run(
            "both answer at once", answer_both, None if both else "an engine is missing"
        )
        phase.check("each resident engine answered", answered is not None)
        for role in ("small", "large"):
            if role in engines.live:
                stopped = await phase.run(
                    f"shutdown {plan.title(role)}",
                    lambda role=role: stop(engines.live.pop(role), target if role == "large" else None),
                )
                if stopped is not None and stopped.get("memory_back") is not None:
                    phase.check("GPU memory back after both shut down", stopped["memory_back"])
    finally:
        await engines.close(phase, target)
    return phase.record()
