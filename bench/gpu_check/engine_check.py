"""The engine check: the chosen phases in order, each one's failure kept to itself, with the
GPU memory at the start and the end and the checks of every phase gathered for the verdict.
"""

from __future__ import annotations

import traceback
from typing import Any

from .common import describe_error, log
from .lifecycle import lifecycle
from .machine import gpu_used, memory_snapshot, wait_for_memory
from .manager import manager_swap
from .phase import Plan
from .swaps import swaps_build, swaps_sleep
from .two_resident import two_resident

PHASES = ("lifecycle", "two_resident", "swaps_sleep", "swaps_build", "manager")


async def run_check(plan: Plan, phases: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    baseline = gpu_used()
    memory = {"before": memory_snapshot(torch_probe=True)}
    for name in phases:
        log(f"--- {name}")
        try:
            if name == "lifecycle":
                results["lifecycle_small"] = await lifecycle(plan, "small")
                if plan.models["large"].spec.repo != plan.models["small"].spec.repo:
                    results["lifecycle_large"] = await lifecycle(plan, "large")
                elif "small" in plan.measured:
                    # A second engine of the same model (a GPU too small for the 7B-class).
                    plan.measured["large"] = plan.measured["small"]
            elif name == "two_resident":
                results[name] = await two_resident(plan)
            elif name == "swaps_sleep":
                results[name] = await swaps_sleep(plan)
            elif name == "swaps_build":
                results[name] = await swaps_build(plan)
            elif name == "manager":
                results[name] = await manager_swap(plan)
        except Exception as error:
            # A phase's own steps catch their errors; this is a bug in the phase itself.
            results[name] = {
                "error": describe_error(error),
                "traceback": traceback.format_exc().splitlines()[-12:],
                "checks": [{"name": f"{name} ran", "ok": False, "detail": describe_error(error)}],
            }
    memory["after"] = {**memory_snapshot(torch_probe=True), **wait_for_memory(baseline)}
    checks = [c for r in results.values() for c in r.get("checks", [])]
    if memory["after"].get("memory_back") is not None:
        checks.append(
            {
                "name": "GPU memory back at the end, against the start",
                "ok": memory["after"]["memory_back"],
                "detail": f"{memory['after'].get('above_before_gib')} GiB above the start",
            }
        )
    return {"phases": results, "memory": memory, "checks": checks, "ok": all(c["ok"] for c in checks)}
