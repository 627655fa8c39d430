"""What the engine manager knows of one model (`Slot`): its engine and where it lives, what the
coordinator is doing to it, its leases and the answers under way. Admission, the lifecycle,
the coordinator and the status board all read and change these records; the manager holds one
per card, keyed by the card's key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from app.catalog.cards import ModelCard
from app.engines.base import Engine, EngineError
from app.engines.memory import MemoryNeed


@dataclass(eq=False)
class Slot:
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


def slot_of(slots: Mapping[str, Slot], key: str) -> Slot:
    """The model's slot; a key the catalog does not have is the user's error, said as such."""
    try:
        return slots[key]
    except KeyError:
        raise EngineError(f"There is no model {key!r} in this app's catalog.") from None
