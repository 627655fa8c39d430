"""How fast one client address may start work, checked at the door (an ASGI middleware).

Every answer past a client's allowance (`app.views.fairness`) is refused at once, but only when
its event's turn in Gradio's queue comes: a script sending faster than that filled the waiting
queue, and every other visitor's events were refused ("Queue is full"). Here each request that
starts work (a POST: a send, an upload, an API call, a sign-in) draws on its address's bucket
(a token bucket: `burst` at once, refilled at `per_minute`), and past it is refused before Gradio
in one line (429). The burst stays below the queue's size (`Settings`), so one address cannot
fill it. Measured in Chromium (2026-12-03): a page's load takes 5 requests, a send 3, and an open
tab asks for its model's state once a second (`STATUS_REFRESH_S`), 60 a minute; a page whose
first load waited sends the checks it held back at once (15 to 30 after a cold start).

The address is the connection's peer, or behind a trusted proxy the client it forwarded for
(`Identity.address`): an office behind one address shares one bucket, as it shares the answers'
allowance. A flood from many addresses at once needs a rate limit in front (a proxy's).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable

from app.views.guard import ASGIApp, Receive, Scope, Send, refuse
from app.views.identity import Identity

REFUSED = "Too many requests from your address: wait a few seconds, then try again."
# Buckets kept at most: past it the full ones go (a full bucket is the same as none), then the
# longest unused (a flood from more addresses than this within a burst's refill is one for a
# proxy in front; an IPv6 client is counted by its /64, which it usually has whole).
KEPT_BUCKETS = 10_000
# A client sending exactly at the rate is let in despite the float sums' rounding.
ROUNDING = 1e-9


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
        while len(self.buckets) >= KEPT_BUCKETS:
            del self.buckets[next(iter(self.buckets))]


def client_key(address: str) -> str:
    """What one bucket counts: the address, or an IPv6 address's /64 network."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


class Doorway:
    """Refuses a client address's requests that start work past its `RequestRate`."""

    def __init__(self, app: ASGIApp, identity: Identity, per_minute: int, burst: int) -> None:
        self.app = app
        self.identity = identity
        self.rate = RequestRate(per_minute, burst)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = dict(scope["headers"])
            forwarded = headers.get(b"x-forwarded-for")
            peer = (scope.get("client") or (None,))[0]
            address = client_key(
                self.identity.address(peer, forwarded.decode("latin-1") if forwarded else None)
            )
            if not self.rate.take(address):
                await refuse(send, 429, REFUSED, retry_after_s=self.rate.wait_s(address))
                return
        await self.app(scope, receive, send)
