"""Changes of residency, carried out one at a time on the coordinator's orders: build or wake
a model's engine (`load`), sleep or unload an engine nobody uses to make room (`evict`), shut
one down (`unload`), clean up engines that died (`bury`, after `mark_failed`). Also what the
scheduler's policy sees of all this: each model's memory need, the machine's capacity, and the
residents (`app.engines.scheduler.Resident`).

A model's residency goes: not loaded -> loading -> awake -> (draining ->) asleep or unloading
-> not loaded; a wake that fails rebuilds, a build that fails leaves the model failed (with a
reason) and fails the requests waiting for it. An engine that died, or whose shutdown was cut
short by `close`, keeps its memory counted (`Dead`) until it is buried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from app.config import Settings
from app.engines.admission import Admission
from app.engines.base import Engine, EngineEvents, EngineFactory, failure_reason
from app.engines.memory import GIB, MemoryNeed
from app.engines.scheduler import Capacity, Phase, Resident, host_evictions
from app.engines.slots import Slot
from app.engines.status import StatusBoard

# The manager's logger, as before it was split into modules: the log lines stay the same.
log = logging.getLogger("app.engines.manager")


@dataclass(eq=False)
class Dead:
    """An engine that died: it holds its memory until the coordinator has shut it down."""

    key: str
    need: MemoryNeed
    devices: tuple[int, ...]
    engine: Engine


class Lifecycle:
    """Every model's engine from build to shutdown, and the engines being stopped or dead."""

    def __init__(
        self,
        slots: Mapping[str, Slot],
        settings: Settings,
        factory: EngineFactory,
        clock: Callable[[], float],
        # Read at each use: the app sets `EngineManager.events` after building the manager.
        events: Callable[[], EngineEvents],
        board: StatusBoard,
        admission: Admission,
        kick: Callable[[], None],
    ) -> None:
        self._slots = slots
        self._settings = settings
        self._factory = factory
        self._clock = clock
        self._events = events
        self._board = board
        self._admission = admission
        self._kick = kick
        self._capacity: Capacity | None = None
        self.dead: list[Dead] = []
        self.stopping: list[Engine] = []

    # --- what the policy sees ------------------------------------------------------------------

    def need(self, slot: Slot) -> MemoryNeed | None:
        """The model's memory here; None for a remote server. Asked of the factory until it is
        read from the model's files (a guess is asked again: the files may have come since) and
        kept from then on; once the engine is built, what it really took."""
        if self._is_remote(slot):
            return None
        if slot.need is None or (not slot.need.from_files and slot.engine is None):
            slot.need = self._factory.memory_need(slot.card)
        return slot.need

    def _book_measured(self, slot: Slot) -> None:
        """Books what the new engine took, measured, instead of the estimate it was placed by;
        never less than the part of the estimate read from the model's files (its weights and
        KV cache), which a measure cut short by memory settling elsewhere could undercut."""
        need = self.need(slot)
        taken = getattr(slot.engine, "footprint_bytes", None)
        if need is None or not taken or self.stopping or self.dead:
            # Another engine's memory was on its way out during the build: the measure is short.
            return
        floor = math.ceil(need.weights_bytes / need.devices) + need.kv_per_device if need.from_files else 0
        if abs(taken - need.estimated_per_device) > need.estimated_per_device // 10:
            log.info(
                "%s took %.1f GiB per GPU, estimated %.1f GiB (weights from %s, KV cache from %s)",
                slot.card.key,
                taken / GIB,
                need.estimated_per_device / GIB,
                need.weights_from,
                need.kv_from,
            )
        slot.need = need.measured(max(taken, floor))

    def _is_remote(self, slot: Slot) -> bool:
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
            if slot.engine is None and not slot.activity:
                continue  # holds nothing (asked first: sizing a model reads its files)
            need = self.need(slot)
            if need is None:
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
                    slot.draining,
                )
            )
        residents += [Resident(f"{d.key} (stopped)", d.need, d.devices, Phase.BUSY) for d in self.dead]
        return residents

    def held(self) -> list[Engine]:
        """The engines being stopped or dead and not yet cleaned up (none of them in a slot)."""
        return [*self.stopping, *(d.engine for d in self.dead)]

    # --- changes of residency ------------------------------------------------------------------

    async def load(self, slot: Slot, devices: tuple[int, ...]) -> None:
        """Wakes or builds `slot`'s engine, then grants every request waiting for it."""
        board = self._board
        started = self._clock()
        slot.reason = ""
        if slot.engine is None:
            slot.devices = devices
        waking = slot.engine is not None and slot.asleep
        woke = False
        board.set_activity(slot, "loading", "waking from sleep" if waking else "starting")
        try:
            if waking and slot.engine is not None:
                try:
                    await slot.engine.wake()
                    slot.asleep, woke = False, True
                except Exception:
                    log.exception("waking %s failed; rebuilding it", slot.card.key)
                    board.set_phase(slot, "waking failed; rebuilding")
                    engine, slot.engine, slot.asleep = slot.engine, None, False
                    with contextlib.suppress(Exception):
                        await engine.shutdown()
            if slot.engine is None:
                slot.engine = await self._factory.build(
                    slot.card, lambda phase: board.set_phase(slot, phase), slot.devices
                )
                slot.asleep = False
                try:
                    self._book_measured(slot)
                except Exception:  # the booking must never cost the engine just built
                    log.exception("booking what %s took failed; its estimate stays", slot.card.key)
            now = self._clock()
            slot.last_build_s = now - started
            self._events().loaded(slot.card.key, now - started, woke)
            slot.ready_since = slot.last_used = now
            slot.draining = slot.aborting = False
            slot.drain_deadline = None
        except asyncio.CancelledError:
            board.set_activity(slot, "")
            raise
        except Exception as error:
            log.exception("loading %s failed", slot.card.key)
            self._events().load_failed(slot.card.key)
            # Asked again next time: a figure read during a failed download may be partial.
            slot.engine, slot.asleep, slot.need = None, False, None
            slot.reason = failure_reason(slot.card, error)
            board.set_activity(slot, "")
            self._admission.fail_for(slot, slot.reason)
            board.publish(slot)
            return
        board.set_activity(slot, "")
        self._admission.grant_waiting()

    async def evict(self, victim: Slot, sleep: bool, newcomer: Slot) -> None:
        """Sleeps or unloads an engine nobody uses, to make room for `newcomer`."""
        # Neither phase names the other model (`Coordinator._describe_line`); the log does.
        log.info("unloading %s to make room for %s", victim.card.key, newcomer.card.key)
        self._board.set_activity(victim, "unloading", "making room for another model")
        self._board.set_phase(newcomer, "unloading another model to make room")
        try:
            need = self.need(victim)
            if sleep and need is not None:
                # A sleeper's weights go to host memory: least recently used sleepers give way,
                # and where the host budget cannot hold it at all the victim is unloaded instead.
                out = host_evictions(self.residents(), need.asleep_host, self.capacity().host_budget)
                for key in out or ():
                    await self.unload(self._slots[key], f"host memory needed for {victim.card.display_name}")
                sleep = out is not None
            engine = victim.engine
            if sleep and engine is not None:
                try:
                    started = self._clock()
                    await engine.sleep()
                    victim.asleep = True
                    self._events().slept(victim.card.key, self._clock() - started)
                except Exception:
                    log.exception("putting %s to sleep failed; shutting it down", victim.card.key)
                    sleep = False
            if not sleep:
                await self.unload(victim, "made room for another model")
        finally:
            victim.draining = victim.aborting = False
            victim.drain_deadline = None
            self._board.set_activity(victim, "")

    async def unload(self, slot: Slot, reason: str) -> None:
        """Shuts the model's engine down (the engine counts as held until it is gone)."""
        need = self.need(slot)  # as booked while it ran (asked again once the engine is gone)
        engine, slot.engine, slot.asleep = slot.engine, None, False
        self._board.set_activity(slot, "unloading", reason)
        if engine is not None:
            self.stopping.append(engine)
        try:
            if engine is not None:
                started = self._clock()
                await engine.shutdown()
                self._events().unloaded(slot.card.key, self._clock() - started)
        except asyncio.CancelledError:
            # Stopped half way (the app is closing): `close` finishes the job.
            if engine is not None and need is not None:
                self.dead.append(Dead(slot.card.key, need, slot.devices, engine))
            raise
        except Exception:
            log.exception("shutting %s down failed", slot.card.key)
        finally:
            if engine is not None:
                self.stopping.remove(engine)
            slot.draining = slot.aborting = False
            slot.drain_deadline = None
            self._board.set_activity(slot, "")

    async def bury(self, dead: Dead) -> None:
        """Shuts a dead engine down; cut short, it stays dead for the next try."""
        self.stopping.append(dead.engine)
        try:
            await dead.engine.shutdown()
        except asyncio.CancelledError:
            self.dead.append(dead)
            raise
        except Exception:
            log.exception("cleaning up the stopped engine of %s failed", dead.key)
        finally:
            self.stopping.remove(dead.engine)

    def mark_failed(self, slot: Slot, engine: Engine, reason: str) -> None:
        """The engine died: the model is failed until the next request rebuilds it; the dead
        engine keeps its memory counted until the coordinator has cleaned it up."""
        if slot.engine is not engine:
            return
        need = self.need(slot)
        slot.engine, slot.asleep, slot.reason = None, False, reason
        if need is not None and engine.resident:
            self.dead.append(Dead(slot.card.key, need, slot.devices, engine))
        else:
            self.dead.append(Dead(slot.card.key, MemoryNeed(0, 0, 0), (), engine))
        self._board.publish(slot)
        self._kick()
