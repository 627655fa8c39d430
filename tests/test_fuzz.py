"""Fuzzed as a hostile visitor would (issue 25): hypothesis makes history imports and `/chat`
arguments no honest page sends. Whatever comes in, no exception escapes but a refusal of one
clear line (no traceback, class name or server path), and no file outside the app's own folders
is written."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from app.catalog.cards import ModelCard
from app.config import Settings
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import (
    ConversationRecord,
    Export,
    History,
    HistoryError,
    MediaRecord,
    ReplyRecord,
    TurnRecord,
    new_id,
    sqlite_url,
)
from app.views import Playground
from app.views.api import ChatApi
from app.views.chat import ChatView

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
HOSTILE_NAMES = st.sampled_from(
    ["../../../etc/passwd", "/etc/shadow", "..", ".", "", "a\x00b.png", "..\\..\\win.ini", "ok.png"]
) | st.text(max_size=300)
HASHES = st.sampled_from(["0" * 64, "f" * 64, "../" * 21 + "a", "A" * 64]) | st.text(max_size=70)


def a_valid_export() -> dict[str, Any]:
    medium = MediaRecord(hash="a" * 64, name="red.png", kind="image")
    turn = TurnRecord(text="What is it?", media=[medium], replies=[ReplyRecord(model="m", answer="red")])
    record = ConversationRecord(id=new_id(), kind="grid", model="m", turns=[turn])
    return json.loads(Export(conversation=record, thumbnails={"a" * 64: "/9j/"}).model_dump_json())


# Where in a valid export a hostile value goes.
PLACES = [
    ("conversation", "turns", 0, "media", 0, "name"),
    ("conversation", "turns", 0, "media", 0, "hash"),
    ("conversation", "turns", 0, "media", 0, "kind"),
    ("conversation", "turns", 0, "text"),
    ("conversation", "turns", 0, "replies", 0),
    ("conversation", "turns"),
    ("conversation", "kind"),
    ("conversation", "id"),
    ("conversation", "version"),
    ("thumbnails",),
    ("format",),
]


def put(document: Any, place: tuple[Any, ...], value: Any) -> None:
    for step in place[:-1]:
        document = document[step]
    document[place[-1]] = value


def files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


def is_one_clear_line(line: str, *paths: Path) -> bool:
    return (
        bool(line.strip())
        and "\n" not in line
        and "Traceback" not in line
        and not any(str(path) in line for path in paths)
        and "Exception" not in line
    )


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    folder = tmp_path_factory.mktemp("fuzz-history")
    store = History(sqlite_url(folder), folder / "media")
    yield store
    store.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    changes=st.lists(
        st.tuples(st.sampled_from(PLACES), JSON | HOSTILE_NAMES | HASHES), min_size=1, max_size=3
    ),
    raw=st.none() | st.binary(max_size=200),
)
def test_a_hostile_import_is_refused_in_one_line_or_stored_as_data(
    history: History, changes: list[tuple[tuple[Any, ...], Any]], raw: bytes | None
):
    before = files_under(history.media_dir.parent)
    document = a_valid_export()
    for place, value in changes:
        try:
            put(document, place, value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change took the place away
    text = raw if raw is not None else json.dumps(document)
    try:
        record = history.import_json("fuzzer", text)
    except HistoryError as error:
        assert is_one_clear_line(str(error), history.media_dir), str(error)
    else:
        # Stored as data: names are plain display names, and nothing is reachable by them.
        for medium in (m for t in record.turns for m in t.media):
            assert "/" not in medium.name and "\\" not in medium.name
            assert history.media_file("fuzzer", medium.hash) is None
    after = files_under(history.media_dir.parent)
    # Only the database's own files change; an import never writes a media file.
    assert {p for p in after - before if not p.name.startswith("playground.db")} == set()


# --- /chat ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_api(
    loop, tiny_cards: dict[str, ModelCard], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ChatApi, Path]]:
    settings = Settings(gpu_count=0)
    manager = EngineManager(tiny_cards, settings, VllmEngineFactory(settings))
    decoder = VideoDecoderPool(workers=1)
    playground = Playground(manager, settings, decoder)
    folder = tmp_path_factory.mktemp("fuzz-chat")
    Image.new("RGB", (64, 48), "red").save(folder / "red.png")
    (folder / "text.png").write_text("not a picture")
    (folder / "clip.mp4").write_bytes(b"\x00" * 64)
    (folder / "a-folder.png").mkdir()
    yield ChatApi(ChatView(playground)), folder
    loop.run(manager.close())
    decoder.close()


NUMBERS = st.none() | st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e12]) | st.floats(-10, 10)
FILES = st.lists(
    st.sampled_from(["red.png", "text.png", "clip.mp4", "a-folder.png", "missing.png"]), max_size=4
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(max_size=200) | st.none() | st.integers(),
    files=FILES | st.none(),
    model=st.sampled_from(["tiny-a", "tiny-b", "", "no-such-model", "../../etc/passwd"])
    | st.text(max_size=20),
    system=st.text(max_size=100),
    temperature=NUMBERS,
    top_p=NUMBERS,
    max_tokens=st.none() | st.sampled_from([-5, 0, 1, 4, 10**9, math.nan]),
    seed=NUMBERS,
)
def test_chat_with_hostile_arguments_answers_or_refuses_in_one_line(
    loop, chat_api, text, files, model, system, temperature, top_p, max_tokens, seed
):
    api, folder = chat_api
    message: dict[str, Any] = {"text": text}
    if files is not None:
        message["files"] = [str(folder / name) for name in files]
    before = files_under(folder)

    async def run() -> list[str]:
        return [
            part async for part in api.chat_api(message, model, system, temperature, top_p, max_tokens, seed)
        ]

    try:
        answers = loop.run(run())
        assert all(isinstance(answer, str) for answer in answers)
    except gr.Error as refused:
        assert is_one_clear_line(str(refused.message), folder), refused.message
    assert files_under(folder) == before
