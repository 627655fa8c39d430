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

This module is the facade; each job has its own module, sharing the models' records
(`app.engines.slots`):

- `app.engines.admission`: tickets, the line, leases (grant, release, fail);
- `app.engines.lifecycle`: build, wake, sleep, unload, clean up dead engines, and what the
  policy sees (memory needs, capacity, residents);
- `app.engines.coordinator`: the task that asks the policy and carries out its decisions,
  drains, and reaps idle engines;
- `app.engines.status`: each model's `ModelStatus` and the listeners told of its changes.

All methods run on one asyncio event loop (the app's).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from app.catalog.cards import ModelCard
from app.config import Settings
from app.engines.admission import Admission, Ticket
from app.engines.base import (
    Engine,
    EngineError,
    EngineEvents,
    EngineFactory,
    EngineFailure,
    ModelStatus,
    SamplingSettings,
    StreamEnd,
    StreamEvent,
    TextDelta,
)
from app.engines.coordinator import Coordinator
from app.engines.lifecycle import Lifecycle
from app.engines.scheduler import Capacity, Resident
from app.engines.slots import Slot, slot_of
from app.engines.status import StatusBoard


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
        self._slots = {key: Slot(card) for key, card in cards.items()}
        self._clock = clock
        self._progress_interval_s = progress_interval_s
        self._request_ids = itertools.count()
        self._closing = False
        # Who is told of builds, sleeps, waits and answers (an operator's metrics).
        self.events: EngineEvents = events or EngineEvents()
        # The one line of waiting requests: admission keeps it, the status board shows it.
        line: list[Ticket] = []
        # Tells the coordinator to look again (a request waits, a lease ended, an engine died).
        wake = asyncio.Event()
        self._board = StatusBoard(self._slots, line, clock)
        self._admission = Admission(line, clock, self._board.publish, wake.set)
        self._lifecycle = Lifecycle(
            self._slots, settings, factory, clock, lambda: self.events, self._board, self._admission, wake.set
        )
        self._coordinator = Coordinator(
            self._slots, settings, clock, wake, self._board, self._admission, self._lifecycle
        )

    # --- what the UI reads -----------------------------------------------------------------

    @property
    def cards(self) -> dict[str, ModelCard]:
        return {key: slot.card for key, slot in self._slots.items()}

    def status(self, key: str) -> ModelStatus:
        return self._board.status(key)

    def subscribe(self, listener: Callable[[ModelStatus], None]) -> Callable[[], None]:
        """Calls `listener` on every change of any model's state or phase."""
        return self._board.subscribe(listener)

    def unfinished_requests(self, key: str) -> int:
        """Requests the model's engine still holds (0 when it is not loaded)."""
        engine = slot_of(self._slots, key).engine
        return engine.unfinished_requests() if engine is not None else 0

    def waiting_models(self) -> set[str]:
        """The models that requests wait in line for now (a grid run gives way to them)."""
        return self._admission.waiting_keys()

    def engines(self) -> dict[str, tuple[Engine, tuple[int, ...], bool]]:
        """Every engine that serves or sleeps now, with its devices and whether it sleeps."""
        return {k: (s.engine, s.devices, s.asleep) for k, s in self._slots.items() if s.engine is not None}

    def engines_held(self) -> list[Engine]:
        """Every engine the manager still holds: serving, asleep, being stopped, or dead and
        not yet cleaned up (what must be gone after `close`)."""
        return [s.engine for s in self._slots.values() if s.engine is not None] + self._lifecycle.held()

    # --- what the policy sees ----------------------------------------------------------------

    def capacity(self) -> Capacity:
        return self._lifecycle.capacity()

    def residents(self) -> list[Resident]:
        """Every engine that holds memory here, as the policy sees it."""
        return self._lifecycle.residents()

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
        slot = slot_of(self._slots, key)
        if self._closing:
            raise EngineError("The app is stopping; try again in a moment.")
        # Refused before waiting in line: a value out of range is refused by every engine.
        sampling = (sampling or SamplingSettings()).for_card(slot.card)
        sampling.check()
        self._coordinator.ensure_running()
        admission = self._admission
        ticket = Ticket(slot, self._clock())
        waited = False
        try:
            while True:
                if not admission.admit(ticket):
                    admission.enqueue(ticket)
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
                admission.release(ticket)
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
                self._lifecycle.mark_failed(slot, engine, str(failure))
                raise
            finally:
                slot.in_flight.discard(request_id)
        finally:
            admission.leave(ticket)

    async def close(self) -> None:
        """Shuts every engine down (the app is stopping, or a test is done with them); the
        manager can be used again afterwards."""
        self._closing = True
        try:
            await self._coordinator.stop()
            for ticket in list(self._admission.line):
                self._admission.fail(ticket, "The app is stopping; try again in a moment.")
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
                    await self._lifecycle.unload(slot, "the app is stopping")
            lifecycle = self._lifecycle
            while lifecycle.dead:
                await lifecycle.bury(lifecycle.dead.pop())
        finally:
            self._closing = False
