"""The engine manager: builds engines lazily, streams answers, shares the GPU fairly.

One `EngineManager` owns every model's lifecycle. It is given the cards, the settings and an
engine factory (`app.engines.vllm_engine.VllmEngineFactory` in the app; a simulated GPU in tests and
benchmarks), and it never imports vLLM or torch itself.

Generation is not serialised: a request for a model that is awake starts at once and its engine
batches it with the others. Requests for models that are not awake wait in one line; a single
coordinator task carries out the decisions of `app.engines.scheduler` (load the head of the line, make
room for it by sleeping or unloading engines, drain engines whose quantum is over, reap idle
ones), one change of residency at a time. A request holds a lease on its engine from the moment
it is granted until its answer ends, and only engines without leases are evicted, so an engine
built for waiting requests always serves them.

All methods run on one asyncio event loop (the app's).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.catalog.cards import ModelCard
from app.config import Settings
from app.engines.base import (
    Engine,
    EngineError,
    EngineEvents,
    EngineFactory,
    EngineFailure,
    ModelState,
    ModelStatus,
    SamplingSettings,
    StreamEnd,
    StreamEvent,
    TextDelta,
    failure_reason,
)
from app.engines.memory import MemoryNeed
from app.engines.scheduler import (
    Capacity,
    Decision,
    Head,
    Phase,
    Resident,
    decide,
    host_evictions,
    idle_expired,
)
from app.engines.scheduler import next_idle_deadline as _next_idle_deadline

log = logging.getLogger(__name__)

# The coordinator's shortest sleep between two looks when there is nothing to do.
MIN_WAIT_S = 0.05


@dataclass(eq=False)
class _Slot:
    card: ModelCard
    need: MemoryNeed | None = None
    engine: Engine | None = None
    devices: tuple[int, ...] = ()
    asleep: bool = False
    # "loading" or "unloading" while the coordinator changes its residency.
    activity: str = ""
    phase: str = ""
    # Why the last build failed (shown until the next attempt).
    reason: str = ""
    since: float = 0.0
    leases: int = 0
    in_flight: set[str] = field(default_factory=set)
    last_used: float = 0.0
    ready_since: float = 0.0
    # Stops admitting new requests: its quantum is over and another model waits for the GPU.
    draining: bool = False
    drain_deadline: float | None = None
    aborting: bool = False
    last_build_s: float | None = None


@dataclass(eq=False)
class _Ticket:
    """One request's place in line, then its lease on the engine."""

    slot: _Slot
    arrived: float
    granted: asyncio.Event = field(default_factory=asyncio.Event)
    engine: Engine | None = None
    error: str | None = None


@dataclass(eq=False)
class _Dead:
    """An engine that died: it holds its memory until the coordinator has shut it down."""

    key: str
    need: MemoryNeed
    devices: tuple[int, ...]
    engine: Engine


class EngineManager:
    """Every model's engine: built on first use, shared by all users, scheduled fairly."""

    def __init__(
        self,
        cards: Mapping[str, ModelCard],
        settings: Settings,
        factory: EngineFactory,
        clock: Callable[[], float] = time.monotonic,
        progress_interval_s: float = 0.5,
        events: EngineEvents | None = None,
    ) -> None:
        self._slots = {key: _Slot(card) for key, card in cards.items()}
        self._settings = settings
        self._factory = factory
        self._clock = clock
        self._progress_interval_s = progress_interval_s
        self._line: list[_Ticket] = []
        self._dead: list[_Dead] = []
        self._stopping: list[Engine] = []
        self._listeners: list[Callable[[ModelStatus], None]] = []
        self._request_ids = itertools.count()
        self._coordinator: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._wait_until: float | None = None
        self._capacity: Capacity | None = None
        self._closing = False
        # Who is told of builds, sleeps, waits and answers (an operator's metrics).
        self.events: EngineEvents = events or EngineEvents()

    # --- what the UI reads -----------------------------------------------------------------

    @property
    def cards(self) -> dict[str, ModelCard]:
        return {key: slot.card for key, slot in self._slots.items()}

    def status(self, key: str) -> ModelStatus:
        slot = self._slot(key)
        state, phase = self._state(slot)
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

    def unfinished_requests(self, key: str) -> int:
        """Requests the model's engine still holds (0 when it is not loaded)."""
        engine = self._slot(key).engine
        return engine.unfinished_requests() if engine is not None else 0

    def waiting_models(self) -> set[str]:
        """The models that requests wait in line for now (a grid run gives way to them)."""
        return {ticket.slot.card.key for ticket in self._line}

    def engines(self) -> dict[str, tuple[Engine, tuple[int, ...], bool]]:
        """Every engine that serves or sleeps now, with its devices and whether it sleeps."""
        return {k: (s.engine, s.devices, s.asleep) for k, s in self._slots.items() if s.engine is not None}

    def engines_held(self) -> list[Engine]:
        """Every engine the manager still holds: serving, asleep, being stopped, or dead and
        not yet cleaned up (what must be gone after `close`)."""
        return [s.engine for s in self._slots.values() if s.engine is not None] + [
            *self._stopping,
            *(d.engine for d in self._dead),
        ]

    # --- the core call ---------------------------------------------------------------------

    async def stream(
        self, key: str, messages: Sequence[dict[str, Any]], sampling: SamplingSettings | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Answers the conversation with model `key`: status updates while its engine is not
        ready (the last one `READY` once it is), then text deltas as the engine produces them,
        then one `StreamEnd`.

        Closing the generator (a stop button, a closed tab) gives up its place in line or aborts
        the request in the engine. Raises `EngineError` (or the adapters' `PromptError`) with a
        message for the user.
        """
        slot = self._slot(key)
        if self._closing:
            raise EngineError("The app is stopping; try again in a moment.")
        # Refused before waiting in line: a value out of range is refused by every engine.
        sampling = (sampling or SamplingSettings()).for_card(slot.card)
        sampling.check()
        self._ensure_coordinator()
        ticket = _Ticket(slot, self._clock())
        waited = False
        try:
            while True:
                if not self._admit(ticket):
                    self._enqueue(ticket)
                    while not ticket.granted.is_set():
                        waited = True
                        yield self.status(key)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(ticket.granted.wait(), self._progress_interval_s)
                    if ticket.error is not None:
                        raise EngineError(ticket.error)
                engine = ticket.engine
                if engine is not None and engine is slot.engine and not slot.aborting:
                    break
                # Granted just as its engine was being stopped: back in line, same place.
                self._release(ticket)
            if waited:
                # Marks the moment the wait ended, so that time to first token excludes it.
                yield self.status(key)
            self.events.waited(key, self._clock() - ticket.arrived)
            request_id = f"{key}-{next(self._request_ids)}"
            slot.in_flight.add(request_id)
            started, first_token = self._clock(), None
            try:
                async for event in engine.generate(slot.card, messages, sampling, request_id):
                    if first_token is None and isinstance(event, TextDelta) and event.text:
                        first_token = self._clock() - started
                    if isinstance(event, StreamEnd) and event.finish_reason != "abort":
                        self.events.answered(
                            key, first_token, event.completion_tokens, self._clock() - started
                        )
                    yield event
            except EngineFailure as failure:
                self._mark_failed(slot, engine, str(failure))
                raise
            finally:
                slot.in_flight.discard(request_id)
        finally:
            if ticket in self._line:
                self._line.remove(ticket)
                self._publish(slot)
            self._release(ticket)

    async def close(self) -> None:
        """Shuts every engine down (the app is stopping, or a test is done with them); the
        manager can be used again afterwards."""
        self._closing = True
        try:
            if self._coordinator is not None:
                self._coordinator.cancel()
                with contextlib.suppress(BaseException):
                    await self._coordinator
                self._coordinator = None
            for ticket in list(self._line):
                self._fail(ticket, "The app is stopping; try again in a moment.")
            # Answers under way end ("abort") before their engines go, so no stream hangs.
            for slot in self._slots.values():
                for request_id in list(slot.in_flight):
                    if slot.engine is not None:
                        with contextlib.suppress(Exception):
                            await slot.engine.abort(request_id)
            for _ in range(40):
                if not any(slot.in_flight for slot in self._slots.values()):
                    break
                await asyncio.sleep(0.05)
            for slot in self._slots.values():
                slot.activity = ""
                if slot.engine is not None:
                    await self._unload(slot, "the app is stopping")
            while self._dead:
                await self._bury(self._dead.pop())
        finally:
            self._closing = False

    # --- requests: admission, line, leases --------------------------------------------------

    def _slot(self, key: str) -> _Slot:
        try:
            return self._slots[key]
        except KeyError:
            raise EngineError(f"There is no model {key!r} in this app's catalog.") from None

    def _admitting(self, slot: _Slot) -> bool:
        return (
            slot.engine is not None
            and not slot.asleep
            and not slot.activity
            and not slot.draining
            and not slot.aborting
        )

    def _admit(self, ticket: _Ticket) -> bool:
        """Grants a lease at once where the model is awake and admitting."""
        if not self._admitting(ticket.slot):
            return False
        self._grant(ticket)
        return True

    def _grant(self, ticket: _Ticket) -> None:
        ticket.slot.leases += 1
        ticket.engine = ticket.slot.engine
        ticket.granted.set()

    def _enqueue(self, ticket: _Ticket) -> None:
        ticket.granted.clear()
        ticket.engine = None
        position = next((i for i, t in enumerate(self._line) if t.arrived > ticket.arrived), len(self._line))
        self._line.insert(position, ticket)
        self._publish(ticket.slot)
        self._kick()

    def _release(self, ticket: _Ticket) -> None:
        if ticket.engine is not None:
            ticket.slot.leases -= 1
            ticket.slot.last_used = self._clock()
            ticket.engine = None
            self._kick()

    def _fail(self, ticket: _Ticket, reason: str) -> None:
        if ticket in self._line:
            self._line.remove(ticket)
        ticket.error = reason
        ticket.granted.set()

    def _grant_waiting(self) -> None:
        for ticket in list(self._line):
            if self._admitting(ticket.slot):
                self._line.remove(ticket)
                self._grant(ticket)
                self._publish(ticket.slot)

    # --- what the coordinator sees ------------------------------------------------------------

    def _need(self, slot: _Slot) -> MemoryNeed | None:
        if slot.need is None and not self._is_remote(slot):
            slot.need = self._factory.memory_need(slot.card)
        return slot.need

    def _is_remote(self, slot: _Slot) -> bool:
        return bool(slot.card.remote_url or slot.card.key in self._settings.remote_engines)

    def capacity(self) -> Capacity:
        if self._capacity is None:
            capacity = self._factory.capacity()
            self._capacity = replace(capacity, max_awake=self._settings.max_resident)
        return self._capacity

    def residents(self) -> list[Resident]:
        """Every engine that holds memory here, as the policy sees it."""
        residents = []
        for slot in self._slots.values():
            need = self._need(slot)
            if need is None or (slot.engine is None and not slot.activity):
                continue
            if slot.engine is not None and not slot.engine.resident:
                continue
            phase = Phase.BUSY if slot.activity else Phase.ASLEEP if slot.asleep else Phase.AWAKE
            can_sleep = slot.engine is not None and slot.engine.can_sleep
            residents.append(
                Resident(
                    slot.card.key,
                    need,
                    slot.devices,
                    phase,
                    slot.leases,
                    slot.last_used,
                    slot.ready_since,
                    can_sleep,
                )
            )
        residents += [Resident(f"{d.key} (stopped)", d.need, d.devices, Phase.BUSY) for d in self._dead]
        return residents

    def _state(self, slot: _Slot) -> tuple[ModelState, str]:
        if slot.activity == "loading":
            return ModelState.LOADING, slot.phase
        if slot.activity == "unloading":
            return ModelState.UNLOADING, slot.phase
        if slot.engine is not None and not slot.asleep:
            return (
                ModelState.READY,
                "finishing its answers, then giving others a turn" if slot.draining else "",
            )
        if any(t.slot is slot for t in self._line):
            return ModelState.QUEUED, slot.phase or "waiting for its turn to load"
        if slot.engine is not None:
            return ModelState.SLEEPING, ""
        if slot.reason:
            return ModelState.FAILED, ""
        return ModelState.NOT_LOADED, ""

    def _publish(self, slot: _Slot) -> None:
        status = self.status(slot.card.key)
        for listener in list(self._listeners):
            try:
                listener(status)
            except Exception:
                log.exception("a status listener failed")

    def _set_activity(self, slot: _Slot, activity: str, phase: str = "") -> None:
        slot.activity, slot.phase, slot.since = activity, phase, self._clock()
        self._publish(slot)

    def _set_phase(self, slot: _Slot, phase: str) -> None:
        if phase != slot.phase:
            slot.phase = phase
            self._publish(slot)

    # --- the coordinator ------------------------------------------------------------------------

    def _kick(self) -> None:
        self._wake.set()

    def _ensure_coordinator(self) -> None:
        """Starts the coordinator, or restarts it if it ever ended (it must not)."""
        task = self._coordinator
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            log.error("the engine coordinator ended; restarting it", exc_info=task.exception())
        if task is None or task.done():
            self._coordinator = asyncio.create_task(self._coordinate(), name="engine-coordinator")

    async def _coordinate(self) -> None:
        # `close` also cancels this task, but Python 3.11's `wait_for` can swallow a cancel
        # that arrives as its wait ends: the flag makes the loop end anyway.
        while not self._closing:
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
        waiting = {t.slot.card.key for t in self._line}
        idle = _next_idle_deadline(
            [r for r in self.residents() if r.key not in waiting], self._settings.idle_unload_s
        )
        if idle is not None:
            times.append(idle)
        # A floor, so that a deadline nothing can act on yet never turns into a busy loop.
        return max(MIN_WAIT_S, min(times) - now) if times else None

    async def _step(self) -> bool:
        """One decision and its action; False when there is nothing to do until a change."""
        self._wait_until = None
        if self._dead:
            await self._bury(self._dead.pop())
            return True
        self._grant_waiting()
        now = self._clock()
        waiting_keys = {t.slot.card.key for t in self._line}
        for key in idle_expired(self.residents(), self._settings.idle_unload_s, now):
            slot = self._slots.get(key)
            if slot is not None and key not in waiting_keys and not slot.leases:
                await self._unload(slot, "unused for a while")
                return True
        for ticket in self._line:
            slot = ticket.slot
            if self._need(slot) is None and slot.engine is None:
                # A remote server holds no memory here: it does not wait for the GPU.
                await self._load(slot, ())
                return True
        head = next((t for t in self._line if not self._admitting(t.slot)), None)
        if head is None:
            self._set_draining(set())
            return False
        slot = head.slot
        need = self._need(slot)
        if need is None:
            return False
        asleep_on = slot.devices if slot.asleep and slot.engine is not None else None
        try:
            capacity = self.capacity()
        except EngineError as error:
            # No memory figures (NVML unreadable): nothing local can be placed; say why.
            for ticket in [t for t in self._line if self._need(t.slot) is not None]:
                self._fail(ticket, str(error))
            return True
        decision = decide(
            Head(slot.card.key, need, head.arrived, asleep_on),
            self.residents(),
            capacity,
            self._settings.quantum_s,
            now,
        )
        self._set_draining(set(decision.drain))
        self._describe_line(slot, decision)
        if decision.action == "load":
            await self._load(slot, decision.devices)
            return True
        if decision.action == "refuse":
            reason = f"{slot.card.display_name} cannot be loaded here: it {decision.reason}."
            slot.reason = reason
            for ticket in [t for t in self._line if t.slot is slot]:
                self._fail(ticket, reason)
            self._publish(slot)
            return True
        if decision.evict:
            eviction = decision.evict[0]
            await self._evict(self._slots[eviction.key], eviction.sleep, slot)
            return True
        if decision.action == "wait":
            self._wait_until = decision.until
            return False
        return await self._abort_overdue()

    def _set_draining(self, keys: set[str]) -> None:
        now = self._clock()
        for key, slot in self._slots.items():
            draining = key in keys
            if draining and slot.drain_deadline is None:
                slot.drain_deadline = now + self._settings.drain_timeout_s
            if not draining:
                slot.drain_deadline = None
            if draining != slot.draining:
                slot.draining = draining
                self._publish(slot)
        self._grant_waiting()

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

    def _describe_line(self, head: _Slot, decision: Decision) -> None:
        name = head.card.display_name
        for slot in {t.slot for t in self._line}:
            if slot is not head:
                self._set_phase(slot, f"in line behind {name}")
        busy = [self._slots[k] for k in (*decision.drain, *decision.blocking) if k in self._slots]
        if busy:
            answers = sum(s.leases for s in busy)
            names = ", ".join(s.card.display_name for s in busy)
            self._set_phase(head, f"waiting for {answers} answer(s) on {names} to finish")
        elif decision.action == "wait":
            self._set_phase(head, "waiting for memory being freed")

    # --- changes of residency ---------------------------------------------------------------------

    async def _load(self, slot: _Slot, devices: tuple[int, ...]) -> None:
        """Wakes or builds `slot`'s engine, then grants every request waiting for it."""
        started = self._clock()
        slot.reason = ""
        if slot.engine is None:
            slot.devices = devices
        waking = slot.engine is not None and slot.asleep
        woke = False
        self._set_activity(slot, "loading", "waking from sleep" if waking else "starting")
        try:
            if waking and slot.engine is not None:
                try:
                    await slot.engine.wake()
                    slot.asleep, woke = False, True
                except Exception:
                    log.exception("waking %s failed; rebuilding it", slot.card.key)
                    self._set_phase(slot, "waking failed; rebuilding")
                    engine, slot.engine, slot.asleep = slot.engine, None, False
                    with contextlib.suppress(Exception):
                        await engine.shutdown()
            if slot.engine is None:
                slot.engine = await self._factory.build(
                    slot.card, lambda phase: self._set_phase(slot, phase), slot.devices
                )
                slot.asleep = False
            now = self._clock()
            slot.last_build_s = now - started
            self.events.loaded(slot.card.key, now - started, woke)
            slot.ready_since = slot.last_used = now
            slot.draining = slot.aborting = False
            slot.drain_deadline = None
        except asyncio.CancelledError:
            self._set_activity(slot, "")
            raise
        except Exception as error:
            log.exception("loading %s failed", slot.card.key)
            self.events.load_failed(slot.card.key)
            slot.engine, slot.asleep = None, False
            slot.reason = failure_reason(slot.card, error)
            self._set_activity(slot, "")
            for ticket in [t for t in self._line if t.slot is slot]:
                self._fail(ticket, slot.reason)
            self._publish(slot)
            return
        self._set_activity(slot, "")
        self._grant_waiting()

    async def _evict(self, victim: _Slot, sleep: bool, newcomer: _Slot) -> None:
        """Sleeps or unloads an engine nobody uses, to make room for `newcomer`."""
        name = newcomer.card.display_name
        self._set_activity(victim, "unloading", f"making room for {name}")
        self._set_phase(newcomer, f"unloading {victim.card.display_name}")
        try:
            need = self._need(victim)
            if sleep and need is not None:
                out = host_evictions(self.residents(), need.asleep_host, self.capacity().host_budget)
                for key in out or ():
                    await self._unload(self._slots[key], f"host memory needed for {victim.card.display_name}")
                sleep = out is not None
            engine = victim.engine
            if sleep and engine is not None:
                try:
                    started = self._clock()
                    await engine.sleep()
                    victim.asleep = True
                    self.events.slept(victim.card.key, self._clock() - started)
                except Exception:
                    log.exception("putting %s to sleep failed; shutting it down", victim.card.key)
                    sleep = False
            if not sleep:
                await self._unload(victim, f"made room for {name}")
        finally:
            victim.draining = victim.aborting = False
            victim.drain_deadline = None
            self._set_activity(victim, "")

    async def _unload(self, slot: _Slot, reason: str) -> None:
        engine, slot.engine, slot.asleep = slot.engine, None, False
        self._set_activity(slot, "unloading", reason)
        if engine is not None:
            self._stopping.append(engine)
        try:
            if engine is not None:
                started = self._clock()
                await engine.shutdown()
                self.events.unloaded(slot.card.key, self._clock() - started)
        except asyncio.CancelledError:
            # Stopped half way (the app is closing): `close` finishes the job.
            need = self._need(slot)
            if engine is not None and need is not None:
                self._dead.append(_Dead(slot.card.key, need, slot.devices, engine))
            raise
        except Exception:
            log.exception("shutting %s down failed", slot.card.key)
        finally:
            if engine is not None:
                self._stopping.remove(engine)
            slot.draining = slot.aborting = False
            slot.drain_deadline = None
            self._set_activity(slot, "")

    async def _bury(self, dead: _Dead) -> None:
        self._stopping.append(dead.engine)
        try:
            await dead.engine.shutdown()
        except asyncio.CancelledError:
            self._dead.append(dead)
            raise
        except Exception:
            log.exception("cleaning up the stopped engine of %s failed", dead.key)
        finally:
            self._stopping.remove(dead.engine)

    def _mark_failed(self, slot: _Slot, engine: Engine, reason: str) -> None:
        """The engine died: the model is failed until the next request rebuilds it; the dead
        engine keeps its memory counted until the coordinator has cleaned it up."""
        if slot.engine is not engine:
            return
        need = self._need(slot)
        slot.engine, slot.asleep, slot.reason = None, False, reason
        if need is not None and engine.resident:
            self._dead.append(_Dead(slot.card.key, need, slot.devices, engine))
        else:
            self._dead.append(_Dead(slot.card.key, MemoryNeed(0, 0, 0), (), engine))
        self._publish(slot)
        self._kick()
