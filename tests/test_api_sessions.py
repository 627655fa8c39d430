"""`/chat` and `/leaderboard` called by a script (no page) leave nothing behind in Gradio's
per-session store: each such call is a session of its own, and Gradio keeps a copy of the page's
configuration for every session (about 0.3 MB of memory for this page) until 10,000 sessions have
come, so the server grew by that much a call under API load (`bench/bench_visitors.py`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from ports import free_port

from app.catalog.cards import load_cards
from app.config import Settings
from app.domain.sessions import Visit
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import History, sqlite_url
from app.views import Playground, build, launch
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
