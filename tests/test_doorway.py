"""The door (`app.views.doorway`): how fast one client address may start work. The rate's rule
by hypothesis over random traffic, the middleware in front of a real ASGI app, the setting's
check at start. A flood on the real server: `test_api_sessions.py`."""

from __future__ import annotations

import secrets

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app.views import doorway
from app.views.doorway import TOO_FAST, TOO_MANY_WAITING, Doorway, RequestRate, admits, most_waiting
from app.views.identity import Identity, client_key, forwarded_for

PROXY = "10.9.9.9"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# Requests as (seconds since the one before, which of four addresses).
traffic = st.lists(st.tuples(st.floats(0, 3, allow_nan=False), st.integers(0, 3)), max_size=300)


@given(traffic, st.integers(1, 20), st.integers(1, 600))
def test_no_address_starts_more_than_its_burst_and_rate_in_any_stretch_of_time(
    requests: list[tuple[float, int]], burst: int, per_minute: int
):
    clock = Clock()
    rate = RequestRate(per_minute, burst, clock)
    taken: dict[int, list[float]] = {}
    for gap, address in requests:
        clock.now += gap
        if rate.take(f"198.51.100.{address}"):
            taken.setdefault(address, []).append(clock.now)
    for times in taken.values():
        for first in range(len(times)):
            for last in range(first, len(times)):
                stretch = times[last] - times[first]
                assert last - first + 1 <= burst + stretch * per_minute / 60 + 1e-6


@given(traffic, st.integers(1, 20), st.integers(1, 600))
def test_a_client_within_its_rate_is_never_refused_whatever_others_send(
    flood: list[tuple[float, int]], burst: int, per_minute: int
):
    """An address sending one request each 1/rate seconds (after its burst) always gets in, while
    the other addresses send anything at all."""
    clock = Clock()
    rate = RequestRate(per_minute, burst, clock)
    every = 60 / per_minute
    next_own = clock.now
    for gap, address in flood:
        clock.now += gap
        while next_own <= clock.now:
            saved, clock.now = clock.now, next_own
            assert rate.take("203.0.113.1"), clock.now
            clock.now, next_own = saved, next_own + every
        rate.take(f"198.51.100.{address}")


def test_the_buckets_kept_are_bounded_and_a_flooding_address_never_gets_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
):
    """Many addresses at once (a flood from many, or a made-up one per request behind a trusted
    proxy) keep at most `KEPT_BUCKETS`; the one flooding all along stays counted."""
    monkeypatch.setattr(doorway, "KEPT_BUCKETS", 50)
    clock = Clock()
    rate = RequestRate(per_minute=60, burst=3, clock=clock)
    taken = 0
    for number in range(2000):
        clock.now += 0.01
        rate.take(f"198.51.100.{number % 250}.{number}")
        taken += rate.take("203.0.113.1")
        assert len(rate.buckets) <= 50
    assert taken <= 3 + 20  # the burst and one a second over 20 s


def test_an_ipv6_client_is_counted_by_its_network_and_a_written_port_is_not_a_client():
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:192.0.2.7") == "192.0.2.7" == client_key("192.0.2.7")
    # Some proxies write the client's port: one client, whatever port it came from.
    assert client_key("192.0.2.7:5678") == "192.0.2.7" == client_key("192.0.2.7:5679")
    assert client_key("[2001:db8:1:2::1]:443") == "2001:db8:1:2::/64"
    assert client_key("unknown") == "unknown" and client_key(":80") == "unknown" == client_key("[]")
    assert (
        forwarded_for(["198.51.100.1", " ", "203.0.113.5, 10.9.9.9"]) == "198.51.100.1, 203.0.113.5, 10.9.9.9"
    )
    assert forwarded_for([]) is None


async def ok(_: Request) -> PlainTextResponse:
    return PlainTextResponse("taken")


WAITING: list[str] = []  # the client keys of the requests "in the queue"
JOIN = "/gradio_api/queue/join"


def client(peer: str, per_minute: int = 60, burst: int = 2, most: int = 100, queue: int = 8) -> TestClient:
    identity = Identity(secrets.token_bytes(32), trusted_proxies=(PROXY,))
    routes = [Route("/{rest:path}", ok, methods=["GET", "POST"])]
    door = Middleware(
        Doorway,
        identity=identity,
        per_minute=per_minute,
        burst=burst,
        waiting=lambda: WAITING,
        most_waiting=most,
        queue_size=queue,
    )
    return TestClient(Starlette(routes=routes, middleware=[door]), client=(peer, 50000))


def test_past_its_burst_an_address_is_refused_in_one_line_with_when_to_try_again():
    http = client("203.0.113.1")
    assert [http.post(JOIN).status_code for _ in range(2)] == [200, 200]
    refused = http.post(JOIN)
    assert refused.status_code == 429
    assert refused.json() == {"error": TOO_FAST} and "\n" not in TOO_FAST
    assert refused.headers["retry-after"] == "1"  # a request a second
    # Reading (the page, its files, the queue's stream) starts no work and is not counted.
    assert all(http.get("/gradio_api/queue/data").status_code == 200 for _ in range(10))


@given(st.integers(0, 70), st.integers(0, 70), st.integers(1, 64), st.integers(1, 20))
def test_the_queue_keeps_room_for_others_as_it_fills(mine: int, others: int, queue: int, most: int):
    taken = mine + others
    admitted = admits(mine, taken, queue, most)
    if taken < queue // 2:
        assert admitted  # an empty queue takes a tab's held-back checks at once
    if mine >= most and taken >= queue // 2:
        assert not admitted  # past half, no address past its share
    if taken >= queue * 3 // 4:
        assert admitted == (mine == 0)  # past three quarters, only addresses with none waiting


def test_an_address_holds_at_most_its_share_of_a_filling_queue_however_slowly_it_sends():
    """Within its rate, a client still filled a queue that did not move (every answering slot
    busy): its requests waiting count, as the door marked them, whichever way they came."""
    WAITING[:] = ["203.0.113.1", "203.0.113.1", "198.51.100.1", "198.51.100.2"]  # half of 8
    try:
        script = client("203.0.113.1", per_minute=6000, burst=100, most=2)
        refused = script.post(JOIN)
        assert refused.status_code == 429 and refused.json() == {"error": TOO_MANY_WAITING}
        through_proxy = client(PROXY, most=2).post(JOIN, headers={"x-forwarded-for": "203.0.113.1"})
        assert through_proxy.status_code == 429  # the same client, through the proxy
        assert (
            client(PROXY, most=2).post(JOIN, headers={"x-forwarded-for": "198.51.100.1"}).status_code == 200
        )
        assert script.post("/gradio_api/cancel").status_code == 200  # it may still stop its own
        WAITING[:] = ["198.51.100.1"] * 6  # three quarters: only an address with none waiting
        assert client("198.51.100.9", most=2).post(JOIN).status_code == 200
        assert client("198.51.100.1", most=7).post(JOIN).status_code == 429  # below its share, yet
        WAITING[:] = []  # answered: it may send again
        assert script.post(JOIN).status_code == 200
    finally:
        WAITING.clear()
    assert most_waiting(64) == 16 and most_waiting(3) == 1
    # A share of the whole queue: none (a test bench whose every page is one address).
    WAITING[:] = ["203.0.113.1"] * 7
    try:
        assert client("203.0.113.1", most=8, queue=8).post(JOIN).status_code == 200
    finally:
        WAITING.clear()


def test_a_forwarded_for_header_names_the_client_only_from_a_trusted_proxy():
    script = client("203.0.113.1")
    for number in range(2):
        assert script.post("/x", headers={"x-forwarded-for": f"198.51.100.{number}"}).status_code == 200
    # A made-up header from a client that is not the proxy gives it no fresh bucket.
    assert script.post("/x", headers={"x-forwarded-for": "198.51.100.9"}).status_code == 429
    proxy = client(PROXY)
    for number in range(3):  # behind the proxy, each visitor has a bucket of their own
        assert proxy.post("/x", headers={"x-forwarded-for": f"198.51.100.{number}"}).status_code == 200
        assert proxy.post("/x", headers={"x-forwarded-for": f"198.51.100.{number}"}).status_code == 200
    assert proxy.post("/x", headers={"x-forwarded-for": "198.51.100.0"}).status_code == 429
    # A client's own line before the proxy's is not believed, whichever line comes first.
    lines = [("x-forwarded-for", "198.51.100.77"), ("x-forwarded-for", "198.51.100.0")]
    assert proxy.post("/x", headers=lines).status_code == 429
