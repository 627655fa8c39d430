"""A SIMULATED GPU machine for the engine manager: virtual time, engines with GPU-like timings.

What cannot happen on these CPU machines (an 80 GB GPU, 30-120 s builds, sleep mode) is
simulated here, with realistic numbers, so that the real `app.engines.manager.EngineManager` can be driven
through hours of multi-user traffic in seconds by the tests (`tests/test_scheduler_sim.py`) and
the scheduling benchmark (`bench/bench_scheduler.py`):

- `VirtualTimeLoop`: an asyncio loop whose clock jumps ahead whenever every task waits, so a
  60 s build takes no wall time. A state where every task waits with no timer pending is a
  deadlock and raises `SimulationDeadlock` instead of hanging.
- `SimulatedMachine`: devices with physical memory and a budget, host memory, and counters; it
  records every allocation that would exceed a budget (`violations`) instead of crashing, so a
  test can assert there were none.
- `SimulatedEngine` / `SimulatedFactory`: the `Engine` and `EngineFactory` protocols with build,
  wake, sleep and shutdown times by model size, a token rate, aborts, deaths and failed builds.

Timings (by model size, from public vLLM reports and the project's CPU measurements): build 30 s
plus 1.5 s per GB of weights (capped at 120 s), wake 1 s plus 1 s per 40 GB, sleep 1 s plus
0.43 s per GB (measured on an H200: pinning the host memory a sleep copies the weights into is
most of it, `bench/bench_sleep_copies.py`), shutdown 3 s, time to first token 0.15 s, then
300/sqrt(GB of weights) tokens a second.
"""

from __future__ import annotations

import asyncio
import functools
import math
import selectors
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.catalog.cards import ModelCard
from app.engines.base import EngineError, EngineFailure, SamplingSettings, StreamEnd, TextDelta
from app.engines.memory import GIB, GPU_ENGINE_OVERHEAD_BYTES, MemoryNeed
from app.engines.scheduler import Capacity

# Loop steps at one virtual instant before the simulation calls it a busy loop (a real burst of
# work at one instant, hundreds of requests arriving at once, takes thousands).
BUSY_LOOP_STEPS = 200_000

# Sleep (level 1) per GB of weights, measured on an H200 (docs/BENCHMARKS.md, 2026-11-29).
SLEEP_S_PER_GB = 0.43


class SimulationDeadlock(RuntimeError):
    """Every task waits for something that no timer or task will ever do."""


class _SkippingSelector(selectors.BaseSelector):
    """Real I/O readiness (the loop's self-pipe), and virtual time instead of blocking."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready:
            return ready
        if timeout is None:
            raise SimulationDeadlock("every task waits and no timer is pending")
        self._loop.advance(timeout)
        return []


class SimulationBusyLoop(RuntimeError):
    """Tasks keep running without time ever moving: a busy loop (100% CPU on a real machine)."""


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: `time()` moves only when all tasks wait for a timer."""

    def __init__(self) -> None:
        self._now = 0.0
        self._spins = 0
        super().__init__(selector=_SkippingSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds
            self._spins = 0
            return
        self._spins += 1
        if self._spins > BUSY_LOOP_STEPS:
            raise SimulationBusyLoop(
                f"{BUSY_LOOP_STEPS} loop steps at t={self._now:.3f} s without time moving"
            )


@dataclass(frozen=True)
class SimulatedModel:
    """A model's size and speed on the simulated GPU."""

    key: str
    weights_gb: float
    kv_gb: float = 4.0
    devices: int = 1
    # What the engine really takes on each device, where it differs from the estimate (`need`),
    # as a real model's does when its size was guessed.
    actual_gb: float | None = None

    @property
    def need(self) -> MemoryNeed:
        """The estimate the factory gives the scheduler before the build."""
        return MemoryNeed(
            int(self.weights_gb * 1e9), int(self.kv_gb * 1e9), GPU_ENGINE_OVERHEAD_BYTES, self.devices
        )

    @property
    def taken(self) -> int:
        """Bytes the engine really takes on each device while awake."""
        return int(self.actual_gb * 1e9) if self.actual_gb is not None else self.need.per_device

    @property
    def build_s(self) -> float:
        return min(120.0, 30.0 + 1.5 * self.weights_gb)

    @property
    def wake_s(self) -> float:
        return min(3.0, 1.0 + self.weights_gb / 40)

    @property
    def sleep_s(self) -> float:
        # Level 1 pins host memory for every weight and copies it there: 0.43 s per GB on an H200
        # (bench/bench_sleep_copies.py: pinning 0.41, the copy 0.02), plus 1 s for the rest.
        return 1.0 + SLEEP_S_PER_GB * self.weights_gb

    shutdown_s = 3.0
    first_token_s = 0.15

    @property
    def tokens_per_s(self) -> float:
        # Single-stream decode on an H100-class GPU: about 110 tokens/s at 3B, 45 at 24B.
        return max(15.0, 300.0 / math.sqrt(self.weights_gb))


@dataclass
class SimulatedMachine:
    """Memory and counters of the simulated machine; every over-budget allocation is recorded."""

    device_budgets: tuple[int, ...]
    host_budget: int
    clock: Callable[[], float]
    device_used: list[int] = field(default_factory=list)
    host_used: int = 0
    violations: list[str] = field(default_factory=list)
    builds: list[str] = field(default_factory=list)
    failed_builds: list[str] = field(default_factory=list)
    wakes: list[str] = field(default_factory=list)
    sleeps: list[str] = field(default_factory=list)
    shutdowns: list[str] = field(default_factory=list)
    loading_s: float = 0.0
    live: set[SimulatedEngine] = field(default_factory=set)
    # Models whose next wake fails (the engine stays asleep; the manager must rebuild it).
    fail_wakes: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.device_used = [0] * len(self.device_budgets)

    def take(self, devices: Sequence[int], per_device: int, what: str) -> None:
        for device in devices:
            self.device_used[device] += per_device
            if self.device_used[device] > self.device_budgets[device]:
                used, budget = self.device_used[device] / GIB, self.device_budgets[device] / GIB
                self.violations.append(
                    f"t={self.clock():.1f} {what}: device {device} at {used:.1f} of {budget:.1f} GiB"
                )

    def give(self, devices: Sequence[int], per_device: int) -> None:
        for device in devices:
            self.device_used[device] -= per_device

    def take_host(self, amount: int, what: str) -> None:
        self.host_used += amount
        if self.host_used > self.host_budget:
            self.violations.append(f"t={self.clock():.1f} {what}: host at {self.host_used / GIB:.1f} GiB")


class SimulatedEngine:
    """One model's engine on the simulated GPU."""

    resident = True

    def __init__(
        self, machine: SimulatedMachine, model: SimulatedModel, devices: tuple[int, ...], sleeps: bool
    ) -> None:
        self.machine, self.model, self.devices = machine, model, devices
        self.can_sleep = sleeps
        self.asleep = False
        self.dead = False
        self.stopped = False
        self.served = 0
        # Measured at the build, as the real factory does around vLLM's.
        self.footprint_bytes: int | None = model.taken
        self._aborted: set[str] = set()
        self._running: set[str] = set()

    def kill(self) -> None:
        """The engine process dies: its streams fail, as vLLM's EngineDeadError does."""
        self.dead = True

    async def generate(
        self, card: ModelCard, messages: Sequence[dict[str, Any]], sampling: SamplingSettings, request_id: str
    ) -> AsyncIterator[TextDelta | StreamEnd]:
        if self.dead or self.stopped or self.asleep:
            raise EngineFailure(f"{card.display_name} stopped unexpectedly; send the message again.")
        self.served += 1
        self._running.add(request_id)
        try:
            await asyncio.sleep(self.model.first_token_s)
            tokens = int(sampling.max_tokens or 1)
            step = 8  # tokens per simulated delta: keeps long traces fast
            done = 0
            while done < tokens:
                if self.dead or self.stopped or self.asleep:
                    # Shut down or put to sleep under a running answer: what a scheduler must never do.
                    raise EngineFailure(f"{card.display_name} stopped unexpectedly; send the message again.")
                if request_id in self._aborted:
                    yield StreamEnd("abort", 10, done)
                    return
                chunk = min(step, tokens - done)
                await asyncio.sleep(chunk / self.model.tokens_per_s)
                done += chunk
                yield TextDelta("x" * chunk)
            yield StreamEnd("length", 10, done)
        finally:
            self._running.discard(request_id)
            self._aborted.discard(request_id)

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)

    def unfinished_requests(self) -> int:
        return len(self._running)

    async def sleep(self) -> None:
        await asyncio.sleep(self.model.sleep_s)
        need = self.model.need
        self.machine.give(self.devices, self.model.taken - need.asleep_per_device)
        self.machine.take_host(need.asleep_host, f"sleep {self.model.key}")
        self.asleep = True
        self.machine.sleeps.append(self.model.key)

    async def wake(self) -> None:
        need = self.model.need
        self.machine.take(self.devices, self.model.taken - need.asleep_per_device, f"wake {self.model.key}")
        await asyncio.sleep(self.model.wake_s)
        if self.model.key in self.machine.fail_wakes:
            self.machine.fail_wakes.discard(self.model.key)
            self.machine.give(self.devices, self.model.taken - need.asleep_per_device)
            raise RuntimeError("simulated failure to wake")
        self.machine.loading_s += self.model.wake_s
        self.machine.host_used -= need.asleep_host
        self.asleep = False
        self.machine.wakes.append(self.model.key)

    async def shutdown(self) -> None:
        self.stopped = True
        await asyncio.sleep(self.model.shutdown_s)
        if self not in self.machine.live:
            return  # a second shutdown (after one that was interrupted) frees nothing twice
        need = self.model.need
        if self.asleep:
            self.machine.give(self.devices, need.asleep_per_device)
            self.machine.host_used -= need.asleep_host
        else:
            self.machine.give(self.devices, self.model.taken)
        self.machine.live.discard(self)
        self.machine.shutdowns.append(self.model.key)


class SimulatedFactory:
    """Builds `SimulatedEngine`s; `fail_next` makes a model's next build fail."""

    def __init__(
        self,
        machine: SimulatedMachine,
        models: Sequence[SimulatedModel],
        sleep_mode: bool = True,
        max_awake: int | None = None,
    ) -> None:
        self.machine = machine
        self.models = {m.key: m for m in models}
        self.sleep_mode = sleep_mode
        self.max_awake = max_awake
        self.fail_next: set[str] = set()
        self.engines: list[SimulatedEngine] = []

    def capacity(self) -> Capacity:
        host = self.machine.host_budget if self.sleep_mode else 0
        return Capacity(self.machine.device_budgets, host_budget=host, max_awake=self.max_awake)

    def memory_need(self, card: ModelCard) -> MemoryNeed | None:
        return self.models[card.key].need

    async def build(
        self, card: ModelCard, report: Callable[[str], None], devices: tuple[int, ...]
    ) -> SimulatedEngine:
        model = self.models[card.key]
        report("starting the engine (simulated)")
        self.machine.take(devices, model.taken, f"build {card.key}")
        engine = SimulatedEngine(self.machine, model, devices, self.sleep_mode)
        self.machine.live.add(engine)
        started = self.machine.clock()
        try:
            if card.key in self.fail_next:
                self.fail_next.discard(card.key)
                await asyncio.sleep(model.build_s / 3)
                raise EngineError(f"{card.display_name} could not be loaded: simulated failure")
            await asyncio.sleep(model.build_s)
        except BaseException:
            self.machine.give(devices, model.taken)
            self.machine.live.discard(engine)
            self.machine.failed_builds.append(card.key)
            self.machine.loading_s += self.machine.clock() - started
            raise
        self.machine.loading_s += model.build_s
        self.machine.builds.append(card.key)
        self.engines.append(engine)
        return engine


@functools.cache
def format_card() -> ModelCard:
    """The catalog card whose format the simulated models take, read once: the property tests
    ask for cards for each of their examples, and reading the whole catalog's YAML each time was
    most of their time (131 s of 162 in one test's profile)."""
    from app.catalog.cards import load_cards

    return load_cards()["qwen2_vl"]


def simulated_cards(models: Sequence[SimulatedModel]) -> dict[str, ModelCard]:
    """Cards for the simulated models (a Qwen2-VL-style format; only keys and names matter)."""
    from pathlib import Path

    from app.demo.models import twin_card

    qwen2_vl = format_card()
    cards = {}
    for model in models:
        card = twin_card(qwen2_vl, Path("/simulated") / model.key, model.key)
        cards[model.key] = card.model_copy(update={"display_name": f"Simulated {model.key}"})
    return cards
