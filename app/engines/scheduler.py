"""Which model gets the GPU next, and what makes room for it: the scheduling policy.

Pure functions over snapshots, so every decision is testable without engines, clocks or vLLM;
`app.engines.manager.EngineManager` is the mechanism that carries them out (its coordinator,
`app.engines.coordinator`, asks and acts).

The rules, in the order they apply:

- Requests for a model that is awake and not draining start at once (its engine batches them).
- The others wait in one line in arrival order. Only the model of the oldest waiting request
  (the head) may be loaded next, so no model overtakes one that waited longer (no starvation).
- Room for the head is made from awake engines nobody uses, sleeping engines (their GPU
  residue, by shutting them down) and awake engines in use whose quantum is over (least recently
  used first, one already draining before the others).
  An engine in use keeps its users for `quantum_s` after the head started waiting (or after it
  became ready, whichever is later); then it stops admitting, its answers finish (the drain,
  bounded by the mechanism's drain time), and it is evicted. So a waiter waits at most a
  quantum, a drain and a load per model ahead of it.
- Of the ways to make room, the one that shuts the fewest engines down wins (a shut-down
  engine costs a build of a minute or two when it is next asked for; waiting out a quantum is
  bounded), then the one that waits for the fewest quanta, then the one that takes the fewest
  engines in use; engines the room does not need are left alone. Costs are counted, not
  weighed: a sleeper nobody has asked for in an hour is kept as dearly as one asked for a
  minute ago (the idle reaper shuts it down after `idle_unload_s`).
- An evicted engine sleeps (weights to host memory) where it can and the host budget has room,
  else it is shut down.
- Memory is counted per device: awake engines take their need on each device they span,
  sleeping ones their residue; a model is placed on the devices that need the fewest evictions.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from app.engines.memory import MemoryNeed


class Phase(StrEnum):
    AWAKE = "awake"
    ASLEEP = "asleep"
    # Being loaded, woken, put to sleep or shut down: its memory is taken and it cannot be chosen.
    BUSY = "busy"


@dataclass(frozen=True)
class Resident:
    """An engine that holds memory, as the policy sees it."""

    key: str
    need: MemoryNeed
    devices: tuple[int, ...]
    phase: Phase
    leases: int = 0
    last_used: float = 0.0
    ready_since: float = 0.0
    can_sleep: bool = False
    # Draining for the head already: it stays the one drained (its answers ending move its
    # `last_used`, which must not hand the turn to another engine and reopen this one).
    draining: bool = False

    def usage(self) -> int:
        """Bytes it takes on each of its devices now."""
        return self.need.asleep_per_device if self.phase is Phase.ASLEEP else self.need.per_device


@dataclass(frozen=True)
class Head:
    """The model of the oldest waiting request."""

    key: str
    need: MemoryNeed
    arrived: float
    # Where it sleeps, if it does: it wakes on those devices.
    asleep_on: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Capacity:
    """What engines may use: bytes per device (GPUs, or host memory on CPU), host memory for
    sleeping engines, and an optional cap on awake engines."""

    device_budgets: tuple[int, ...]
    host_budget: int = 0
    max_awake: int | None = None


@dataclass(frozen=True)
class Eviction:
    key: str
    sleep: bool


@dataclass(frozen=True)
class Decision:
    """`load` the head on `devices`; `evict` idle engines now; `drain` busy ones (stop admitting,
    let their answers end); `wait` until `until` (a quantum ends) or a change; `refuse` the head."""

    action: str
    key: str
    devices: tuple[int, ...] = ()
    evict: tuple[Eviction, ...] = ()
    drain: tuple[str, ...] = ()
    until: float | None = None
    # Engines in use whose quantum is not over yet, which the head waits for.
    blocking: tuple[str, ...] = ()
    reason: str = ""


@dataclass
class _Trial:
    devices: tuple[int, ...]
    victims: list[Resident] = field(default_factory=list)
    sleeps: dict[str, bool] = field(default_factory=dict)


def host_in_use(residents: Sequence[Resident]) -> int:
    return sum(r.need.asleep_host for r in residents if r.phase is Phase.ASLEEP)


def quantum_over(resident: Resident, head: Head, quantum_s: float, now: float) -> bool:
    return now >= max(resident.ready_since, head.arrived) + quantum_s


def decide(
    head: Head, residents: Sequence[Resident], capacity: Capacity, quantum_s: float, now: float
) -> Decision:
    """What to do next for `head`, given every engine that holds memory."""
    budgets = capacity.device_budgets
    others = [r for r in residents if r.key != head.key]
    # Awake, the head takes its whole need on each of its devices (a sleeping head's residue is
    # part of it: `others` leaves the head out).
    extra = head.need.per_device
    if head.asleep_on is not None:
        candidates = [head.asleep_on]
    else:
        if head.need.devices > len(budgets):
            return Decision(
                "refuse", head.key, reason=f"needs {head.need.devices} GPUs; this machine has {len(budgets)}"
            )
        candidates = list(itertools.combinations(range(len(budgets)), head.need.devices))
    if all(any(extra > budgets[d] for d in devices) for devices in candidates):
        return Decision(
            "refuse",
            head.key,
            reason=f"needs {head.need.describe()}; the budget is {budgets[0] / 2**30:.1f} GiB per device",
        )

    awake = [r for r in others if r.phase is not Phase.ASLEEP]
    idle = sorted((r for r in awake if r.phase is Phase.AWAKE and r.leases == 0), key=lambda r: r.last_used)
    asleep = sorted((r for r in others if r.phase is Phase.ASLEEP), key=lambda r: r.last_used)
    busy = [r for r in awake if r.phase is Phase.AWAKE and r.leases > 0]
    expired = sorted(
        (r for r in busy if quantum_over(r, head, quantum_s, now)),
        key=lambda r: (not r.draining, r.last_used),
    )
    running = sorted((r for r in busy if r not in expired), key=lambda r: r.ready_since)

    def fits(trial: _Trial) -> bool:
        gone = {v.key for v in trial.victims}
        for device in trial.devices:
            used = 0
            for r in others:
                if device not in r.devices:
                    continue
                if r.key in gone:
                    used += r.need.asleep_per_device if trial.sleeps.get(r.key) else 0
                else:
                    used += r.usage()
            if used + extra > budgets[device]:
                return False
        if capacity.max_awake is not None:
            still_awake = sum(1 for r in awake if r.key not in gone)
            if still_awake + 1 > capacity.max_awake:
                return False
        return True

    def with_sleeps(devices: tuple[int, ...], victims: list[Resident]) -> _Trial:
        """Each victim sleeps, in order, where it can and the host budget still has room."""
        trial = _Trial(devices, victims)
        host_free = capacity.host_budget - host_in_use(residents)
        for victim in victims:
            sleeps = victim.phase is Phase.AWAKE and victim.can_sleep
            trial.sleeps[victim.key] = sleeps and victim.need.asleep_host <= host_free
            host_free -= victim.need.asleep_host if trial.sleeps[victim.key] else 0
        return trial

    def without_spares(trial: _Trial) -> _Trial:
        """`trial` less the victims the room does not need, latest in the order first: the
        shortest prefix of the order that makes room may hold engines ahead of the one that
        does (sleeping engines ahead of a large one whose quantum is over), and shutting a
        sleeping engine down frees only its residue but costs a build when it is next asked for.
        The host memory a dropped victim would have taken may now let another one sleep."""
        for victim in reversed(list(trial.victims)):
            rest = [v for v in trial.victims if v is not victim]
            kept = _Trial(trial.devices, rest, {v.key: trial.sleeps[v.key] for v in rest})
            for fewer in (with_sleeps(trial.devices, rest), kept):
                if fits(fewer):
                    trial = fewer
                    break
        return trial

    def search(devices: tuple[int, ...], order: list[Resident]) -> _Trial | None:
        """The fewest victims (in `order`) that make room, each sleeping where the host has room
        for it (a wake later costs seconds, a build a minute); only where sleeping residues
        cannot fit, the least recently used victims are shut down instead."""
        relevant = [r for r in order if set(r.devices) & set(devices) or capacity.max_awake is not None]
        trials = []
        for count in range(len(relevant) + 1):
            trial = with_sleeps(devices, list(relevant[:count]))
            if fits(trial):
                return without_spares(trial)
            trials.append(trial)
        for trial in trials:
            for victim in trial.victims:
                if trial.sleeps[victim.key]:
                    trial.sleeps[victim.key] = False
                    if fits(trial):
                        return without_spares(trial)
        return None

    # Sleeping engines (a shutdown each) before or after awake ones (a sleep each), and engines
    # whose quantum is not over only where nothing else makes room.
    orders = (
        [*idle, *asleep, *expired],
        [*idle, *expired, *asleep],
        [*idle, *asleep, *expired, *running],
        [*idle, *expired, *running, *asleep],
    )
    best: tuple[tuple[int, int, int, int], _Trial] | None = None
    for devices in candidates:
        for order in orders:
            trial = search(devices, order)
            if trial is not None:
                in_use = sum(1 for v in trial.victims if v.leases)
                not_yet = sum(1 for v in trial.victims if v in running)
                shutdowns = sum(1 for v in trial.victims if not trial.sleeps[v.key])
                score = (shutdowns, not_yet, in_use, len(trial.victims))
                if best is None or score < best[0]:
                    best = (score, trial)
    if best is None:
        # Engines being loaded or unloaded hold the memory: wait for them to finish.
        return Decision("wait", head.key, reason="waiting for memory being freed")
    trial = best[1]
    blocked = [v for v in trial.victims if v in running]
    if blocked:
        until = min(max(v.ready_since, head.arrived) + quantum_s for v in blocked)
        return Decision("wait", head.key, until=until, blocking=tuple(v.key for v in blocked))
    if not trial.victims:
        return Decision("load", head.key, devices=trial.devices)
    now_out = tuple(Eviction(v.key, trial.sleeps[v.key]) for v in trial.victims if not v.leases)
    drain = tuple(v.key for v in trial.victims if v.leases)
    return Decision("evict" if not drain else "drain", head.key, trial.devices, now_out, drain)


def host_evictions(residents: Sequence[Resident], incoming: int, host_budget: int) -> list[str] | None:
    """Sleeping engines to shut down (least recently used first) so that `incoming` bytes fit in
    the host budget; None where they cannot fit at all."""
    if incoming > host_budget:
        return None
    asleep = sorted((r for r in residents if r.phase is Phase.ASLEEP), key=lambda r: r.last_used)
    free = host_budget - host_in_use(residents)
    out: list[str] = []
    for resident in asleep:
        if free >= incoming:
            break
        out.append(resident.key)
        free += resident.need.asleep_host
    return out if free >= incoming else None


def idle_expired(residents: Sequence[Resident], idle_s: float, now: float) -> list[str]:
    """Engines, awake or asleep, unused for `idle_s` (0: never reaped)."""
    if idle_s <= 0:
        return []
    return [
        r.key
        for r in residents
        if r.phase is not Phase.BUSY and r.leases == 0 and now - r.last_used >= idle_s
    ]


def next_idle_deadline(residents: Sequence[Resident], idle_s: float) -> float | None:
    times = [r.last_used + idle_s for r in residents if r.phase is not Phase.BUSY and r.leases == 0]
    return min(times) if times and idle_s > 0 else None
