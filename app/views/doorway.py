"""How much one client address may ask of the server at once, checked at the door (an ASGI
middleware in front of everything else).

Every answer past a client's allowance (`app.views.fairness`) is refused at once, but only when
its event's turn in Gradio's queue comes: a script sending faster than that filled the waiting
queue, and every other visitor's events were refused ("Queue is full"). Two limits hold it, on
every request that starts work (a POST: a send, an upload, an API call, a sign-in, an open tab's
model-state check):
- **Waiting** (requests joining the queue): past half a full queue an address may have at most
  `APP_WAITING_PER_ADDRESS` requests (a quarter of `APP_QUEUE_SIZE` by default) waiting in it,
  past three quarters none (`admits`). This is what keeps room in the queue for the others, also
  where it does not move (every answering slot busy, a model loading): a rate alone let a script
  within it fill a stalled queue. Many addresses at once still fill it, a place each.
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
/64. The door works it out once per request and keeps it in the request's scope (`CLIENT_KEY`),
where the queue's count and the handlers read it (`Identity.client_of`). An office behind one
address shares both limits. A flood from many addresses at once needs
a rate limit in front (a proxy's).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable

from app.views.guard import ASGIApp, Receive, Scope, Send, refuse
from app.views.identity import CLIENT_KEY, Identity, forwarded_for

TOO_FAST = "Too many requests from your address: wait a few seconds, then try again."
TOO_MANY_WAITING = (
    "Too many requests from your address are waiting for the server: wait for them, then try again."
)
# Buckets kept at most: past it the full ones go (a full bucket is the same as none), then the
# longest unused, down to nine tenths (so that the sweep runs once in many requests).
KEPT_BUCKETS = 10_000
# A client sending exactly at the rate is let in despite the float sums' rounding.
ROUNDING = 1e-9
# The client key of each request waiting in the queue (as the door kept it in the request's scope).
Waiting = Callable[[], Iterable[str]]
# The routes whose requests wait in Gradio's queue (the guard closes the others that could).
QUEUE_JOINS = ("/gradio_api/queue/join", "/gradio_api/call/")


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
    """Refuses a request that starts work from an address past its `RequestRate`, or a request
    joining the queue that `admits` refuses. An address's requests waiting are those in the queue
    (`waiting`: the client key the door gave each, kept in its scope) and those the door let in
    and has not yet answered (requests sent together all passed a count of the queue alone
    before any of them reached it)."""

    def __init__(
        self,
        app: ASGIApp,
        identity: Identity,
        per_minute: int,
        burst: int,
        waiting: Waiting,
        most_waiting: int,
        queue_size: int,
    ) -> None:
        self.app = app
        self.identity = identity
        self.rate = RequestRate(per_minute, burst)
        self.waiting = waiting
        self.most_waiting = most_waiting
        self.queue_size = queue_size
        self.passing: Counter[str] = Counter()  # queue joins let in and not yet answered, by address

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        forwarded = [v.decode("latin-1") for n, v in scope["headers"] if n == b"x-forwarded-for"]
        address = self.identity.address((scope.get("client") or (None,))[0], forwarded_for(forwarded))
        scope[CLIENT_KEY] = address
        if not self.rate.take(address):
            await refuse(send, 429, TOO_FAST, retry_after_s=self.rate.wait_s(address))
            return
        # A share of the whole queue or more: the operator set no share (a test bench of one address).
        if not scope["path"].startswith(QUEUE_JOINS) or self.most_waiting >= self.queue_size:
            await self.app(scope, receive, send)
            return
        queued = Counter(self.waiting())
        mine = queued[address] + self.passing[address]
        if not admits(mine, queued.total() + self.passing.total(), self.queue_size, self.most_waiting):
            await refuse(send, 429, TOO_MANY_WAITING, retry_after_s=1)
            return
        # Counted until its response ends: a join's ends once its event is in the queue (where it
        # is counted then, so briefly twice: on the safe side).
        self.passing[address] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.passing[address] -= 1
            if not self.passing[address]:
                del self.passing[address]


def admits(mine: int, taken: int, queue_size: int, most: int) -> bool:
    """Whether a request joins the queue, with `mine` of its address's and `taken` of all
    waiting. While the queue is under half full, any does (a tab's held-back checks come 15 to
    30 at once, and are answered at once); past half, an address with `most` waiting no more;
    past three quarters, only an address with none waiting, so that a few addresses cannot
    fill it between them either."""
    if taken >= queue_size * 3 // 4:
        return mine == 0
    if taken >= queue_size // 2:
        return mine < most
    return True


def most_waiting(queue_size: int) -> int:
    """How many of the queue's places one address may hold: a quarter (at least one)."""
    return max(1, queue_size // 4)
