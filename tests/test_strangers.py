"""A hostile visitor against the history (issue 25): a crafted import is data, never a path or a
key. Each test drives what a visitor can send (an import file, a reopen) through the real
history views over a real SQLite database and real files, and checks what must never happen:
a file written or read outside the app's folders, another visitor's picture or thumbnail shown,
an import past its limits taken."""

from __future__ import annotations

import base64
import gc
import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image
from sqlalchemy.exc import OperationalError

from app.catalog.cards import ModelCard
from app.config import Settings
from app.domain.conversation import Turn
from app.domain.replies import Reply
from app.domain.sessions import SessionStore, Visit
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import (
    IMPORT_LIMITS,
    ConversationRecord,
    Export,
    History,
    HistoryError,
    MediaRecord,
    ReplyRecord,
    TurnRecord,
    describe_media,
    display_name,
    new_id,
    sqlite_url,
)
from app.views import Playground
from app.views.chat import CLOSED_UNSTORED, KEPT_OPEN, ChatView
from app.views.compare import CompareView
from app.views.grid import GridView
from app.views.history import EXPORTED_STORED, HistoryView
from app.views.page import Page
from app.views.widgets import settled_box


@pytest.fixture(scope="module")
def views(
    loop, tiny_cards: dict[str, ModelCard], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[HistoryView, History]]:
    settings = Settings(gpu_count=0)
    manager = EngineManager(tiny_cards, settings, VllmEngineFactory(settings))  # never asked here
    decoder = VideoDecoderPool(workers=1)
    folder = tmp_path_factory.mktemp("strangers")
    history = History(sqlite_url(folder), folder / "media")
    playground = Playground(manager, settings, decoder, history)
    chat = ChatView(playground)
    yield HistoryView(playground, chat, CompareView(playground), GridView(playground)), history
    loop.run(manager.close())
    history.close()
    decoder.close()


def picture(path: Path, colour: str) -> Path:
    Image.new("RGB", (64, 48), colour).save(path)
    return path


def grid_export(media: list[MediaRecord], thumbnails: dict[str, str] | None = None) -> str:
    """A grid run's export file, as a visitor can write it by hand."""
    turn = TurnRecord(
        text="What colour is it?",
        item_id="one",
        media=media,
        replies=[ReplyRecord(model="tiny-a", answer="red")],
    )
    record = ConversationRecord(id=new_id(), kind="grid", title="Grid: mine", model="tiny-a", turns=[turn])
    return Export(conversation=record, thumbnails=thumbnails or {}).model_dump_json()


def crafted(medium: MediaRecord, name: str) -> dict:
    """`medium` with a `name` the model itself would refuse: written into the JSON by hand."""
    return {**medium.model_dump(), "name": name}


def save_picture(history: History, browser: str, path: Path) -> MediaRecord:
    medium = describe_media(path, path.name, "image", "image, 64×48 px")
    turn = TurnRecord(text="What is it?", media=[medium], replies=[ReplyRecord(model="tiny-a", answer="x")])
    history.save(browser, ConversationRecord(id=new_id(), model="tiny-a", turns=[turn]), {medium.hash: path})
    return medium


def test_a_crafted_media_name_writes_and_reads_no_file_outside_the_apps_folders(loop, views, tmp_path: Path):
    """The critical finding: a grid record naming `../..` or an absolute path, reopened, used to
    copy a stored file to that path, and to read the path back as the item's picture."""
    view, history = views
    mine = save_picture(history, "visitor", picture(tmp_path / "red.png", "red"))
    secret = picture(tmp_path / "secret.png", "blue")  # a file of the server's, outside every folder
    target = tmp_path / "written-by-the-visitor.png"
    depth = "../" * 12
    names = [f"{depth}{str(target).lstrip('/')}", str(target), f"..\\..\\{target.name}", str(secret)]
    for name in names:
        data = json.loads(grid_export([]))
        data["conversation"]["turns"][0]["media"] = [crafted(mine, name)]
        record = history.import_json("visitor", json.dumps(data))
        assert "/" not in record.turns[0].media[0].name and "\\" not in record.turns[0].media[0].name
        visit = Visit(browser_id="visitor")
        notice = loop.run(view.grid_reopened(history, record, visit))
        assert "Reopened" in notice
        assert not target.exists(), name
        grid = visit.grid
        assert grid is not None
        (item,) = grid.prompt_set.items
        path = grid.prompt_set.path(item.media[0])
        # The visitor's own stored picture, copied into the run's folder under its hash.
        assert path.parent == grid.prompt_set.folder and path.name.startswith(mine.hash)
        assert path.read_bytes() == (tmp_path / "red.png").read_bytes() != secret.read_bytes()
        grid.close()


def test_knowing_a_hash_gives_neither_the_file_nor_its_thumbnail(loop, views, tmp_path: Path):
    view, history = views
    theirs = save_picture(history, "owner", picture(tmp_path / "private.png", "green"))
    exported = grid_export([theirs])  # the hash is all the visitor needs to name it
    record = history.import_json("stranger", exported)
    assert history.media_file("stranger", theirs.hash) is None
    assert not history.thumbnail("stranger", theirs.hash)  # not the owner's thumbnail
    visit = Visit(browser_id="stranger")
    notice = loop.run(view.grid_reopened(history, record, visit))
    assert "no longer kept" in notice
    assert visit.grid is not None and not visit.grid.pictures
    visit.grid.close()
    # The export of the stranger's copy carries no thumbnail of the owner's picture either.
    assert json.loads(history.export("stranger", record.id))["thumbnails"] == {}
    # The owner still has both.
    assert history.media_file("owner", theirs.hash) is not None and history.thumbnail("owner", theirs.hash)


def jpeg(colour: str) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(buffer, "JPEG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_an_import_cannot_preseed_a_hashs_thumbnail_or_kind_before_its_owner_sends_it(views, tmp_path: Path):
    _, history = views
    path = picture(tmp_path / "later.png", "red")
    medium = describe_media(path, path.name, "image", "")
    forged = {**medium.model_dump(), "kind": "video"}
    data = json.loads(grid_export([], {medium.hash: jpeg("black")}))
    data["conversation"]["turns"][0]["media"] = [forged]
    history.import_json("forger", json.dumps(data))
    # The forger sees the thumbnail its own import carried, and nobody else does.
    with Image.open(io.BytesIO(history.thumbnail("forger", medium.hash) or b"")) as seen:
        assert seen.getpixel((8, 8))[0] < 50
    save_picture(history, "owner-2", path)
    with Image.open(io.BytesIO(history.thumbnail("owner-2", medium.hash) or b"")) as seen:
        assert seen.getpixel((8, 8))[0] > 200  # made from the owner's red file
    assert history.media_file("owner-2", medium.hash) is not None
    assert history.media_file("forger", medium.hash) is None


def too_big(kind: str) -> str:
    if kind == "file":
        return "x" * (IMPORT_LIMITS.total_bytes + 1)
    if kind == "turns":
        record = ConversationRecord(id=new_id(), turns=[TurnRecord(text="t")] * (IMPORT_LIMITS.turns + 1))
        return Export(conversation=record).model_dump_json()
    if kind == "answer":
        reply = ReplyRecord(model="m", answer="a" * (IMPORT_LIMITS.field_chars + 1))
        record = ConversationRecord(id=new_id(), turns=[TurnRecord(text="t", replies=[reply])])
        return Export(conversation=record).model_dump_json()
    big = base64.b64encode(b"\xff\xd8\xff" + b"0" * IMPORT_LIMITS.thumbnail_bytes_each).decode()
    return Export(conversation=ConversationRecord(id=new_id()), thumbnails={"0" * 64: big}).model_dump_json()


@pytest.mark.parametrize("kind", ["file", "turns", "answer", "thumbnail"])
def test_an_import_past_its_limits_is_refused_in_one_line_and_stores_nothing(views, kind: str):
    _, history = views
    with pytest.raises(HistoryError) as refused:
        history.import_json("bulky", too_big(kind))
    line = str(refused.value)
    assert "\n" not in line and "at most" in line and "Error" not in line
    assert history.list("bulky") == []


@given(name=st.text(max_size=300))
def test_a_display_name_is_never_a_path(name: str):
    shown = display_name(name)
    assert shown and "/" not in shown and "\\" not in shown and shown not in (".", "..")
    assert all(c.isprintable() for c in shown) and len(shown) <= 255
    assert MediaRecord(hash="0" * 64, name=name, kind="image").name == shown


def example_files(demo: Any) -> list[Path]:
    """The files of the examples under the chat, as the page hands them to a visitor's message."""
    datasets = [c for c in demo.config["components"] if c.get("type") == "dataset"]
    found = []
    for dataset in datasets:
        for sample in dataset["props"].get("samples") or []:
            for value in sample:
                for file in (value or {}).get("files", []) if isinstance(value, dict) else []:
                    found.append(Path(file["path"] if isinstance(file, dict) else file))
    return found


def test_one_visitors_clear_or_closed_tab_deletes_no_example_and_no_other_tabs_upload(views, tmp_path: Path):
    """Gradio keeps identical uploads of every tab at one path, and the examples are everyone's:
    a session that ends deletes its own copies only."""
    view, _ = views
    page = Page(view.playground)
    demo = page.build()
    examples = example_files(demo)
    assert examples and all(path.is_file() for path in examples)
    upload = Path(demo.GRADIO_CACHE) / "0123abcd" / "photo.png"  # where Gradio puts an upload
    upload.parent.mkdir(parents=True, exist_ok=True)
    picture(upload, "red")
    _, first = page.sessions.attach(None, "tab-a")
    _, second = page.sessions.attach(None, "tab-b")
    for sent in (*examples, upload):
        first.chat.keep(sent)
        kept = second.chat.keep(sent)
    first.chat.close()  # Clear, or the tab's end
    first.close()
    assert all(path.is_file() for path in examples), "an example was deleted for everyone"
    assert upload.is_file() and kept.is_file(), "another tab's upload was deleted"
    second.close()
    assert all(path.is_file() for path in examples)


def test_a_tab_in_use_keeps_its_chat_past_the_time_to_live_counted_from_its_load(loop, views):
    """The time-to-live counts from the tab's last message, not from the page's load."""
    view, _ = views
    now = [0.0]
    store = SessionStore(grace_s=300, ttl_s=3600, clock=lambda: now[0])
    playground = view.playground
    before, playground.sessions = playground.sessions, store
    try:
        token, visit = store.attach(None, "page")
        for _ in range(3):  # three quarters of an hour between messages, for more than an hour
            now[0] += 2700
            updates = view.chat.send({"text": "Still there?", "files": []}, visit, "no-such-model", "")
            loop.run(drain(updates))
            store.sweep()
            assert token in store.visits
        now[0] += 3600
        store.sweep()
        assert token not in store.visits  # idle for the whole time-to-live: gone
    finally:
        playground.sessions = before
        store.close()


async def drain(updates: Any) -> None:
    async for _ in updates:
        pass


def test_media_past_the_retention_are_deleted_on_a_schedule_and_thumbnails_stay(views, tmp_path: Path):
    view, _ = views
    now = [1000.0]
    history = History(sqlite_url(tmp_path), tmp_path / "media", retention_s=3600, clock=lambda: now[0])
    shared = view.playground
    playground = Playground(shared.manager, shared.settings, shared.decoder, history)
    try:
        medium = save_picture(history, "visitor", picture(tmp_path / "kept.png", "red"))
        playground.start_housekeeping(every_s=0.05)
        time.sleep(0.3)
        assert history.media_file("visitor", medium.hash) is not None  # within the retention
        now[0] += 7200
        deadline = time.monotonic() + 20
        while history.media_file("visitor", medium.hash) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert history.media_file("visitor", medium.hash) is None
        assert not list((tmp_path / "media").rglob("*.png")) and history.thumbnail("visitor", medium.hash)
    finally:
        playground.stop_housekeeping()
        history.close()


def chat_turn(text: str, answer: str) -> Turn:
    return Turn(text=text, reply=Reply("tiny-a", "Tiny A", "", answer=answer, state="done"))


def test_two_tabs_on_one_conversation_the_later_save_is_refused_in_a_line_not_lost(loop, views):
    view, history = views
    first, second = Visit(browser_id="two-tabs"), Visit(browser_id="two-tabs")
    first.chat.turns.append(chat_turn("Hello?", "hi"))
    assert loop.run(view.save_chat(first, "tiny-a", "")) is not None
    stored = history.load("two-tabs", first.chat.conversation_id)
    # The second tab reopens it, then both go on from the same turn.
    loop.run(view.reopen(stored.id, second))
    assert len(second.chat.turns) == 1
    first.chat.turns.append(chat_turn("From tab one", "one"))
    second.chat.turns.append(chat_turn("From tab two", "two"))
    assert not isinstance(loop.run(view.save_chat(first, "tiny-a", "")), str)
    notice = loop.run(view.save_chat(second, "tiny-a", ""))
    assert isinstance(notice, str) and "another tab" in notice and "\n" not in notice
    kept = history.load("two-tabs", stored.id)
    assert [t.text for t in kept.turns] == ["Hello?", "From tab one"]
    assert [t.text for t in second.chat.turns][-1] == "From tab two"  # nothing lost in the tab
    # Reopened, the second tab goes on from the newest turns and stores again.
    loop.run(view.reopen(stored.id, Visit(browser_id="two-tabs")))
    third = Visit(browser_id="two-tabs")
    loop.run(view.reopen(stored.id, third))
    third.chat.turns.append(chat_turn("From tab three", "three"))
    assert not isinstance(loop.run(view.save_chat(third, "tiny-a", "")), str)
    assert len(history.load("two-tabs", stored.id).turns) == 3


def test_deleting_a_conversation_asks_once_before_it_is_gone_for_good(loop, views):
    view, history = views
    visit = Visit(browser_id="deleter")
    visit.chat.turns.append(chat_turn("Keep me?", "maybe"))
    loop.run(view.save_chat(visit, "tiny-a", ""))
    conversation_id = visit.chat.conversation_id
    _, notice = loop.run(view.delete(conversation_id, visit))
    assert "again" in notice and [s.id for s in history.list("deleter")] == [conversation_id]
    loop.run(view.delete(conversation_id, visit))
    assert history.list("deleter") == [] and visit.chat.turns == []


class NoDecodingHere:
    """PyAV as the server's process must not use it: every video is decoded in the isolated worker."""

    def open(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a video was decoded in the server's process")


def test_a_stored_videos_thumbnail_comes_from_the_workers_still_not_a_decode_in_the_server(
    loop, views, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    view, history = views
    monkeypatch.setitem(__import__("sys").modules, "av", NoDecodingHere())
    visit = Visit(browser_id="filmmaker")
    video = visit.chat.keep(_written(tmp_path / "clip.mp4", b"\x00\x00\x00\x18ftypmp42 not really a video"))
    still = picture(tmp_path / "still.jpg", "red")
    turn = chat_turn("What happens?", "things")
    turn.video, turn.frames = video, [(still, 0.0)]
    turn.names[video] = "clip.mp4"
    turn.media.append("clip.mp4: video, 1 KB")
    visit.chat.turns.append(turn)
    assert not isinstance(loop.run(view.save_chat(visit, "tiny-a", "")), str)
    (medium,) = history.load("filmmaker", visit.chat.conversation_id).turns[0].media
    assert medium.kind == "video"
    with Image.open(io.BytesIO(history.thumbnail("filmmaker", medium.hash) or b"")) as seen:
        assert seen.getpixel((8, 8))[0] > 200  # the worker's red still


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_stop_mid_answer_stores_the_answer_as_stopped_before_the_tabs_are_closed(
    loop, tiny_cards: dict[str, ModelCard], tmp_path: Path
):
    """SIGTERM's path (`Playground.close` from the main thread, as `python -m app` does): the
    answer streaming at that moment is kept in the history as stopped, not lost with its tab."""
    import asyncio

    settings = Settings(gpu_count=0)
    manager = EngineManager(tiny_cards, settings, VllmEngineFactory(settings))
    decoder = VideoDecoderPool(workers=1)
    history = History(sqlite_url(tmp_path), tmp_path / "media")
    playground = Playground(manager, settings, decoder, history)
    view = HistoryView(playground, ChatView(playground), CompareView(playground), GridView(playground))
    _, visit = playground.sessions.attach(None, "page")
    visit.browser_id, visit.chat_model = "stopper", "tiny-a"
    updates = view.chat.send(
        {"text": "Count to a thousand.", "files": []}, visit, "tiny-a", "", 0.0, 1.0, 4000, 0
    )
    streaming = asyncio.run_coroutine_threadsafe(drain(updates), loop.loop)
    deadline = time.monotonic() + 180
    while not (visit.chat.turns and visit.chat.turns[-1].answer) and time.monotonic() < deadline:
        time.sleep(0.05)
    conversation_id = visit.chat.conversation_id
    assert visit.chat.turns and visit.chat.turns[-1].answer, "no answer started"
    try:
        playground.close(120)
        streaming.result(60)
        reopened = History(sqlite_url(tmp_path), tmp_path / "media")
        (turn,) = reopened.load("stopper", conversation_id).turns
        reopened.close()
        assert turn.text == "Count to a thousand." and turn.replies[0].state == "stopped"
        assert turn.replies[0].answer and turn.replies[0].model == "tiny-a"
    finally:
        decoder.close()


def test_a_sent_message_shows_at_once_and_a_refused_one_goes_back_to_the_box(loop, views):
    """The chat shows the message before its files are kept and its prompt counted (seconds on
    a first message); a refusal then takes it out of the chat and puts it back in the box."""
    view, _ = views
    _, visit = view.playground.sessions.attach(None, "page")
    message = {"text": "Is it there at once?", "files": []}

    async def updates() -> list[Any]:
        return [update async for update in view.chat.send(message, visit, "no-such-model", "")]

    first, *rest = loop.run(updates())
    shown = [m["content"] for m in first[0]]
    assert shown == ["Is it there at once?", "Preparing the prompt…"]
    last = rest[-1]
    assert last[0] == [] and last[1].value["text"] == "Is it there at once?" and "⚠️" in last[2]


def test_a_message_still_whole_in_the_box_when_its_answer_ends_is_taken_out_and_nothing_else(
    loop, views, tmp_path: Path
):
    """docs/TESTING.md's fault: two pictures picked together and sent stayed in the box with their
    text (the page missed the clear sent with the answer's first update) and went again with the
    next message. When the answer ends the box is emptied of the message sent, once; a message
    typed meanwhile stays, and so do one put back after a refusal and one taken back by Undo."""
    view, _ = views
    _, visit = view.playground.sessions.attach(None, "page")
    files = [str(picture(tmp_path / "a.png", "red")), str(picture(tmp_path / "b.png", "blue"))]
    message = {"text": "Compare these.", "files": files}
    settle = settled_box("chat")
    loop.run(drain(view.chat.send(dict(message), visit, "tiny-a", "", 0.0, 1.0, 8, 0)))
    assert visit.chat.turns[-1].reply.state == "done" and len(visit.chat.turns[-1].images) == 2
    assert settle(dict(message), visit).constructor_args.get("value", "left as it is") is None
    # Once: the same message put in the box again afterwards is the visitor's.
    assert "value" not in settle(dict(message), visit).constructor_args
    loop.run(drain(view.chat.send(dict(message), visit, "tiny-a", "", 0.0, 1.0, 8, 0)))
    assert "value" not in settle({"text": "And now?", "files": files}, visit).constructor_args
    # Refused and put back, it stays, even where the same message's answer ended unseen before
    # (its tab closed: no end came to take it out).
    again = {"text": "Once more.", "files": []}
    loop.run(drain(view.chat.send(dict(again), visit, "tiny-a", "", 0.0, 1.0, 8, 0)))
    loop.run(drain(view.chat.send(dict(again), visit, "no-such-model", "")))
    assert "value" not in settle(dict(again), visit).constructor_args
    # Taken back into the box by Undo (which works while an answer streams), it stays.
    loop.run(drain(view.chat.send(dict(again), visit, "tiny-a", "", 0.0, 1.0, 8, 0)))
    view.chat.undo(visit)
    assert "value" not in settle(dict(again), visit).constructor_args


def test_every_version_of_a_chat_is_stored_and_reopened_and_a_crafted_one_breaks_nothing(loop, views):
    """Edit and branch through the history: a chat's versions come back as they were; an import
    whose versions claim more versions where an export never writes them reopens as a chat whose
    every version is reachable, never as a server error."""
    view, history = views
    visit = Visit(browser_id="brancher")
    chat = visit.chat
    chat.turns += [chat_turn("one", "1"), chat_turn("two", "2")]
    chat.branch(1, chat_turn("two, edited", "2b"))
    chat.turns.append(chat_turn("three", "3"))
    chat.branch(0, chat_turn("one, edited", "1b"))
    chat.switch(0, 0)
    assert not isinstance(loop.run(view.save_chat(visit, "tiny-a", "")), str)
    again = Visit(browser_id="brancher")
    loop.run(view.reopen(chat.conversation_id, again))
    assert [t.text for t in again.chat.turns] == ["one", "two, edited", "three"]
    assert [t.text for t in again.chat.every_turn()] == [t.text for t in chat.every_turn()]
    labels = [label for label, _ in view.chat.menus(again)[1].choices]
    assert len(labels) == 4 and "Message 2, version 2 of 2 (shown)" in labels[3]

    crafted = Export(
        conversation=ConversationRecord(
            id=new_id(),
            turns=[
                TurnRecord(
                    text="shown",
                    versions=[
                        [TurnRecord(text="hidden", versions=[[TurnRecord(text="deeper")]], shown_at=1)]
                    ],
                    shown_at=0,
                )
            ],
        )
    )
    imported = history.import_json("brancher", crafted.model_dump_json())
    third = Visit(browser_id="brancher")
    loop.run(view.reopen(imported.id, third))
    menu = view.chat.menus(third)[1]
    assert [label.split(":")[0] for label, _ in menu.choices] == [
        "Message 1, version 1 of 2 (shown)",
        "Message 1, version 2 of 2",
    ]
    third.chat.switch(0, 1)
    assert [t.text for t in third.chat.turns] == ["hidden"] and third.chat.turns[0].versions is not None
    # A made-up "shown before" that names the newest version itself: refused in one line.
    made_up = json.loads(crafted.model_dump_json())
    made_up["conversation"]["turns"][0]["shown_before"] = 1
    with pytest.raises(HistoryError) as refused:
        history.import_json("brancher", json.dumps(made_up))
    assert "\n" not in str(refused.value)


def test_undo_after_a_reload_brings_back_the_version_shown_before_the_newest(loop, views):
    """The version a chat showed before its newest edit is stored: undoing that edit after a
    reload shows it again, as the same undo did before the reload (not the first version)."""
    view, _ = views
    visit = Visit(browser_id="undoer")
    chat = visit.chat
    chat.turns += [chat_turn("a", "1"), chat_turn("b", "2"), chat_turn("c", "3")]
    chat.branch(1, chat_turn("b2", "2b"))
    chat.turns.append(chat_turn("c2", "3b"))
    chat.branch(1, chat_turn("b3", "2c"))  # edited from b2: b2 was shown before b3
    assert not isinstance(loop.run(view.save_chat(visit, "tiny-a", "")), str)
    again = Visit(browser_id="undoer")
    loop.run(view.reopen(chat.conversation_id, again))
    for session in (chat, again.chat):
        session.drop_last()
        assert [t.text for t in session.turns] == ["a", "b2", "c2"]


def test_an_answer_streaming_in_a_hidden_version_at_exit_is_stored_as_stopped(views):
    """The app stops while an answer streams in a version the chat no longer shows (another
    version was picked meanwhile): that answer is stored, as stopped, like one shown."""
    view, history = views
    visit = Visit(browser_id="exiter")
    chat = visit.chat
    chat.turns.append(chat_turn("a", "1"))
    streaming = Turn(
        text="a, edited", reply=Reply("tiny-a", "Tiny A", "", answer="half an ans", state="streaming")
    )
    chat.branch(0, streaming)
    chat.switch(0, 0)  # the first version shown; the edit's answer still streams, hidden
    view.store_at_exit(visit)
    (turn,) = history.load("exiter", chat.conversation_id).turns
    ((hidden,),) = turn.versions
    assert [(r.answer, r.state) for r in hidden.replies] == [("half an ans", "stopped")]


def test_a_message_prepared_while_the_chat_changed_is_refused_not_grafted(loop, views):
    """Undo (or another version picked) while an edited message's prompt is being made: the
    prompt was made for a chat no longer shown, so the message goes back to the box in one line
    rather than crashing or answering after turns it never saw."""
    view, _ = views
    _, visit = view.playground.sessions.attach(None, "page-changed")
    key = next(key for key, choice in view.playground.choices.items() if not choice.reason)
    visit.chat.turns += [chat_turn("one", "1"), chat_turn("two", "2")]
    visit.chat.editing = 1

    async def run() -> list[Any]:
        updates = view.chat.send({"text": "two, edited", "files": []}, visit, key, "", 0.0, 1.0, 8, 0)
        first = await anext(updates)
        visit.chat.drop_last()  # Undo, while the prompt is made
        return [first, *[update async for update in updates]]

    *_, last = loop.run(run())
    assert [turn.text for turn in visit.chat.turns] == ["one"]
    assert "changed while this message was being prepared" in last[2]
    assert last[1].value["text"] == "two, edited"


def test_a_message_prepared_while_another_conversation_was_opened_goes_into_neither(loop, views):
    """Another conversation opened from the sidebar while a message's prompt is made: the
    message goes back to the box, not into the chat that was closed (stored without it) nor the
    one opened, and the chat shown is left as opened."""
    view, history = views
    _, visit = view.playground.sessions.attach(None, "page-opens-another")
    visit.browser_id = "opener"
    key = next(key for key, choice in view.playground.choices.items() if not choice.reason)
    other = Visit(browser_id="opener")
    other.chat.turns.append(chat_turn("The other one", "yes"))
    loop.run(view.save_chat(other, key, ""))
    visit.chat.turns.append(chat_turn("The open one", "1"))
    left = visit.chat.conversation_id

    async def run() -> list[Any]:
        updates = view.chat.send({"text": "A follow-up", "files": []}, visit, key, "", 0.0, 1.0, 8, 0)
        first = await anext(updates)
        await view.reopen(other.chat.conversation_id, visit, key, "")  # while the prompt is made
        return [first, *[update async for update in updates]]

    *_, last = loop.run(run())
    assert [t.text for t in visit.chat.turns] == ["The other one"]
    assert [t.text for t in history.load("opener", left).turns] == ["The open one"]
    assert [t.text for t in history.load("opener", other.chat.conversation_id).turns] == ["The other one"]
    assert isinstance(last[0], dict) and last[0].get("__type__") == "update"  # the chat shown stays
    assert last[1].value["text"] == "A follow-up" and "changed while" in last[2]


@pytest.mark.slow
@pytest.mark.vllm
def test_an_edited_messages_versions_are_in_the_menu_while_its_answer_streams(loop, views):
    """The page's send handler (`with_menus`) brings the Versions menu up to date as soon as an
    edited message becomes a new version, while its answer is still to come, and leaves the menus
    alone while the answer streams."""
    view, _ = views
    _, visit = view.playground.sessions.attach(None, "page-menus")
    visit.chat.turns += [chat_turn("one", "1"), chat_turn("two", "2")]
    visit.chat.editing = 1
    send = view.chat.with_menus(view.chat.send, visit_at=1)
    seen: list[tuple[Any, str]] = []

    async def run() -> None:
        message = {"text": "two, edited", "files": []}
        async for update in send(message, visit, "tiny-a", "", 0.0, 1.0, 16, 0):
            reply = visit.chat.turns[-1].reply
            seen.append((update[5], reply.state if reply is not None else "none"))

    loop.run(run())
    menus = [(menu, state) for menu, state in seen if isinstance(menu, gr.Dropdown)]
    first_menu, state_then = menus[1]  # the first: before the message was a version
    assert [label.split(":")[0] for label, _ in first_menu.choices] == [
        "Message 2, version 1 of 2",
        "Message 2, version 2 of 2 (shown)",
    ]
    assert state_then not in ("done", "stopped", "failed")  # its answer still to come
    assert len(seen) > len(menus) + 1  # streamed updates left the menus as they were


def test_a_failed_answer_takes_out_only_its_own_turn_whatever_was_done_meanwhile():
    """A failed answer's turn leaves the chat; Undo or a version picked while it streamed must
    not make it take another turn with it."""
    from app.domain.conversation import Session

    # Regenerate, Undo while the new answer streams, then it fails: the first answer stays.
    chat = Session(turns=[chat_turn("a", "1"), chat_turn("b", "2")])
    again = chat.turns[-1].again()
    chat.branch(1, again)
    chat.drop_last()
    chat.discard(again)
    assert [t.text for t in chat.turns] == ["a", "b"] and chat.turns[1].answer == "2"
    # Edit the first message, go back to the first version while it streams, then it fails.
    chat = Session(turns=[chat_turn("a", "1"), chat_turn("b", "2"), chat_turn("c", "3")])
    edited = chat_turn("a, edited", "")
    chat.branch(0, edited)
    chat.switch(0, 0)
    chat.discard(edited)
    assert [t.text for t in chat.turns] == ["a", "b", "c"]
    assert [t.text for t in chat.every_turn()] == ["a", "b", "c", "a, edited"]  # kept, failed


@pytest.mark.slow
@pytest.mark.vllm
def test_an_answer_is_stored_before_the_page_is_shown_its_end(loop, views):
    """The page is shown an answer's end (its line under it) only once the answer is stored: a
    tab closed, a New chat or an Export clicked the moment it ends loses nothing (the save that
    ran after the answer's event, from the page, came too late or never: one turn of 285 was
    lost in the 30-minute visitors run)."""
    view, history = views
    _, visit = view.playground.sessions.attach(None, "page-ends")
    visit.browser_id = "ender"
    ended_shown = []

    async def run() -> None:
        updates = view.chat.send({"text": "What shape?", "files": []}, visit, "tiny-a", "", 0.0, 1.0, 8, 0)
        async for chat, *_ in updates:
            if any((m.get("metadata") or {}).get("status") == "done" for m in chat):
                conversation_id = visit.chat.conversation_id
                (turn,) = history.load("ender", conversation_id).turns  # HistoryError if none
                ended_shown.append([(r.answer, r.state) for r in turn.replies])

    loop.run(run())
    reply = visit.chat.turns[-1].reply
    assert ended_shown and ended_shown[0] == [(reply.answer, "done")]


def test_new_chat_export_clear_and_opening_another_store_the_open_chat_first(loop, views):
    """What the tab shows is what is kept: a change not yet stored (its save from the page not yet
    come) is stored before an export is made of it, and before New chat, Clear or another
    conversation drops it."""
    view, history = views
    visit = Visit(browser_id="dropper")
    visit.chat.turns.append(chat_turn("one", "1"))
    assert not isinstance(loop.run(view.save_chat(visit, "tiny-a", "")), str)
    first = visit.chat.conversation_id
    visit.chat.turns.append(chat_turn("two", "2"))  # not stored yet
    download, notice = loop.run(view.export(first, visit, "tiny-a", ""))
    exported = json.loads(Path(download.value["path"]).read_text())
    assert not notice and [t["text"] for t in exported["conversation"]["turns"]] == ["one", "two"]

    visit.chat.turns.append(chat_turn("three", "3"))
    loop.run(view.new_chat(visit, "tiny-a", ""))
    assert [t.text for t in history.load("dropper", first).turns] == ["one", "two", "three"]
    assert visit.chat.turns == [] and visit.chat.conversation_id != first

    visit.chat.turns.append(chat_turn("cleared", "c"))
    second = visit.chat.conversation_id
    loop.run(view.chat.clear(visit, "tiny-a", ""))
    assert [t.text for t in history.load("dropper", second).turns] == ["cleared"]

    visit.chat.turns.append(chat_turn("left for another", "l"))
    third = visit.chat.conversation_id
    loop.run(view.reopen(first, visit, "tiny-a", ""))
    assert [t.text for t in history.load("dropper", third).turns] == ["left for another"]
    assert [t.text for t in visit.chat.turns] == ["one", "two", "three"]
    # Opened and left as it was, it is not stored again: no new version, and not the model or
    # system prompt the page holds but never sent.
    version = history.load("dropper", first).version
    loop.run(view.save_chat(visit, "tiny-a", ""))
    loop.run(view.new_chat(visit, "tiny-b", "typed, never sent"))
    kept = history.load("dropper", first)
    assert (kept.version, kept.model, kept.system_prompt) == (version, "tiny-a", "")


def test_an_export_where_another_tab_stored_the_chat_is_the_stored_one_with_a_line_why(loop, views):
    view, _ = views
    first, second = Visit(browser_id="exporter"), Visit(browser_id="exporter")
    first.chat.turns.append(chat_turn("Hello?", "hi"))
    loop.run(view.save_chat(first, "tiny-a", ""))
    conversation_id = first.chat.conversation_id
    loop.run(view.reopen(conversation_id, second))
    second.chat.turns.append(chat_turn("From tab two", "two"))
    loop.run(view.save_chat(second, "tiny-a", ""))
    first.chat.turns.append(chat_turn("From tab one", "one"))  # refused: tab two stored first
    download, notice = loop.run(view.export(conversation_id, first, "tiny-a", ""))
    exported = json.loads(Path(download.value["path"]).read_text())
    assert [t["text"] for t in exported["conversation"]["turns"]] == ["Hello?", "From tab two"]
    assert "another tab" in notice and "\n" not in notice


DROPPING = ["clear", "new chat", "reopen"]


def drop_the_chat(loop: Any, view: HistoryView, visit: Visit, action: str) -> tuple[Any, ...]:
    """The tab's chat let go of by `action`: Clear, New chat, or another conversation opened (one
    stored by the same browser for it); the handler's outputs."""
    if action == "clear":
        return loop.run(view.chat.clear(visit, "tiny-a", ""))
    if action == "new chat":
        return loop.run(view.new_chat(visit, "tiny-a", ""))
    other = Visit(browser_id=visit.browser_id)
    other.chat.turns.append(chat_turn("another conversation", "other"))
    loop.run(view.save_chat(other, "tiny-a", ""))
    return loop.run(view.reopen(other.chat.conversation_id, visit, "tiny-a", ""))


@pytest.mark.parametrize("action", DROPPING)
def test_a_message_sent_while_the_chat_is_stored_on_leaving_it_goes_into_the_next_one(
    loop, views, monkeypatch: pytest.MonkeyPatch, action: str
):
    """On a busy server a message sent just after Clear (New chat, another conversation opened)
    can be added while the chat is still being stored: it went into the chat being dropped, and
    closing that emptied it (lost)."""
    view, history = views
    visit = Visit(browser_id=f"quick-{action}")
    visit.chat.turns.append(chat_turn("the old question", "old"))
    dropped = visit.chat.conversation_id
    store = history.save
    sent: list[bool] = []

    def sent_meanwhile(browser: str, record: Any, *args: Any, **kwargs: Any) -> Any:
        if record.id == dropped and not sent:
            sent.append(True)
            visit.chat.turns.append(chat_turn("the next question", "next"))  # as `ChatView.send` adds it
        return store(browser, record, *args, **kwargs)

    monkeypatch.setattr(history, "save", sent_meanwhile)
    drop_the_chat(loop, view, visit, action)
    assert sent and [t.text for t in history.load(visit.browser_id, dropped).turns] == ["the old question"]
    opened = ["another conversation"] if action == "reopen" else []
    assert [t.text for t in visit.chat.turns] == [*opened, "the next question"]
    assert visit.chat.conversation_id != dropped


@pytest.mark.parametrize("action", DROPPING)
def test_a_chat_whose_store_failed_on_leaving_it_stays_open(
    loop, views, monkeypatch: pytest.MonkeyPatch, action: str
):
    """The database refused the store (simulated): the chat stays as it was, with a line why."""
    view, history = views
    visit = Visit(browser_id=f"refused-{action}")
    visit.chat.turns.append(chat_turn("not stored", "no"))
    shown = visit.chat
    refuse_storing(monkeypatch, history, shown.conversation_id)
    outputs = drop_the_chat(loop, view, visit, action)
    assert KEPT_OPEN in outputs
    assert visit.chat is shown and [t.text for t in shown.turns] == ["not stored"]


@pytest.mark.parametrize("action", DROPPING)
def test_a_chat_whose_store_failed_after_a_message_went_on_in_the_next_says_it_was_not_kept(
    loop, views, monkeypatch: pytest.MonkeyPatch, action: str
):
    """The store failed, and meanwhile a message went into the chat that took its place: that
    one stays, and the line says the old one's last changes were not kept (it said "it stays
    open" while closing it)."""
    view, history = views
    visit = Visit(browser_id=f"moved-on-{action}")
    visit.chat.turns.append(chat_turn("not stored", "no"))
    shown = visit.chat

    def sent() -> None:
        visit.chat.turns.append(chat_turn("the next question", "next"))

    refuse_storing(monkeypatch, history, shown.conversation_id, meanwhile=sent)
    outputs = drop_the_chat(loop, view, visit, action)
    assert CLOSED_UNSTORED in outputs and KEPT_OPEN not in outputs
    assert visit.chat is not shown and visit.chat.turns[-1].text == "the next question"


def refuse_storing(
    monkeypatch: pytest.MonkeyPatch,
    history: History,
    conversation_id: str,
    meanwhile: Callable[[], Any] = lambda: None,
) -> None:
    """The database refuses to store one conversation (simulated), after `meanwhile` (what the
    tab did while the store ran); others are stored as usual."""
    store = history.save

    def refused(browser: str, record: Any, *args: Any, **kwargs: Any) -> Any:
        if record.id == conversation_id:
            meanwhile()
            raise OperationalError("INSERT ...", {}, Exception("database is locked"))
        return store(browser, record, *args, **kwargs)

    monkeypatch.setattr(history, "save", refused)


def refuse_every_store(monkeypatch: pytest.MonkeyPatch, history: History) -> None:
    """The database refuses to store (a simulated failure: SQLite waits 30 s for a real lock)."""

    def refused(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("INSERT ...", {}, Exception("database is locked"))

    monkeypatch.setattr(history, "save", refused)


def stored_comparison(loop: Any, view: HistoryView, visit: Visit, text: str) -> str:
    """A comparison of `text` run and stored by `visit`, which then shows a new, empty one; its id."""
    visit.compare.turns.append(
        Turn(text=text, columns=[Reply("tiny-a", "Tiny A", "", answer="a", state="done")])
    )
    loop.run(view.save_compare(visit, ["tiny-a"], ""))
    stored = visit.compare.conversation_id
    visit.compare.close()
    visit.compare = type(visit.compare)()
    return stored


def test_an_export_whose_store_failed_is_the_stored_version_and_says_so(
    loop, views, monkeypatch: pytest.MonkeyPatch
):
    """The database refused the store (a simulated failure: SQLite waits 30 s for a lock): the
    download is the version stored before, and the line says so (it said the chat "is still here,
    and the next answer tries again", as if the file were the chat shown)."""
    view, history = views
    visit = Visit(browser_id="refused-store")
    visit.chat.turns.append(chat_turn("Stored", "yes"))
    loop.run(view.save_chat(visit, "tiny-a", ""))
    visit.chat.turns.append(chat_turn("Not stored", "no"))
    refuse_every_store(monkeypatch, history)
    download, notice = loop.run(view.export(visit.chat.conversation_id, visit, "tiny-a", ""))
    exported = json.loads(Path(download.value["path"]).read_text())
    assert [t["text"] for t in exported["conversation"]["turns"]] == ["Stored"]
    assert notice == EXPORTED_STORED and "\n" not in notice


@pytest.mark.slow
@pytest.mark.vllm
def test_an_answer_ending_after_another_conversation_was_opened_leaves_that_one_as_it_was(loop, views):
    """The answer's store is of the chat it went into: opened meanwhile, another conversation is
    not overwritten with the streaming one's model and system prompt (nor a version added)."""
    view, history = views
    _, visit = view.playground.sessions.attach(None, "page-moves-on")
    visit.browser_id = "mover"
    other = Visit(browser_id="mover")
    other.chat.turns.append(chat_turn("Kept as it is", "yes"))
    loop.run(view.save_chat(other, "tiny-b", "system b"))
    before = history.load("mover", other.chat.conversation_id)

    async def run() -> None:
        message = {"text": "Count to a hundred.", "files": []}
        updates = view.chat.send(message, visit, "tiny-a", "system a", 0.0, 1.0, 64, 0)
        async for update in updates:
            reply = visit.chat.turns[-1].reply if visit.chat.turns else None
            if not left and reply is not None and reply.answer and not reply.ended:
                left.append(visit.chat.conversation_id)
                await view.reopen(before.id, visit, "tiny-a", "system a")
            elif left:
                shown_after.append(update[0])
        assert left, "the answer ended before anything else was opened"

    left: list[str] = []
    shown_after: list[Any] = []
    loop.run(run())
    after = history.load("mover", before.id)
    assert (after.version, after.model, after.system_prompt) == (before.version, "tiny-b", "system b")
    # The page then shows the conversation opened: the stopped answer does not write over it.
    assert all(isinstance(shown, dict) and shown.get("__type__") == "update" for shown in shown_after)
    # The conversation left was stored with what its answer had said so far, as stopped.
    (turn,) = history.load("mover", left[0]).turns
    assert [r.state for r in turn.replies] == ["stopped"] and turn.replies[0].answer


@pytest.mark.slow
@pytest.mark.vllm
def test_a_comparison_is_stored_before_the_page_is_shown_its_end(loop, views):
    """As an answer in the chat: the page is shown a comparison's end (every column ended) only
    once the run is stored."""
    view, history = views
    _, visit = view.playground.sessions.attach(None, "page-compares")
    visit.browser_id = "comparer"
    stored_when_shown = []

    async def run() -> None:
        message = {"text": "What shape?", "files": []}
        updates = view.compare.compare(message, visit, ["tiny-a", "tiny-b"], "", False, 0.0, 1.0, 8, 0)
        async for _ in updates:
            columns = visit.compare.turns[-1].columns if visit.compare.turns else []
            if columns and all(column.ended for column in columns):
                (turn,) = history.load("comparer", visit.compare.conversation_id).turns
                stored_when_shown.append(sorted(r.model for r in turn.replies))

    loop.run(run())
    assert stored_when_shown == [["tiny-a", "tiny-b"]]


def test_opening_a_stored_comparison_leaves_the_chat_and_its_streaming_answer_alone(loop, views):
    """A comparison opens in its own tab: the chat stays open, so nothing of it is stored or
    stopped (an answer streaming in it was marked stopped, and stopped showing, before)."""
    view, history = views
    visit = Visit(browser_id="both-tabs")
    stored = stored_comparison(loop, view, visit, "Which?")
    streaming = Turn(
        text="Still going", reply=Reply("tiny-a", "Tiny A", "", answer="so f", state="answering")
    )
    visit.chat.turns.append(streaming)
    loop.run(view.reopen(stored, visit, "tiny-a", ""))
    assert [t.text for t in visit.compare.turns] == ["Which?"]
    assert visit.chat.turns == [streaming] and streaming.reply.state == "answering"
    assert [s.id for s in history.list("both-tabs")] == [stored]  # the chat not stored meanwhile


def test_opening_a_stored_comparison_stores_the_running_one_first_as_stopped(loop, views):
    """As a chat is stored before another takes its place: a comparison still streaming when
    another is opened is stored with what its columns said, as stopped (it was dropped unstored),
    under its own run's models, whatever the pickers show now."""
    view, history = views
    visit = Visit(browser_id="compares-twice")
    stored = stored_comparison(loop, view, visit, "Stored one")
    running = [
        Reply("tiny-a", "Tiny A", "", answer="so f", state="answering"),
        Reply("tiny-b", "Tiny B", "", answer="done", state="done"),
    ]
    visit.compare.turns.append(Turn(text="Running one", columns=running))
    visit.compare.system_prompt = "be brief"  # the run's (the page's box may say another by now)
    left = visit.compare.conversation_id
    loop.run(view.reopen(stored, visit, "tiny-a", ""))
    assert [t.text for t in visit.compare.turns] == ["Stored one"]
    kept = history.load("compares-twice", left)
    assert (kept.kind, kept.model, kept.system_prompt) == ("compare", "tiny-a,tiny-b", "be brief")
    (turn,) = kept.turns
    assert [(r.model, r.state, r.answer) for r in turn.replies] == [
        ("tiny-a", "stopped", "so f"),
        ("tiny-b", "done", "done"),
    ]
    assert running[0].state == "stopped"  # so the run stops showing (its view sees it let go)


def test_a_comparison_whose_store_failed_on_opening_another_stays_and_stops(
    loop, views, monkeypatch: pytest.MonkeyPatch
):
    """The database refused its store (simulated): the comparison stays open, and its run stops
    (marked stopped, it went on in the engine with its view frozen)."""
    view, history = views
    visit = Visit(browser_id="store-refused-compare")
    stored = stored_comparison(loop, view, visit, "Stored one")
    running = Reply("tiny-a", "Tiny A", "", answer="so f", state="answering")
    visit.compare.turns.append(Turn(text="Running one", columns=[running]))
    shown = visit.compare
    refuse_every_store(monkeypatch, history)
    *_, notice = loop.run(view.reopen(stored, visit, "tiny-a", ""))
    assert visit.compare is shown and notice == KEPT_OPEN
    assert shown.stop_requested and running.state == "stopped"


def test_an_answers_place_in_the_allowance_is_held_while_it_streams_and_given_back_however_it_ends(
    loop, views
):
    """`app.views.fairness` on the real engine: a chat answer holds one place of its visitor's and
    its address's allowance while it streams, and gives it back when it ends, when the visitor
    presses Stop, and when the page goes (Gradio closes the handler mid-answer), with the garbage
    collector off so that only the handler's own code can give it back."""
    view, _ = views
    allowance = view.playground.allowance
    _, visit = view.playground.sessions.attach(None, "page")
    visit.browser_id = visit.counted_as = "allowance-visitor"
    visit.address = "203.0.113.7"

    async def ask(until: str, tokens: int) -> list[Any]:
        message = {"text": "Count to a thousand.", "files": []}
        updates = view.chat.send(message, visit, "tiny-a", "", 0.0, 1.0, tokens, 0)
        seen, before = [], len(visit.chat.turns)
        async for _ in updates:
            if len(visit.chat.turns) > before and visit.chat.turns[-1].answer:
                seen.append(dict(allowance.running))
                if until == "stop":
                    view.chat.stop(visit)
                elif until == "closed":
                    await updates.aclose()  # as Gradio does when the page goes
                    break
        return seen

    gc.disable()
    try:
        for until, tokens in (("end", 8), ("stop", 4000), ("closed", 4000)):
            seen = loop.run(ask(until, tokens))
            assert seen and seen[0] == {"visitor allowance-visitor": 1, "address 203.0.113.7": 1}, until
            assert not allowance.running, until
    finally:
        gc.enable()
