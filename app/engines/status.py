"""What the UI reads of each model: its state and phase as a `ModelStatus`, and the listeners
told of every change (`EngineManager.subscribe`).

The state is derived from the model's slot and the line on every read, never stored, so it
cannot drift from what admission and the lifecycle did. Everything that changes what a model
shows goes through `publish`, `set_activity` or `set_phase` here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from app.engines.admission import Ticket
from app.engines.base import ModelState, ModelStatus
from app.engines.slots import Slot, slot_of

# The manager's logger, as before it was split into modules: the log lines stay the same.
log = logging.getLogger("app.engines.manager")


def state_of(slot: Slot, line: Sequence[Ticket]) -> tuple[ModelState, str]:
    """The model's state and the phase shown with it."""
    if slot.activity == "loading":
        return ModelState.LOADING, slot.phase
    if slot.activity == "unloading":
        return ModelState.UNLOADING, slot.phase
    if slot.engine is not None and not slot.asleep:
        return (
            ModelState.READY,
            "finishing its answers, then giving others a turn" if slot.draining else "",
        )
    if any(t.slot is slot for t in line):
        return ModelState.QUEUED, slot.phase or "waiting for its turn to load"
    if slot.engine is not None:
        return ModelState.SLEEPING, ""
    if slot.reason:
        return ModelState.FAILED, ""
    return ModelState.NOT_LOADED, ""


class StatusBoard:
    """Each model's status, and the listeners told of every change of state or phase."""

    def __init__(self, slots: Mapping[str, Slot], line: Sequence[Ticket], clock: Callable[[], float]) -> None:
        self._slots = slots
        self._line = line
        self._clock = clock
        self._listeners: list[Callable[[ModelStatus], None]] = []

    def status(self, key: str) -> ModelStatus:
        slot = slot_of(self._slots, key)
        state, phase = state_of(slot, self._line)
        elapsed = None
        if state is ModelState.QUEUED:
            elapsed = self._clock() - min(t.arrived for t in self._line if t.slot is slot)
        elif state in (ModelState.LOADING, ModelState.UNLOADING):
            elapsed = self._clock() - slot.since
        return ModelStatus(
            key=key,
            state=state,
            phase=phase,
            elapsed_s=elapsed,
            estimate_s=slot.last_build_s,
            reason=slot.reason if state is ModelState.FAILED else "",
            in_flight=len(slot.in_flight),
        )

    def subscribe(self, listener: Callable[[ModelStatus], None]) -> Callable[[], None]:
        """Calls `listener` on every change of any model's state or phase."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def publish(self, slot: Slot) -> None:
        """Tells every listener the model's status now; a listener that fails is logged, and
        the others are still told."""
        status = self.status(slot.card.key)
        for listener in list(self._listeners):
            try:
                listener(status)
            except Exception:
                log.exception("a status listener failed")

    def set_activity(self, slot: Slot, activity: str, phase: str = "") -> None:
        """The coordinator starts (or ends, with "") loading or unloading the model."""
        slot.activity, slot.phase, slot.since = activity, phase, self._clock()
        self.publish(slot)

    def set_phase(self, slot: Slot, phase: str) -> None:
        """A step within the model's state (a build's progress, its place in line)."""
        if phase != slot.phase:
            slot.phase = phase
            self.publish(slot)
