"""Admission: each request's ticket, the one line of requests that wait, and leases.

A request for a model that is awake and admitting gets a lease at once. Otherwise its ticket
waits in one line, in arrival order, until the coordinator (`app.engines.coordinator`) has the
model's engine ready; then every ticket waiting for that model is granted together. A lease
holds the engine from the grant until the answer ends, and only engines without leases are
evicted, so an engine built for waiting requests always serves them. Each release tells the
coordinator to look again (an engine without leases may now be evicted or reaped).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from app.engines.base import Engine
from app.engines.slots import Slot


@dataclass(eq=False)
class Ticket:
    """One request's place in line, then its lease on the engine."""

    slot: Slot
    arrived: float
    granted: asyncio.Event = field(default_factory=asyncio.Event)
    engine: Engine | None = None
    error: str | None = None


def admitting(slot: Slot) -> bool:
    """Whether a new request for the model may start now: awake, and nothing is changing its
    residency, draining it for another model's turn, or aborting its answers."""
    return (
        slot.engine is not None
        and not slot.asleep
        and not slot.activity
        and not slot.draining
        and not slot.aborting
    )


class Admission:
    """The line (shared with the status board, which shows who waits) and the leases."""

    def __init__(
        self,
        line: list[Ticket],
        clock: Callable[[], float],
        publish: Callable[[Slot], None],
        kick: Callable[[], None],
    ) -> None:
        self.line = line
        self._clock = clock
        self._publish = publish
        self._kick = kick

    def waiting_keys(self) -> set[str]:
        """The models that requests wait in line for."""
        return {ticket.slot.card.key for ticket in self.line}

    def admit(self, ticket: Ticket) -> bool:
        """Grants a lease at once where the model is awake and admitting."""
        if not admitting(ticket.slot):
            return False
        self.grant(ticket)
        return True

    def grant(self, ticket: Ticket) -> None:
        ticket.slot.leases += 1
        ticket.engine = ticket.slot.engine
        ticket.granted.set()

    def enqueue(self, ticket: Ticket) -> None:
        """Puts the ticket in line by its arrival (a ticket sent back keeps its place)."""
        ticket.granted.clear()
        ticket.engine = None
        position = next((i for i, t in enumerate(self.line) if t.arrived > ticket.arrived), len(self.line))
        self.line.insert(position, ticket)
        self._publish(ticket.slot)
        self._kick()

    def release(self, ticket: Ticket) -> None:
        """Gives the ticket's lease back, if it holds one."""
        if ticket.engine is not None:
            ticket.slot.leases -= 1
            ticket.slot.last_used = self._clock()
            ticket.engine = None
            self._kick()

    def leave(self, ticket: Ticket) -> None:
        """The request is over (answered, stopped or refused): out of line, lease given back."""
        if ticket in self.line:
            self.line.remove(ticket)
            self._publish(ticket.slot)
        self.release(ticket)

    def fail(self, ticket: Ticket, reason: str) -> None:
        """Ends the ticket's wait with `reason`, which its request raises for the user."""
        if ticket in self.line:
            self.line.remove(ticket)
        ticket.error = reason
        ticket.granted.set()

    def fail_for(self, slot: Slot, reason: str) -> None:
        """Fails every ticket that waits for `slot`'s model."""
        for ticket in [t for t in self.line if t.slot is slot]:
            self.fail(ticket, reason)

    def grant_waiting(self) -> None:
        """Grants every waiting ticket whose model admits now."""
        for ticket in list(self.line):
            if admitting(ticket.slot):
                self.line.remove(ticket)
                self.grant(ticket)
                self._publish(ticket.slot)
