"""Edit and branch: a chat's messages edited and sent again, answers regenerated, each a new
version of its place; no version is ever lost, and the history stores and reopens them all.

The versions are driven by hypothesis as a user would: sending, editing any earlier message,
regenerating, switching between versions and undoing, in any order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from app.domain.conversation import MAX_VERSION_DEPTH, MAX_VERSIONS, ConversationError, Session, Turn
from app.domain.replies import Reply
from app.domain.sessions import Visit
from app.storage.history import ConversationRecord, TurnRecord
from app.views.chat import ChatView, menus_shape
from app.views.history import record_of


def answered(text: str) -> Turn:
    turn = Turn(text=text)
    turn.reply = Reply(key="m", display_name="M", source="m", answer=f"answer to {text}", state="done")
    return turn


def shape(turns: list[Turn], version_of: Any = None) -> list[Any]:
    """What a user can reach from `turns`: each turn's text and, where it has several versions,
    every version's own reach (the shown one read from `turns` itself), in order. `version_of`:
    the versions `turns` is one of (expanded by the caller)."""
    result: list[Any] = []
    for position, turn in enumerate(turns):
        if turn.versions is None or turn.versions is version_of:
            result.append(turn.text)
            continue
        versions = [
            shape(turns[position:] if tail[0] is turn else tail, turn.versions)
            for tail in turn.versions.tails
        ]
        result.append((turn.text, turn.versions.place(turn), turn.versions.before, versions))
        break  # the rest of `turns` is inside the shown version
    return result


def record_shape(turns: list[TurnRecord]) -> list[Any]:
    """`shape` of a stored record: the same structure, read from the history's records."""
    result: list[Any] = []
    for position, turn in enumerate(turns):
        if not turn.versions:
            result.append(turn.text)
            continue
        plain = turn.model_copy(update={"versions": [], "shown_at": 0, "shown_before": 0})
        own = record_shape([plain, *turns[position + 1 :]])
        versions = [record_shape(v) for v in turn.versions]
        versions.insert(turn.shown_at, own)
        result.append((turn.text, turn.shown_at, turn.shown_before, versions))
        break
    return result


def reachable(session: Session) -> set[str]:
    return {turn.text for turn in session.every_turn()}


class Chatting(RuleBasedStateMachine):
    """A user's chat; every message's text is unique, so each turn can be followed."""

    def __init__(self) -> None:
        super().__init__()
        self.session = Session()
        self.count = 0
        self.alive: set[str] = set()  # every message sent and not undone

    def _new(self) -> Turn:
        self.count += 1
        turn = answered(f"message {self.count}")
        self.alive.add(turn.text)
        self.newest = turn
        return turn

    @precondition(lambda self: getattr(self, "newest", None) is not None)
    @rule()
    def newest_answer_fails(self) -> None:
        """The latest message's answer fails, after any undo or switch since it was sent."""
        turn, self.newest = self.newest, None
        assert turn is not None
        shown_last = bool(self.session.turns) and self.session.turns[-1] is turn
        before = list(self.session.turns[:-1])
        self.session.discard(turn)
        if shown_last:  # out of the chat, the rest as it was
            self.alive.discard(turn.text)
            assert self.session.turns[: len(before)] == before

    @rule()
    def send(self) -> None:
        self.session.turns.append(self._new())

    @precondition(lambda self: self.session.turns)
    @rule(data=st.data())
    def edit(self, data: st.DataObject) -> None:
        position = data.draw(st.integers(0, len(self.session.turns) - 1))
        before = list(self.session.turns)
        if self._full(position):  # refused in one line, nothing changed
            with pytest.raises(ConversationError, match="versions already"):
                self.session.branch(position, answered("refused"))
            assert self.session.turns == before
            return
        self.session.branch(position, self._new())
        assert self.session.turns[:position] == before[:position]  # what came before stays shown
        assert len(self.session.turns) == position + 1

    def _full(self, position: int) -> bool:
        versions = self.session.turns[position].versions
        return versions is not None and len(versions.tails) >= MAX_VERSIONS

    @precondition(lambda self: self.session.turns)
    @rule()
    def regenerate(self) -> None:
        last = self.session.turns[-1]
        if self._full(len(self.session.turns) - 1):
            return
        again = last.again()
        again.text = f"message {self.count + 1}"  # its own name, to follow it
        self.count += 1
        self.alive.add(again.text)
        self.newest = again
        self.session.branch(len(self.session.turns) - 1, again)
        assert last.versions is again.versions and last.versions is not None

    @precondition(lambda self: any(t.versions for t in self.session.turns))
    @rule(data=st.data())
    def switch_and_back(self, data: st.DataObject) -> None:
        places = [p for p, t in enumerate(self.session.turns) if t.versions is not None]
        position = data.draw(st.sampled_from(places))
        turn = self.session.turns[position]
        assert turn.versions is not None
        was, path = turn.versions.place(turn), list(self.session.turns)
        version = data.draw(st.integers(0, len(turn.versions.tails) - 1))
        self.session.switch(position, version)
        shown = self.session.turns[position]
        assert shown.versions is not None and shown.versions.place(shown) == version
        if data.draw(st.booleans()):
            self.session.switch(position, was)
            assert self.session.turns == path  # and back: the same chat, every later turn kept

    @precondition(lambda self: self.session.turns)
    @rule()
    def undo(self) -> None:
        dropped = self.session.drop_last()
        self.alive.discard(dropped.text)
        assert dropped not in self.session.turns

    @invariant()
    def nothing_lost_nothing_back(self) -> None:
        assert reachable(self.session) == self.alive

    @invariant()
    def versions_hang_together(self) -> None:
        for turn in self.session.every_turn():
            if turn.versions is None:
                continue
            assert len(turn.versions.tails) >= 2  # a single version is no choice
            assert all(tail[0].versions is turn.versions for tail in turn.versions.tails)
            assert turn.versions.place(turn) >= 0

    @invariant()
    def stored_as_shown(self) -> None:
        record, _, _ = record_of(self.session, "chat", "m", "")
        assert record_shape(list(record.turns)) == shape(self.session.turns)
        # The record survives the export's JSON (recursive versions included).
        again = ConversationRecord.model_validate_json(record.model_dump_json())
        assert again == record


TestChatting = Chatting.TestCase
TestChatting.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)


def test_switch_to_a_version_that_is_not_there_is_one_line() -> None:
    session = Session(turns=[answered("a")])
    with pytest.raises(ConversationError, match="no longer here"):
        session.switch(0, 1)
    with pytest.raises(ConversationError, match="no longer here"):
        session.switch(7, 0)


def test_undoing_an_edit_brings_back_the_version_shown_before_it() -> None:
    session = Session(turns=[answered("a"), answered("b"), answered("c")])
    session.branch(1, answered("b2"))
    session.switch(1, 0)  # back to b (then c)
    session.branch(1, answered("b3"))  # edited from b: b3 is the newest, b was shown before it
    assert [t.text for t in session.turns] == ["a", "b3"]
    session.drop_last()
    assert [t.text for t in session.turns] == ["a", "b", "c"]
    session.drop_last()  # c
    session.drop_last()  # b: b2 is what is left there
    assert [t.text for t in session.turns] == ["a", "b2"]
    assert session.turns[1].versions is None


@pytest.mark.parametrize("choice", ["", "x", None, 5, ["0:1"], "0:7", "9:0", "0:1:2", "-1:0", "1" * 400])
def test_a_made_up_version_choice_changes_nothing_and_says_so_in_a_line(choice: Any) -> None:
    """The Versions menu's pick comes from the page, or from anyone who posts to Gradio's queue:
    data, never trusted."""
    visit = Visit(browser_id="picker")
    visit.chat.turns += [answered("a"), answered("b")]
    visit.chat.branch(1, answered("b2"))
    before = list(visit.chat.turns)
    _, notice = ChatView(None).switch(choice, visit)  # type: ignore[arg-type]
    assert visit.chat.turns == before
    if isinstance(notice, str):  # a pick that looks like one: what to do instead, in one line
        assert notice.endswith("pick another.") and "\n" not in notice
    else:
        assert notice == gr.skip()


@pytest.mark.parametrize("choice", ["", "x", None, 3, "2", "-1", "0 ", "9" * 400])
def test_a_made_up_message_to_edit_changes_nothing_and_says_so_in_a_line(choice: Any) -> None:
    visit = Visit(browser_id="editor")
    visit.chat.turns += [answered("a"), answered("b")]
    box, notice, _ = ChatView(None).edit(choice, visit)  # type: ignore[arg-type]
    assert visit.chat.editing is None and box == gr.skip()
    assert notice.endswith("pick another.") and "\n" not in notice


def test_a_message_picked_to_edit_goes_into_the_box_with_its_files(tmp_path: Path) -> None:
    visit = Visit(browser_id="editor")
    picture = tmp_path / "0000.png"
    picture.write_bytes(b"not read here")
    first = answered("What is this?")
    first.images.append(picture)
    visit.chat.turns += [first, answered("b")]
    box, notice, cancel = ChatView(None).edit("0", visit)  # type: ignore[arg-type]
    assert visit.chat.editing == 0 and "Editing message 1" in notice
    assert box.value["text"] == "What is this?" and cancel.visible
    assert [Path(f["path"] if isinstance(f, dict) else f).name for f in box.value["files"]] == [picture.name]
    edit_menu, versions, _ = ChatView(None).menus(visit)  # type: ignore[arg-type]
    assert [label for label, _ in edit_menu.choices] == ["1. “What is this?” (+1 file)", "2. “b”"]
    assert not versions.visible


def test_a_file_put_back_in_the_box_is_sent_again_under_the_name_the_user_gave_it(tmp_path: Path) -> None:
    """Edit and Undo put a kept file back in the box; Gradio hands it back as a copy in its
    cache under the kept file's own name (0000.png): it is still the user's "holiday.png"."""
    session = Session()
    upload = tmp_path / "upload" / "holiday.png"
    upload.parent.mkdir()
    upload.write_bytes(b"\x89PNG one picture")
    kept = session.keep(upload)
    turn = answered("What is this?")
    turn.images.append(kept)
    turn.names[kept] = "holiday.png"
    session.turns.append(turn)
    copy = tmp_path / "gradio-cache" / kept.name
    copy.parent.mkdir()
    copy.write_bytes(kept.read_bytes())
    assert session.given_name(copy) == "holiday.png"
    other = tmp_path / "elsewhere" / kept.name  # another picture under the same plain name
    other.parent.mkdir()
    other.write_bytes(b"\x89PNG another picture")
    assert session.given_name(other) == kept.name
    session.close()


def test_a_place_takes_a_bounded_number_of_versions() -> None:
    """Every save stores every version: a place past MAX_VERSIONS is refused in one line."""
    session = Session(turns=[answered("a")])
    for n in range(MAX_VERSIONS - 1):
        session.branch(0, answered(f"a{n}"))
    with pytest.raises(ConversationError, match=f"has {MAX_VERSIONS} versions already"):
        session.branch(0, answered("one too many"))
    assert len(session.turns[0].versions.tails) == MAX_VERSIONS  # type: ignore[union-attr]


def test_versions_nest_no_deeper_than_an_import_may_hold(tmp_path: Path) -> None:
    """An edit inside a branch that an edit made, 64 times over: one more is refused in one line,
    so every chat stored loads back (an import holds at most as many levels; deeper ones, about
    255, did not load)."""
    from app.storage.history import History, ImportLimits, sqlite_url

    assert ImportLimits().version_depth == MAX_VERSION_DEPTH
    session = Session()
    for level in range(MAX_VERSION_DEPTH):
        session.turns.append(answered(f"m{level}"))
        session.branch(level, answered(f"edit {level}"))
    session.turns.append(answered("deeper"))
    with pytest.raises(ConversationError, match=f"versions within versions {MAX_VERSION_DEPTH} deep"):
        session.branch(MAX_VERSION_DEPTH, answered("one level too deep"))
    # A place that has versions already takes more of them (no deeper).
    session.branch(MAX_VERSION_DEPTH - 1, answered("another edit"))
    # Back to the first version at every place, deepest first: the record nests 64 levels, and
    # it is stored, read back, exported and imported.
    for level in reversed(range(MAX_VERSION_DEPTH)):
        session.switch(level, 0)
    record, files, _ = record_of(session, "chat", "m", "")
    assert ImportLimits._version_depth(record.turns) == MAX_VERSION_DEPTH
    history = History(sqlite_url(tmp_path), tmp_path / "media")
    try:
        history.save("browser", record, files)
        assert history.load("browser", session.conversation_id).turns == record.turns
        history.import_json("another browser", history.export("browser", session.conversation_id))
    finally:
        history.close()


def test_the_edit_menus_see_a_new_turn_where_an_old_ones_memory_was_reused():
    """The menus refresh where the chat's shape changed: told apart by `id()`, a turn undone and
    a new one made in its memory looked the same, and the menus kept the old message."""
    visit = Visit()
    visit.chat.turns.append(Turn(text="the first"))
    before = menus_shape(visit)
    for attempt in range(100):  # (CPython hands the freed memory to the next object of its size)
        visit.chat.turns.clear()
        visit.chat.turns.append(Turn(text=f"another {attempt}"))
        assert before is not None and not before.same_as(menus_shape(visit))
    same = menus_shape(visit)
    assert same is not None and same.same_as(menus_shape(visit))
