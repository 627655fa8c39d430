"""`/chat` and `/leaderboard` called by a script (no page) leave nothing behind in Gradio's
per-session store: each such call is a session of its own, and Gradio keeps a copy of the page's
configuration for every session (about 0.3 MB of memory for this page) until 10,000 sessions have
come, so the server grew by that much a call under API load (`bench/bench_visitors.py`)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from ports import free_port

from app.catalog.cards import load_cards, servable_cards
from app.config import Settings
from app.domain.sessions import Visit
from app.engines.base import Capacity, EngineError
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import History, sqlite_url
from app.views import Playground, build, launch
from app.views.doorway import TOO_MANY_WAITING
from app.views.page import PAGE_SESSIONS


def call(http: httpx.Client, name: str, data: list[Any]) -> str:
    posted = http.post(f"gradio_api/call/{name}", json={"data": data})
    assert posted.status_code == 200, posted.text
    with http.stream("GET", f"gradio_api/call/{name}/{posted.json()['event_id']}") as stream:
        return "".join(stream.iter_lines())


def test_api_calls_leave_no_session_state_behind(tmp_path: Path):
    settings = Settings(gpu_count=0, port=free_port(), arena=True)
    decoder = VideoDecoderPool(workers=1)
    manager = EngineManager(load_cards(), settings, VllmEngineFactory(settings))
    history = History(sqlite_url(tmp_path), tmp_path / "media")
    playground = Playground(manager, settings, decoder, history)
    demo = launch(build(playground), settings, block=False, quiet=True)
    try:
        holder = demo.server_app.state_holder
        before = len(holder.session_data)
        with httpx.Client(base_url=f"http://127.0.0.1:{settings.port}/", timeout=60) as http:
            # Refused before any engine starts (no model by that name), after Gradio made the session.
            message = {"text": "hi", "files": []}
            answers = [call(http, "chat", [message, "no-such-model", "", None, None, 8, 0]) for _ in range(5)]
            boards = [call(http, "leaderboard", ["all"]) for _ in range(3)]
        assert all("Pick a model" in answer for answer in answers), answers[0]
        assert all("event: complete" in board and '"rounds"' in board for board in boards), boards[0]
        assert len(holder.session_data) == before
        # Gradio keeps an emptied entry for each of them in its queue (2.7 KB a call): the
        # housekeeping drops the ones empty at two rounds in a row.
        pending = demo._queue.pending_event_ids_session
        assert sum(1 for ids in pending.values() if not ids) >= 8
        for _ in range(2):
            playground.housekeeping()
            time.sleep(0.2)  # the prune runs on the server's loop
        assert not any(not ids for ids in pending.values())
        # Page loads' sessions are kept, but no more than PAGE_SESSIONS of them (Gradio's default
        # was 10,000 copies of the page's configuration, about 3 GB).
        assert holder.capacity == PAGE_SESSIONS
    finally:
        demo.close()
        decoder.close()
        history.close()
    asyncio.run(manager.close())


def test_one_client_holds_only_its_own_allowance_of_answers_whatever_cookies_it_mints(tmp_path: Path):
    """A hostile script's 80 open `/chat` calls held every slot of the queue, and every other
    visitor's events were refused ("Queue is full"). A visitor may have `APP_ANSWERS_PER_VISITOR`
    answers running, and an address `APP_ANSWERS_PER_ADDRESS` (here 1 and 2, held by the test):
    a script that takes a fresh cookie for each call is a new visitor each time (a hostile review
    of the first version, which counted by cookie alone, ran five answers on an allowance of one
    so), but not a new address. Past either, refused at once, in one line."""
    settings = Settings(gpu_count=0, port=free_port(), answers_per_visitor=1, answers_per_address=2)
    decoder = VideoDecoderPool(workers=1)
    manager = EngineManager(load_cards(), settings, VllmEngineFactory(settings))
    playground = Playground(manager, settings, decoder, None)
    demo = launch(build(playground), settings, block=False, quiet=True)
    message = {"text": "hi", "files": []}
    url = f"http://127.0.0.1:{settings.port}/"

    def ask(http: httpx.Client) -> str:
        return call(http, "chat", [message, "no-such-model", "", None, None, 8, 0])

    try:
        with (
            httpx.Client(base_url=url, timeout=60) as kept,
            httpx.Client(base_url=url, timeout=60) as minting,
        ):
            kept.get("config")  # the server's cookie, kept from here on (as gradio_client does)
            visitor = playground.identity.verify(kept.cookies["vlm_visitor"])
            assert visitor is not None
            with playground.allowance.held(Visit(counted_as=visitor, address="127.0.0.1")):
                assert "You have 1 answer running" in ask(kept)
                minting.cookies.clear()  # a new visitor at this address: let through (refused
                assert "Pick a model" in ask(minting)  # only for the model it named)
                with playground.allowance.held(Visit(counted_as="another", address="127.0.0.1")):
                    for _ in range(3):
                        minting.cookies.clear()
                        minting.get("config")  # a fresh cookie for every call
                        refused = ask(minting)
                        assert "2 answers are running from your address" in refused, refused
                        assert "Traceback" not in refused
            # Released: the allowance is back, for both.
            assert "Pick a model" in ask(kept) and "Pick a model" in ask(minting)
            assert not playground.allowance.running
    finally:
        demo.close()
        decoder.close()
    asyncio.run(manager.close())


def test_a_flood_of_requests_from_one_address_leaves_the_queue_to_everyone_else(tmp_path: Path):
    """A script sending requests faster than the server refuses them (each a `/chat` call past
    its allowance, refused at once, but only once its event's turn in the queue comes) filled
    Gradio's waiting queue: other visitors' calls were refused ("Queue is full", 503). One
    address may start at most `APP_REQUEST_BURST_PER_ADDRESS` requests at once (POSTs: sends,
    uploads, API calls), and then `APP_REQUESTS_PER_ADDRESS_PER_MINUTE`; past that, refused at the
    door in one line (429), before Gradio. The addresses are told apart as behind a trusted proxy."""
    settings = Settings(
        gpu_count=0,
        port=free_port(),
        queue_size=8,
        concurrency=1,
        trusted_proxies=("127.0.0.1",),
        request_burst_per_address=4,
        requests_per_address_per_minute=120,
    )
    decoder = VideoDecoderPool(workers=1)
    manager = EngineManager(load_cards(), settings, VllmEngineFactory(settings))
    playground = Playground(manager, settings, decoder, None)
    demo = launch(build(playground), settings, block=False, quiet=True)
    url = f"http://127.0.0.1:{settings.port}/"
    body = {"data": [{"text": "hi", "files": []}, "no-such-model", "", None, None, 8, 0]}
    flooder, visitor = {"x-forwarded-for": "203.0.113.7"}, {"x-forwarded-for": "198.51.100.2"}

    async def flood(seconds: float) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits, headers=flooder) as http:
            deadline = time.monotonic() + seconds
            sent: list[httpx.Response] = []

            async def sender() -> None:
                while time.monotonic() < deadline:
                    sent.append(await http.post("gradio_api/call/chat", json=body))

            await asyncio.gather(*(sender() for _ in range(40)))
            return sent

    async def honest(calls: int) -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=60, headers=visitor) as http:
            statuses = []
            for _ in range(calls):
                await asyncio.sleep(0.5)  # within its own rate
                statuses.append((await http.post("gradio_api/call/chat", json=body)).status_code)
            return statuses

    async def both() -> tuple[list[httpx.Response], list[int]]:
        return await asyncio.gather(flood(3.0), honest(6))

    try:
        sent, statuses = asyncio.run(both())
        assert statuses == [200] * 6, statuses  # every one of the other visitor's calls queued
        taken = [response for response in sent if response.status_code == 200]
        refused = [response for response in sent if response.status_code == 429]
        # The burst, and two requests a second after it (3 s, with a second's slack).
        assert len(taken) <= 4 + 2 * 4, (len(taken), len(sent))
        assert len(taken) + len(refused) == len(sent), {response.status_code for response in sent}
        line = refused[0].json()["error"]
        assert "Too many requests from your address" in line and "\n" not in line, line
    finally:
        demo.close()
        decoder.close()
    asyncio.run(manager.close())


class StalledFactory:
    """Engines whose build does not end until `released` (a model loading for minutes on a busy
    GPU box; a simulation, no engine): the answer calling for one holds its slot meanwhile."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def capacity(self) -> Capacity:
        return Capacity((2**40,), host_budget=0)

    def memory_need(self, card: Any) -> None:
        return None

    async def build(self, card: Any, report: Any, devices: tuple[int, ...]) -> Any:
        report("starting the engine (stalled)")
        while not self.released.is_set():
            await asyncio.sleep(0.05)
        raise EngineError(f"{card.display_name} could not be loaded: the test let it go")


def test_one_address_cannot_fill_a_queue_that_does_not_move_however_it_sends(tmp_path: Path):
    """The rate alone did not hold where the queue stops moving (every answering slot busy, here
    one slot held by a model that is still loading): a script well within its rate filled the
    queue, and another visitor's call was refused ("Queue is full"). An address holds at most its
    share of a filling queue; past it, refused at the door in one line. The flood's calls are
    sent together: each passed a count of the queue alone before any of them was in it."""
    # A GPU box's catalog (the factory builds nothing).
    settings = Settings(
        gpu_count=1, port=free_port(), queue_size=8, concurrency=1, trusted_proxies=("127.0.0.1",)
    )
    factory = StalledFactory()
    cards = load_cards()
    manager = EngineManager(cards, settings, factory)
    decoder = VideoDecoderPool(workers=1)
    playground = Playground(manager, settings, decoder, None)
    demo = launch(build(playground), settings, block=False, quiet=True)
    model = next(iter(servable_cards(cards, gpu_count=1, allow_remote_code=False)))

    def post(http: httpx.Client, address: str) -> httpx.Response:
        body = {"data": [{"text": "hi", "files": []}, model, "", None, None, 8, 0]}
        return http.post("gradio_api/call/chat", json=body, headers={"x-forwarded-for": address})

    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{settings.port}/", timeout=60) as http:
            holding = post(http, "192.0.2.1")
            assert holding.status_code == 200
            poll(lambda: demo._queue.event_queue_per_concurrency_id and not len(demo._queue), 10)
            flood = asyncio.run(together(f"http://127.0.0.1:{settings.port}/", model, "203.0.113.7", 10))
            assert post(http, "198.51.100.2").status_code == 200  # the other visitor waits their turn
            # Half the queue while nothing else waits, then no more (`admits`).
            assert sorted(r.status_code for r in flood) == [200] * 4 + [429] * 6, [r.text for r in flood]
            assert {r.json().get("error") for r in flood if r.status_code == 429} == {TOO_MANY_WAITING}
            factory.released.set()
            with http.stream("GET", f"gradio_api/call/chat/{holding.json()['event_id']}") as stream:
                assert "could not be loaded" in "".join(stream.iter_lines())
    finally:
        factory.released.set()
        demo.close()
        decoder.close()
    asyncio.run(manager.close())


async def together(url: str, model: str, address: str, calls: int) -> list[httpx.Response]:
    body = {"data": [{"text": "hi", "files": []}, model, "", None, None, 8, 0]}
    headers = {"x-forwarded-for": address}
    async with httpx.AsyncClient(
        base_url=url, timeout=60, limits=httpx.Limits(max_connections=calls)
    ) as http:
        return await asyncio.gather(
            *(http.post("gradio_api/call/chat", json=body, headers=headers) for _ in range(calls))
        )


def poll(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not true in time"
        time.sleep(0.05)
