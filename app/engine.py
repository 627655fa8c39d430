"""The engine manager: builds engines lazily, streams answers, swaps models within a budget.

One `EngineManager` owns every model's lifecycle. It is given the cards, the settings and an
engine factory (`app.vllm_engine.VllmEngineFactory` in the app; anything with the same shape in
tests), and it never imports vLLM or torch itself. Generation is not serialised: each stream
goes straight to its engine, which batches concurrent requests. Only changes of residency
(build, wake, sleep, unload) take turns, under one lock.

All methods run on one asyncio event loop (the app's).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from app.cards import ModelCard
from app.config import Settings

log = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """An answer or a build that failed; the message is meant for the user."""


class EngineFailure(EngineError):
    """The engine itself broke (its process died): the model is marked failed and rebuilt."""


class ModelState(StrEnum):
    NOT_LOADED = "not loaded"
    QUEUED = "queued"
    LOADING = "loading"
    READY = "ready"
    SLEEPING = "sleeping"
    UNLOADING = "unloading"
    FAILED = "failed"


@dataclass(frozen=True)
class ModelStatus:
    """What the UI shows about one model."""

    key: str
    state: ModelState
    phase: str = ""
    elapsed_s: float | None = None
    # How long the last build of this model took, where known.
    estimate_s: float | None = None
    reason: str = ""
    in_flight: int = 0

    def describe(self) -> str:
        text = self.state.value
        if self.phase:
            text += f": {self.phase}"
        if self.state in (ModelState.LOADING, ModelState.QUEUED) and self.elapsed_s is not None:
            text += f" ({self.elapsed_s:.0f} s"
            text += f" of about {self.estimate_s:.0f} s)" if self.estimate_s else ")"
        if self.reason:
            text += f": {self.reason}"
        return text


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    # Fixed-length answers, for benchmarks and tests on random weights.
    ignore_eos: bool = False


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class StreamEnd:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    # The prompt as the engine saw it (for a remote engine: the chat messages, media elided).
    prompt: str = ""


StreamEvent = ModelStatus | TextDelta | StreamEnd


class Engine(Protocol):
    """One model being served: an in-process vLLM engine or a remote server."""

    @property
    def resident(self) -> bool:
        """Whether it holds this machine's memory (counts against the budget)."""
        ...

    @property
    def can_sleep(self) -> bool:
        """Whether it can be put to sleep (weights to host memory) instead of shut down."""
        ...

    def generate(
        self, card: ModelCard, messages: Sequence[dict[str, Any]], sampling: SamplingSettings, request_id: str
    ) -> AsyncIterator[TextDelta | StreamEnd]: ...

    async def abort(self, request_id: str) -> None: ...

    def unfinished_requests(self) -> int: ...

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...

    async def shutdown(self) -> None:
        """Stops the engine and returns once its memory is back."""
        ...


class EngineFactory(Protocol):
    async def build(self, card: ModelCard, report: Callable[[str], None]) -> Engine:
        """Builds the engine for `card`, calling `report` with each phase of the build."""
        ...


@dataclass(eq=False)
class _Slot:
    card: ModelCard
    state: ModelState = ModelState.NOT_LOADED
    phase: str = ""
    reason: str = ""
    since: float = 0.0
    engine: Engine | None = None
    load: asyncio.Task[None] | None = None
    in_flight: set[str] = field(default_factory=set)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float = 0.0
    last_build_s: float | None = None


class EngineManager:
    """Every model's engine: built on first use, shared by all users, swapped within a budget."""

    def __init__(
        self,
        cards: Mapping[str, ModelCard],
        settings: Settings,
        factory: EngineFactory,
        clock: Callable[[], float] = time.monotonic,
        progress_interval_s: float = 0.5,
    ) -> None:
        self._slots = {key: _Slot(card) for key, card in cards.items()}
        for slot in self._slots.values():
            slot.idle.set()
        self._settings = settings
        self._factory = factory
        self._clock = clock
        self._progress_interval_s = progress_interval_s
        self._residency = asyncio.Lock()
        self._listeners: list[Callable[[ModelStatus], None]] = []
        self._request_ids = itertools.count()
        self._idle_watch: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    # --- what the UI reads -----------------------------------------------------------------

    @property
    def cards(self) -> dict[str, ModelCard]:
        return {key: slot.card for key, slot in self._slots.items()}

    def status(self, key: str) -> ModelStatus:
        slot = self._slot(key)
        busy = slot.state in (ModelState.QUEUED, ModelState.LOADING, ModelState.UNLOADING)
        return ModelStatus(
            key=key,
            state=slot.state,
            phase=slot.phase,
            elapsed_s=self._clock() - slot.since if busy else None,
            estimate_s=slot.last_build_s,
            reason=slot.reason,
            in_flight=len(slot.in_flight),
        )

    def subscribe(self, listener: Callable[[ModelStatus], None]) -> Callable[[], None]:
        """Calls `listener` on every change of any model's state or build phase."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def unfinished_requests(self, key: str) -> int:
        """Requests the model's engine still holds (0 when it is not loaded)."""
        engine = self._slot(key).engine
        return engine.unfinished_requests() if engine is not None else 0

    # --- the core call ---------------------------------------------------------------------

    async def stream(
        self, key: str, messages: Sequence[dict[str, Any]], sampling: SamplingSettings | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Answers the conversation with model `key`: status updates while its engine is not
        ready (the last one `READY` once it is), then text deltas as the engine produces them,
        then one `StreamEnd`.

        Closing the generator (a stop button, a closed tab) aborts the request in the engine.
        Raises `EngineError` (or the adapters' `PromptError`) with a message for the user.
        """
        slot = self._slot(key)
        self._watch_idle_engines()
        waited = False
        while not (slot.state is ModelState.READY and slot.engine is not None):
            load = self._start_load(slot)
            while not load.done():
                waited = True
                yield self.status(key)
                await asyncio.wait({load}, timeout=self._progress_interval_s)
            if slot.state is ModelState.FAILED:
                raise EngineError(slot.reason)
        if waited:
            # Marks the moment the wait ended, so that time to first token excludes the load.
            yield self.status(key)
        engine = slot.engine
        request_id = f"{key}-{next(self._request_ids)}"
        slot.in_flight.add(request_id)
        slot.idle.clear()
        try:
            async for event in engine.generate(
                slot.card, messages, sampling or SamplingSettings(), request_id
            ):
                yield event
        except EngineFailure as failure:
            self._mark_failed(slot, engine, str(failure))
            raise
        finally:
            slot.in_flight.discard(request_id)
            slot.last_used = self._clock()
            if not slot.in_flight:
                slot.idle.set()

    async def close(self) -> None:
        """Shuts every engine down (the app is stopping)."""
        if self._idle_watch is not None:
            self._idle_watch.cancel()
        for slot in self._slots.values():
            if slot.load is not None:
                slot.load.cancel()
        async with self._residency:
            for slot in self._slots.values():
                if slot.engine is not None:
                    await self._unload(slot, reason="the app is stopping")
        await asyncio.gather(*self._background, return_exceptions=True)

    # --- lifecycle -------------------------------------------------------------------------

    def _slot(self, key: str) -> _Slot:
        try:
            return self._slots[key]
        except KeyError:
            raise EngineError(f"There is no model {key!r} in this app's catalog.") from None

    def _set(self, slot: _Slot, state: ModelState, phase: str = "", reason: str = "") -> None:
        if state is not slot.state:
            slot.since = self._clock()
        slot.state, slot.phase, slot.reason = state, phase, reason
        self._publish(slot)

    def _set_phase(self, slot: _Slot, phase: str) -> None:
        slot.phase = phase
        self._publish(slot)

    def _publish(self, slot: _Slot) -> None:
        status = self.status(slot.card.key)
        for listener in list(self._listeners):
            try:
                listener(status)
            except Exception:
                log.exception("a status listener failed")

    def _start_load(self, slot: _Slot) -> asyncio.Task[None]:
        """The model's load in progress, or a new one: simultaneous requests share one build."""
        if slot.load is None:
            if slot.state in (ModelState.NOT_LOADED, ModelState.FAILED, ModelState.SLEEPING):
                self._set(slot, ModelState.QUEUED, "waiting for its turn to load")
            slot.load = asyncio.create_task(self._load(slot))
        return slot.load

    async def _load(self, slot: _Slot) -> None:
        try:
            async with self._residency:
                started = self._clock()
                await self._make_room(slot)
                if slot.engine is not None and slot.state is not ModelState.READY:
                    self._set(slot, ModelState.LOADING, "waking from sleep")
                    await slot.engine.wake()
                elif slot.engine is None:
                    self._set(slot, ModelState.LOADING, "starting")
                    slot.engine = await self._factory.build(slot.card, lambda p: self._set_phase(slot, p))
                slot.last_build_s = self._clock() - started
                slot.last_used = self._clock()
                self._set(slot, ModelState.READY)
        except asyncio.CancelledError:
            self._set(slot, ModelState.NOT_LOADED)
            raise
        except Exception as error:
            log.exception("loading %s failed", slot.card.key)
            self._set(slot, ModelState.FAILED, reason=failure_reason(slot.card, error))
        finally:
            slot.load = None

    def _resident(self, besides: _Slot) -> list[_Slot]:
        return [
            s
            for s in self._slots.values()
            if s is not besides and s.engine is not None and s.engine.resident and s.state is ModelState.READY
        ]

    async def _make_room(self, slot: _Slot) -> None:
        """Evicts least recently used engines (idle ones first) until `slot` fits."""
        if slot.card.remote_url or slot.card.key in self._settings.remote_engines:
            return
        while len(resident := self._resident(slot)) >= self._settings.max_resident:
            victim = min(resident, key=lambda s: (bool(s.in_flight), s.last_used))
            await self._evict(victim, slot)

    async def _evict(self, victim: _Slot, newcomer: _Slot) -> None:
        name = newcomer.card.display_name
        self._set(victim, ModelState.UNLOADING, f"making room for {name}")
        if victim.in_flight:
            self._set_phase(
                newcomer,
                f"waiting for {len(victim.in_flight)} answer(s) on {victim.card.display_name} to finish",
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(victim.idle.wait(), self._settings.drain_timeout_s)
            if victim.in_flight and victim.engine is not None:
                # Past the drain time the answers are stopped; each stream ends with "abort".
                for request_id in list(victim.in_flight):
                    await victim.engine.abort(request_id)
                await victim.idle.wait()
        self._set_phase(newcomer, f"unloading {victim.card.display_name}")
        engine = victim.engine
        if engine is not None and engine.can_sleep:
            await engine.sleep()
            self._set(victim, ModelState.SLEEPING)
        else:
            await self._unload(victim, reason=f"made room for {name}")

    async def _unload(self, slot: _Slot, reason: str) -> None:
        engine, slot.engine = slot.engine, None
        self._set(slot, ModelState.UNLOADING, reason)
        try:
            if engine is not None:
                await engine.shutdown()
        finally:
            self._set(slot, ModelState.QUEUED if slot.load else ModelState.NOT_LOADED)

    def _mark_failed(self, slot: _Slot, engine: Engine, reason: str) -> None:
        """The engine died: the model is failed until the next request rebuilds it; the dead
        engine is cleaned up before anything else loads."""
        if slot.engine is not engine:
            return
        slot.engine = None
        self._set(slot, ModelState.FAILED, reason=reason)

        async def discard() -> None:
            async with self._residency:
                with contextlib.suppress(Exception):
                    await engine.shutdown()

        self._spawn(discard())

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _watch_idle_engines(self) -> None:
        if self._idle_watch is None and self._settings.idle_unload_s > 0:
            self._idle_watch = asyncio.create_task(self._unload_idle_engines())

    async def _unload_idle_engines(self) -> None:
        period = min(30.0, max(0.1, self._settings.idle_unload_s / 4))
        while True:
            await asyncio.sleep(period)
            cutoff = self._clock() - self._settings.idle_unload_s
            for slot in self._slots.values():
                idle = slot.state is ModelState.READY and not slot.in_flight and slot.last_used < cutoff
                if idle and slot.engine is not None and slot.load is None and not self._residency.locked():
                    async with self._residency:
                        await self._unload(slot, reason="unused for a while")


def first_line(error: BaseException) -> str:
    """An error's first line, or its type's name when it has no message."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def failure_reason(card: ModelCard, error: BaseException) -> str:
    """One line naming the model and the cause."""
    detail = first_line(error)
    if isinstance(error, EngineError):
        return detail
    return f"{card.display_name} could not be loaded: {detail[:300]}"
