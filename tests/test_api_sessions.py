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
