"""The coordinator: one asyncio task that carries out `app.engines.scheduler`'s decisions, one
change of residency at a time.

Each step: clean up a dead engine; grant the requests whose model admits; reap an engine
unused for `idle_unload_s` (the idle reaper); build engines for remote servers (they hold no
memory here, so they do not wait for the GPU); then ask the policy about the head of the line
(the oldest request whose model does not admit) and load it, make room for it (sleep or unload
an engine nobody uses), drain the engines whose quantum is over, refuse it, or wait. Between
steps the task sleeps until something changes (admission and the lifecycle set `wake`) or the
next deadline (a drain's end, an idle engine's expiry, a wait the policy asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from app.config import Settings
from app.engines.admission import Admission, admitting
from app.engines.base import EngineError
from app.engines.lifecycle import Lifecycle
from app.engines.scheduler import Decision, Head, decide, idle_expired, next_idle_deadline
from app.engines.slots import Slot
from app.engines.status import StatusBoard

# The manager's logger, as before it was split into modules: the log lines stay the same.
log = logging.getLogger("app.engines.manager")

# The coordinator's shortest sleep between two looks when there is nothing to do.
MIN_WAIT_S = 0.05


class Coordinator:
    """The task that schedules: started by the first request, stopped by `EngineManager.close`."""

    def __init__(
        self,
        slots: Mapping[str, Slot],
        settings: Settings,
        clock: Callable[[], float],
        wake: asyncio.Event,
        board: StatusBoard,
        admission: Admission,
        lifecycle: Lifecycle,
    ) -> None:
        self._slots = slots
        self._settings = settings
        self._clock = clock
        # Set (by admission and the lifecycle) whenever there may be something to do.
        self._wake = wake
        self._board = board
        self._admission = admission
        self._lifecycle = lifecycle
        self._task: asyncio.Task[None] | None = None
        self._wait_until: float | None = None
        self._stopping = False

    def ensure_running(self) -> None:
        """Starts the coordinator, or restarts it if it ever ended (it must not)."""
        task = self._task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            log.error("the engine coordinator ended; restarting it", exc_info=task.exception())
        if task is None or task.done():
            self._task = asyncio.create_task(self._run(), name="engine-coordinator")

    async def stop(self) -> None:
        """Cancels the task and waits for it to end (it can be started again afterwards)."""
        self._stopping = True
        try:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
                self._task = None
        finally:
            self._stopping = False

    async def _run(self) -> None:
        # `stop` also cancels this task, but Python 3.11's `wait_for` can swallow a cancel
        # that arrives as its wait ends: the flag makes the loop end anyway.
        while not self._stopping:
            self._wake.clear()
            try:
                acted = await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                # One failed step must not stop scheduling: log it and look again shortly.
                log.exception("the engine coordinator's step failed")
                acted = False
                self._wait_until = self._clock() + 1.0
            if acted:
                continue
            timeout = self._next_timer()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _next_timer(self) -> float | None:
        now = self._clock()
        times = [s.drain_deadline for s in self._slots.values() if s.drain_deadline and not s.aborting]
        if self._wait_until is not None:
            times.append(self._wait_until)
        waiting = self._admission.waiting_keys()
        idle = next_idle_deadline(
            [r for r in self._lifecycle.residents() if r.key not in waiting], self._settings.idle_unload_s
        )
        if idle is not None:
            times.append(idle)
        # A floor, so that a deadline nothing can act on yet never turns into a busy loop.
        return max(MIN_WAIT_S, min(times) - now) if times else None

    async def _step(self) -> bool:
        """One decision and its action; False when there is nothing to do until a change."""
        admission, lifecycle = self._admission, self._lifecycle
        self._wait_until = None
        if lifecycle.dead:
            await lifecycle.bury(lifecycle.dead.pop())
            return True
        admission.grant_waiting()
        now = self._clock()
        if await self._reap_idle(now):
            return True
        for ticket in admission.line:
            slot = ticket.slot
            if lifecycle.need(slot) is None and slot.engine is None:
                # A remote server holds no memory here: it does not wait for the GPU.
                await lifecycle.load(slot, ())
                return True
        head = next((t for t in admission.line if not admitting(t.slot)), None)
        if head is None:
            self._set_draining(set())
            return False
        slot = head.slot
        need = lifecycle.need(slot)
        if need is None:
            return False
        asleep_on = slot.devices if slot.asleep and slot.engine is not None else None
        try:
            capacity = lifecycle.capacity()
        except EngineError as error:
            # No memory figures (NVML unreadable): nothing local can be placed; say why.
            for ticket in [t for t in admission.line if lifecycle.need(t.slot) is not None]:
                admission.fail(ticket, str(error))
            return True
        decision = decide(
            Head(slot.card.key, need, head.arrived, asleep_on),
            lifecycle.residents(),
            capacity,
            self._settings.quantum_s,
            now,
        )
        # Engines to be evicted stay closed too: reopened (they may have drained for an earlier
        # decision), they would take waiting requests, then be put to sleep under them or drained
        # a second time.
        self._set_draining(set(decision.drain) | {eviction.key for eviction in decision.evict})
        self._describe_line(slot, decision)
        if decision.action == "load":
            await lifecycle.load(slot, decision.devices)
            return True
        if decision.action == "refuse":
            reason = f"{slot.card.display_name} cannot be loaded here: it {decision.reason}."
            slot.reason = reason
            admission.fail_for(slot, reason)
            self._board.publish(slot)
            return True
        if decision.evict:
            eviction = decision.evict[0]
            await lifecycle.evict(self._slots[eviction.key], eviction.sleep, slot)
            return True
        if decision.action == "wait":
            self._wait_until = decision.until
            return False
        return await self._abort_overdue()

    async def _reap_idle(self, now: float) -> bool:
        """The idle reaper: unloads one engine unused for `idle_unload_s`, awake or asleep,
        unless requests wait for it or hold leases on it."""
        waiting_keys = self._admission.waiting_keys()
        for key in idle_expired(self._lifecycle.residents(), self._settings.idle_unload_s, now):
            slot = self._slots.get(key)
            if slot is not None and key not in waiting_keys and not slot.leases:
                await self._lifecycle.unload(slot, "unused for a while")
                return True
        return False

    def _set_draining(self, keys: set[str]) -> None:
        """Draining engines stop admitting, with a deadline for their answers; the others admit
        again (and the requests waiting for them are granted)."""
        now = self._clock()
        for key, slot in self._slots.items():
            draining = key in keys
            if draining and slot.drain_deadline is None:
                slot.drain_deadline = now + self._settings.drain_timeout_s
            if not draining:
                slot.drain_deadline = None
            if draining != slot.draining:
                slot.draining = draining
                self._board.publish(slot)
        self._admission.grant_waiting()

    async def _abort_overdue(self) -> bool:
        """Past the drain time, the draining engines' answers are stopped (each ends "abort")."""
        now = self._clock()
        acted = False
        for slot in self._slots.values():
            if slot.draining and not slot.aborting and slot.drain_deadline and now >= slot.drain_deadline:
                slot.aborting = True
                engine = slot.engine
                for request_id in list(slot.in_flight):
                    if engine is not None:
                        with contextlib.suppress(Exception):
                            await engine.abort(request_id)
                acted = True
        return acted

    def _describe_line(self, head: Slot, decision: Decision) -> None:
        """Tells the waiting models' status what they wait for, never naming the other models:
        every visitor reads every model's status, and the arena's battles are blind (which
        models another visitor uses is not a stranger's to learn either)."""
        for slot in {t.slot for t in self._admission.line}:
            if slot is not head:
                self._board.set_phase(slot, "in line behind another model")
        busy = [self._slots[k] for k in (*decision.drain, *decision.blocking) if k in self._slots]
        if busy:
            answers = sum(s.leases for s in busy)
            others = "another model" if len(busy) == 1 else f"{len(busy)} other models"
            self._board.set_phase(head, f"waiting for {answers} answer(s) on {others} to finish")
        elif decision.action == "wait":
            self._board.set_phase(head, "waiting for memory being freed")
