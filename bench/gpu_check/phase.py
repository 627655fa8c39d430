"""What the phases share: the plan they are given (`Plan`), how each records its steps and
verdicts (`Phase`: every step timed, every failure recorded and the check going on) and the
engines it built (`Engines`: shut down at its end, whatever happened).
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import BUDGET_FRACTION, MEASURED_SLACK_BYTES, ModelSpec, describe_error, gib, log, share
from .engines import stop
from .machine import wait_for_memory


class Phase:
    """One part of the check: its steps in order, each timed, each failing on its own."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.steps: dict[str, dict[str, Any]] = {}
        self.notes: dict[str, Any] = {}
        self.checks: list[dict[str, Any]] = []

    async def run(
        self, name: str, action: Callable[[], Awaitable[Any]], skip: str | None = None
    ) -> dict[str, Any] | None:
        """Runs `action` under the step timeout; records its time and the dict it returns (keys
        with a leading underscore are returned but not recorded), or its error. None when it failed
        or was skipped."""
        if skip:
            self.steps[name] = {"skipped": skip}
            log(f"{self.name}: {name}: skipped ({skip})")
            return None
        start = time.perf_counter()
        try:
            result = await asyncio.wait_for(action(), self.timeout_s)
        except Exception as error:
            seconds = round(time.perf_counter() - start, 2)
            self.steps[name] = {"error": describe_error(error), "seconds": seconds}
            if not isinstance(error, TimeoutError):
                self.steps[name]["traceback"] = traceback.format_exc(limit=-4).splitlines()[-12:]
            log(f"{self.name}: {name}: FAILED after {seconds} s: {describe_error(error)}")
            return None
        seconds = round(time.perf_counter() - start, 3)
        result = dict(result) if isinstance(result, dict) else {"value": result} if result is not None else {}
        self.steps[name] = {"seconds": seconds, **{k: v for k, v in result.items() if not k.startswith("_")}}
        log(f"{self.name}: {name}: {seconds:.2f} s")
        return result

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"name": f"{self.name}: {name}", "ok": bool(ok), "detail": detail})

    def record(self) -> dict[str, Any]:
        for step, entry in self.steps.items():
            if "error" in entry:
                self.check(f"{step} ran", False, entry["error"])
        return {"steps": self.steps, **self.notes, "checks": self.checks}


class Engines:
    """The engines a phase built, so that whatever happens they are shut down at its end."""

    def __init__(self) -> None:
        self.live: dict[str, Any] = {}

    async def close(self, phase: Phase, target: int | None) -> None:
        for role, engine in list(self.live.items()):
            await phase.run(f"shutdown {role} (clean-up)", lambda engine=engine: stop(engine, None))
            del self.live[role]
        if target is not None:
            phase.notes["after_clean_up"] = await asyncio.to_thread(wait_for_memory, target)


@dataclass(frozen=True)
class Model:
    """One role's engine: the model's sizes, its folder, its share of the GPU, and whether its
    weights are real (found in the Hugging Face cache: rebuilds then read them from disk) or
    made up by vLLM (`dummy`)."""

    spec: ModelSpec
    folder: Path
    util: float
    load_format: str = "dummy"


@dataclass
class Plan:
    """What every phase is given: each role's model, the GPU's memory, the sizes of the run (from
    the command line), and what each role's build was measured to take (the lifecycle phase)."""

    models: dict[str, Model]
    swaps: int
    tokens: int
    timeout_s: float
    total: int | None = None
    measured: dict[str, int] = field(default_factory=dict)

    def title(self, role: str) -> str:
        return self.models[role].spec.title

    def need(self, role: str) -> int:
        """What the role's engine takes: as measured where its build was, else as expected."""
        return self.measured.get(role) or self.models[role].spec.need_bytes

    def util(self, role: str) -> float:
        """The role's share: from its measured footprint (and some room) once known."""
        if role in self.measured:
            return share(self.measured[role] + MEASURED_SLACK_BYTES, self.total)
        return self.models[role].util

    def fits_together(self) -> tuple[bool, str]:
        """Whether both engines fit in the budget at once, and in words why not."""
        needs = {role: self.need(role) for role in self.models}
        if self.total is None or sum(needs.values()) <= BUDGET_FRACTION * self.total:
            return True, ""
        how = ", ".join(
            f"{self.title(r)} {gib(n)} GiB ({'measured' if r in self.measured else 'expected'})"
            for r, n in needs.items()
        )
        return False, f"{how}: more than {BUDGET_FRACTION} of this GPU's {gib(self.total)} GiB together"
