"""How much one client address may ask of the server at once, checked at the door (an ASGI
middleware in front of everything else).

Every answer past a client's allowance (`app.views.fairness`) is refused at once, but only when
its event's turn in Gradio's queue comes: a script sending faster than that filled the waiting
queue, and every other visitor's events were refused ("Queue is full"). Two limits hold it, on
every request that starts work (a POST: a send, an upload, an API call, a sign-in, an open tab's
model-state check):
- **Waiting**: an address may have at most `APP_WAITING_PER_ADDRESS` requests (a quarter of the
  queue, `APP_QUEUE_SIZE`, by default) waiting in it. This is what keeps the queue for the
  others, also where it does not move (every answering slot busy, a model loading): a rate alone
  let a script within it fill a stalled queue.
- **Rate**: a token bucket per address (`APP_REQUEST_BURST_PER_ADDRESS` at once, refilled at
  `APP_REQUESTS_PER_ADDRESS_PER_MINUTE`), so that one address cannot keep the server busy
  refusing it.
Past either, the request is refused before Gradio, in one line (429), which the page shows.

Measured in Chromium (2026-12-03): a page's load takes 5 requests, a send 3, and an open tab asks
for its model's state once a second (`STATUS_REFRESH_S`), 60 a minute; a page whose first load
waited sends the checks it held back at once (15 to 30 after a cold start). The defaults hold
about 20 open tabs at one address and a few tabs' cold starts at once.

The address is the one the answers' allowance and the arena count (`Identity.address`): the
connection's peer, or behind a trusted proxy the client it forwarded for; an IPv6 client by its
/64. An office behind one address shares both limits. A flood from many addresses at once needs
a rate limit in front (a proxy's).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from app.views.guard import ASGIApp, Receive, Scope, Send, refuse
from app.views.identity import Identity, forwarded_for

TOO_FAST = "Too many requests from your address: wait a few seconds, then try again."
TOO_MANY_WAITING = (
    "Too many requests from your address are waiting for the server: wait for them, then try again."
)
# Buckets kept at most: past it the full ones go (a full bucket is the same as none), then the
# longest unused, down to nine tenths (so that the sweep runs once in many requests).
KEPT_BUCKETS = 10_000
# A client sending exactly at the rate is let in despite the float sums' rounding.
ROUNDING = 1e-9
# A waiting request's client as Gradio's queue holds it: the peer and its X-Forwarded-For lines.
Waiting = Callable[[], Iterable[tuple[str | None, list[str]]]]


class RequestRate:
    """Token buckets by address. The server's event loop is its only user: no lock."""

    def __init__(self, per_minute: int, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_minute / 60
        self.burst = burst
        self.clock = clock
        # address -> (tokens, when counted), the least recently counted first
        self.buckets: dict[str, tuple[float, float]] = {}

    def take(self, address: str) -> bool:
        """Whether `address` may start one more request now (and if so, it is counted)."""
        now = self.clock()
        tokens, then = self.buckets.pop(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.per_second)
        taken = tokens >= 1 - ROUNDING
        if len(self.buckets) >= KEPT_BUCKETS:
            self._make_room(now)
        self.buckets[address] = (max(0.0, tokens - 1) if taken else tokens, now)
        return taken

    def wait_s(self, address: str) -> int:
        """Whole seconds until `address` may start a request again."""
        tokens, _ = self.buckets.get(address, (self.burst, 0.0))
        return max(1, math.ceil((1 - tokens) / self.per_second))

    def _make_room(self, now: float) -> None:
        for address, (tokens, then) in list(self.buckets.items()):
            if tokens + (now - then) * self.per_second >= self.burst:
                del self.buckets[address]
        if len(self.buckets) >= KEPT_BUCKETS:
            for address in list(self.buckets)[: len(self.buckets) - KEPT_BUCKETS * 9 // 10]:
                del self.buckets[address]


class Doorway:
    """Refuses a request that starts work from an address past its `RequestRate`, or with
    `most_waiting` requests waiting in the queue already (`waiting`: the queue's requests)."""

    def __init__(
        self,
        app: ASGIApp,
        identity: Identity,
        per_minute: int,
        burst: int,
        waiting: Waiting,
        most_waiting: int,
    ) -> None:
        self.app = app
        self.identity = identity
        self.rate = RequestRate(per_minute, burst)
        self.waiting = waiting
        self.most_waiting = most_waiting

    def address(self, peer: str | None, forwarded: list[str]) -> str:
        return self.identity.address(peer, forwarded_for(forwarded))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            forwarded = [v.decode("latin-1") for n, v in scope["headers"] if n == b"x-forwarded-for"]
            address = self.address((scope.get("client") or (None,))[0], forwarded)
            if not self.rate.take(address):
                await refuse(send, 429, TOO_FAST, retry_after_s=self.rate.wait_s(address))
                return
            if sum(self.address(*client) == address for client in self.waiting()) >= self.most_waiting:
                await refuse(send, 429, TOO_MANY_WAITING, retry_after_s=1)
                return
        await self.app(scope, receive, send)


def most_waiting(queue_size: int) -> int:
    """How many of the queue's places one address may hold: a quarter (at least one)."""
    return max(1, queue_size // 4)
