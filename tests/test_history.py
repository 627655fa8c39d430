"""The history database (`app.storage.history`) on SQLite and on a real PostgreSQL server: what a user
stores, reopens, renames, exports and deletes, what another browser cannot reach, what is left
on disk after a delete, migrations, and two app processes writing at once."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from postgres import postgres_server
from sqlalchemy import create_engine, text

from app.storage.history import (
    IMPORT_LIMITS,
    Base,
    ConversationRecord,
    Export,
    History,
    HistoryError,
    MediaRecord,
    ReplyRecord,
    TurnRecord,
    VoteRecord,
    describe_media,
    new_id,
    sqlite_url,
    thumbnail,
)
from app.storage.votes import Vote

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with postgres_server() as url:
        yield url


def fresh_database(kind: str, postgres_url: str, folder: Path) -> str:
    if kind == "sqlite":
        return sqlite_url(folder)
    name = f"t_{new_id()}"
    with create_engine(postgres_url, isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    return postgres_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    postgres_url = request.getfixturevalue("postgres") if request.param == "postgresql" else ""
    return fresh_database(request.param, postgres_url, tmp_path / "db")


@pytest.fixture
def history(url: str, tmp_path: Path) -> Iterator[History]:
    store = History(url, tmp_path / "media")
    yield store
    store.close()


def picture(folder: Path, name: str, colour: str) -> Path:
    path = folder / name
    Image.new("RGB", (64, 48), colour).save(path)
    return path


def conversation(history: History, browser: str, folder: Path, *colours: str) -> ConversationRecord:
    """A chat of one turn per colour, each with a picture of it, saved for `browser`."""
    files, turns = {}, []
    for colour in colours:
        path = picture(folder, f"{colour}.png", colour)
        medium = describe_media(path, f"{colour}.png", "image", "image, 64×48 px")
        files[medium.hash] = path
        reply = ReplyRecord(model="demo_seeing", answer=colour, prompt_tokens=30, ttft_s=0.2)
        turns.append(TurnRecord(text=f"What colour is this {colour} thing?", media=[medium], replies=[reply]))
    record = ConversationRecord(id=new_id(), model="demo_seeing", turns=turns)
    history.save(browser, record, files)
    return record


def media_on_disk(history: History) -> set[str]:
    return {p.stem for p in history.media_dir.rglob("*") if p.is_file()}


def row_count(history: History, table: str) -> int:
    with history.engine.connect() as connection:
        return connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()  # noqa: S608 (our names)


def test_a_conversation_is_stored_listed_reopened_and_renamed(history: History, tmp_path: Path):
    first = conversation(history, "browser-1", tmp_path, "red")
    second = conversation(history, "browser-1", tmp_path, "blue", "green")
    listed = history.list("browser-1")
    assert [s.id for s in listed] == [second.id, first.id]  # the latest first
    assert listed[0].title == "What colour is this blue thing?" and listed[0].turns == 2
    reopened = history.load("browser-1", second.id)
    assert [t.replies[0].answer for t in reopened.turns] == ["blue", "green"]
    assert reopened.turns[1].media[0].name == "green.png"
    assert (
        history.media_file("browser-1", reopened.turns[1].media[0].hash).read_bytes()
        == (tmp_path / "green.png").read_bytes()
    )
    history.rename("browser-1", first.id, "  My   red one ")
    assert history.list("browser-1")[1].title == "My red one"
    with pytest.raises(HistoryError, match="Write a name"):
        history.rename("browser-1", first.id, "   ")


def test_another_browser_can_neither_see_nor_touch_a_conversation(history: History, tmp_path: Path):
    mine = conversation(history, "browser-1", tmp_path, "red")
    assert history.list("browser-2") == []
    for attempt in (
        lambda: history.load("browser-2", mine.id),
        lambda: history.rename("browser-2", mine.id, "taken"),
        lambda: history.delete("browser-2", mine.id),
        lambda: history.save("browser-2", mine),
    ):
        with pytest.raises(HistoryError):
            attempt()
    assert history.load("browser-1", mine.id).turns[0].replies[0].answer == "red"


def test_a_deleted_conversation_leaves_no_rows_and_no_files_it_alone_held(history: History, tmp_path: Path):
    kept = conversation(history, "browser-1", tmp_path, "red")
    gone = conversation(history, "browser-1", tmp_path, "red", "blue")
    red, blue = (t.media[0].hash for t in gone.turns)
    assert media_on_disk(history) == {red, blue}
    history.delete("browser-1", gone.id)
    assert [s.id for s in history.list("browser-1")] == [kept.id]
    # The red picture is still in the other conversation; the blue one is gone with its row.
    assert media_on_disk(history) == {red}
    assert history.media_file("browser-1", blue) is None and history.thumbnail("browser-1", blue) is None
    history.delete("browser-1", kept.id)
    assert media_on_disk(history) == set()
    for table in ("conversations", "turns", "media", "media_links", "media_owners"):
        assert row_count(history, table) == 0, table


def test_a_rewritten_turn_drops_the_picture_it_no_longer_holds(history: History, tmp_path: Path):
    """Undo and regenerate save the conversation again: a picture no turn holds is deleted."""
    record = conversation(history, "browser-1", tmp_path, "red", "blue")
    history.save("browser-1", record.model_copy(update={"turns": record.turns[:1]}))
    assert media_on_disk(history) == {record.turns[0].media[0].hash}


def test_export_and_import_round_trip_and_a_bad_file_is_one_line(history: History, tmp_path: Path):
    record = conversation(history, "browser-1", tmp_path, "red")
    exported = history.export("browser-1", record.id)
    assert str(tmp_path) not in exported  # no server paths
    data = json.loads(exported)
    assert data["conversation"]["turns"][0]["replies"][0]["answer"] == "red"
    assert data["thumbnails"][record.turns[0].media[0].hash]
    imported = history.import_json("browser-2", exported)
    assert imported.id != record.id and imported.turns == record.turns
    assert [s.id for s in history.list("browser-2")] == [imported.id]
    for bad in (b"not json", b'{"format": "other"}', exported.replace('"red"', "7")):
        with pytest.raises(HistoryError) as refused:
            history.import_json("browser-2", bad)
        message = str(refused.value)
        assert "\n" not in message and "Error" not in message and message.startswith("That file is not")


# --- edit and branch: a turn's other versions, kept with it ---


def asked(folder: Path, files: dict[str, Path], colour: str, text: str = "") -> TurnRecord:
    """A turn sending a picture of `colour` (its file put in `files`), answered with the colour."""
    path = picture(folder, f"{colour}.png", colour)
    medium = describe_media(path, f"{colour}.png", "image", "image, 64×48 px")
    files[medium.hash] = path
    reply = ReplyRecord(model="demo_seeing", answer=colour, prompt_tokens=30, ttft_s=0.2)
    return TurnRecord(text=text or f"What colour is this {colour} thing?", media=[medium], replies=[reply])


def branched(folder: Path) -> tuple[ConversationRecord, dict[str, Path]]:
    """A chat whose first message (blue) was edited into the one shown (red): the blue branch
    goes on with a lime turn, itself edited from a green one, so that versions nest two deep.
    Only the red picture is on the shown path."""
    files: dict[str, Path] = {}
    green = asked(folder, files, "green", "And this one?")
    lime = asked(folder, files, "lime", "And this one?").model_copy(
        update={"versions": [[green]], "shown_at": 1}
    )
    blue = asked(folder, files, "blue")
    red = asked(folder, files, "red").model_copy(update={"versions": [[blue, lime]], "shown_at": 1})
    follow_up = TurnRecord(text="Is it bright?", replies=[ReplyRecord(model="demo_seeing", answer="yes")])
    return ConversationRecord(id=new_id(), model="demo_seeing", turns=[red, follow_up]), files


def hash_of(turn: TurnRecord) -> str:
    return turn.media[0].hash


def test_versions_nested_two_deep_come_back_as_they_were_saved(history: History, tmp_path: Path):
    record, files = branched(tmp_path)
    history.save("browser-1", record, files)
    reopened = history.load("browser-1", record.id)
    assert reopened.turns == record.turns
    (blue, lime), green = reopened.turns[0].versions[0], reopened.turns[0].versions[0][1].versions[0][0]
    assert (reopened.turns[0].shown_at, lime.shown_at) == (1, 1)
    assert [t.replies[0].answer for t in (blue, lime, green)] == ["blue", "lime", "green"]
    # The list counts the shown path's turns only.
    assert history.list("browser-1")[0].turns == 2


def test_a_picture_only_a_hidden_version_holds_is_kept_until_no_version_holds_it(
    history: History, tmp_path: Path
):
    record, files = branched(tmp_path)
    red_turn = record.turns[0]
    blue_turn, lime_turn = red_turn.versions[0]
    red, blue, lime, green = (hash_of(t) for t in (red_turn, blue_turn, lime_turn, lime_turn.versions[0][0]))
    history.save("browser-1", record, files)
    assert media_on_disk(history) == {red, blue, lime, green}
    # Saved again after the next answer (no new files): the hidden versions' pictures stay.
    history.save("browser-1", record)
    assert media_on_disk(history) == {red, blue, lime, green}
    for digest in (blue, green):
        assert history.media_file("browser-1", digest) is not None and history.thumbnail("browser-1", digest)
    # The green version, two deep, dropped: its picture goes, row and file.
    no_green = lime_turn.model_copy(update={"versions": [], "shown_at": 0})
    history.save(
        "browser-1",
        record.model_copy(
            update={
                "turns": [
                    red_turn.model_copy(update={"versions": [[blue_turn, no_green]]}),
                    *record.turns[1:],
                ]
            }
        ),
    )
    assert media_on_disk(history) == {red, blue, lime}
    assert history.media_file("browser-1", green) is None and history.thumbnail("browser-1", green) is None
    # The whole blue branch dropped: only the shown red picture is left.
    alone = red_turn.model_copy(update={"versions": [], "shown_at": 0})
    history.save("browser-1", record.model_copy(update={"turns": [alone, *record.turns[1:]]}))
    assert media_on_disk(history) == {red}
    assert row_count(history, "media") == 1 and row_count(history, "media_links") == 1
    assert row_count(history, "media_owners") == 1


def test_export_and_import_keep_versions_and_a_version_1_file_still_imports(history: History, tmp_path: Path):
    record, files = branched(tmp_path)
    history.save("browser-1", record, files)
    exported = history.export("browser-1", record.id)
    data = json.loads(exported)
    assert data["version"] == 2
    green = hash_of(record.turns[0].versions[0][1].versions[0][0])
    assert data["thumbnails"][green]  # a hidden version's picture, two deep
    imported = history.import_json("browser-2", exported)
    assert imported.turns == record.turns
    # A file exported before versions existed: no versions fields, version 1.
    old = conversation(history, "browser-1", tmp_path, "red", "blue")
    data = json.loads(history.export("browser-1", old.id))
    data["version"] = 1
    for turn in data["conversation"]["turns"]:
        del turn["versions"], turn["shown_at"]
    imported = history.import_json("browser-2", json.dumps(data))
    assert imported.turns == old.turns and all(not t.versions for t in imported.turns)


def hidden_past_a_limit(kind: str) -> ConversationRecord:
    """A record within every limit on its shown path, past one in a version of a version."""
    medium = MediaRecord(hash="0" * 64, name="x.png", kind="image")
    if kind == "turns":  # with the two turns above them, one more than the limit
        hidden = [TurnRecord(text="t")] * (IMPORT_LIMITS.turns - 1)
    elif kind == "files":
        hidden = [TurnRecord(text="t", media=[medium] * (IMPORT_LIMITS.media_per_turn + 1))]
    elif kind == "answers":
        hidden = [
            TurnRecord(text="t", replies=[ReplyRecord(model="m")] * (IMPORT_LIMITS.replies_per_turn + 1))
        ]
    else:
        hidden = [
            TurnRecord(
                text="t", replies=[ReplyRecord(model="m", answer="a" * (IMPORT_LIMITS.field_chars + 1))]
            )
        ]
    earlier = TurnRecord(text="earlier", versions=[hidden])
    return ConversationRecord(id=new_id(), turns=[TurnRecord(text="shown", versions=[[earlier]], shown_at=1)])


@pytest.mark.parametrize("kind", ["turns", "files", "answers", "characters"])
def test_an_import_past_its_limits_in_a_hidden_version_is_refused_in_one_line(history: History, kind: str):
    with pytest.raises(HistoryError) as refused:
        history.import_json("bulky", Export(conversation=hidden_past_a_limit(kind)).model_dump_json())
    line = str(refused.value)
    assert "\n" not in line and "at most" in line and "Error" not in line
    assert history.list("bulky") == []


def nested(depth: int) -> TurnRecord:
    """A turn whose versions nest `depth` deep (each version's turn holding the next)."""
    turn = TurnRecord(text="t")
    for _ in range(depth):
        turn = TurnRecord(text="t", versions=[[turn]])
    return turn


def deeply_nested_json(depth: int) -> str:
    """An export whose versions nest `depth` deep, written by hand: Python's own JSON encoder
    and pydantic's serializer stop far sooner."""
    turn = '{"text": "t", "versions": [[' * depth + '{"text": "t"}' + "]]}" * depth
    head = '{"format": "vlm-playground-conversation", "version": 2, "conversation": '
    return head + f'{{"id": "{new_id()}", "turns": [{turn}]}}}}'


def test_versions_nested_past_the_limit_are_refused_in_one_line(history: History):
    within = Export(conversation=ConversationRecord(id=new_id(), turns=[nested(IMPORT_LIMITS.version_depth)]))
    assert history.import_json("deep", within.model_dump_json()).turns == within.conversation.turns
    past = Export(
        conversation=ConversationRecord(id=new_id(), turns=[nested(IMPORT_LIMITS.version_depth + 1)])
    )
    with pytest.raises(HistoryError, match=rf"at most {IMPORT_LIMITS.version_depth} levels") as refused:
        history.import_json("deeper", past.model_dump_json())
    assert "\n" not in str(refused.value)
    # Far deeper (a hostile file): JSON's parser refuses it first, in the usual line.
    with pytest.raises(HistoryError) as refused:
        history.import_json("deeper", deeply_nested_json(5000))
    line = str(refused.value)
    assert line.startswith("That file is not a conversation exported from VLM Playground (")
    assert "\n" not in line and "Error" not in line and "(:" not in line
    assert history.list("deeper") == []
    # And the limits' own check, given such a record built in Python, answers in one line too.
    with pytest.raises(HistoryError, match="levels"):
        IMPORT_LIMITS.check(Export(conversation=ConversationRecord(id=new_id(), turns=[nested(5000)])))


def test_without_stored_media_only_thumbnails_are_kept(url: str, tmp_path: Path):
    history = History(url, tmp_path / "media", store_media=False)
    try:
        record = conversation(history, "browser-1", tmp_path, "red")
        digest = record.turns[0].media[0].hash
        assert media_on_disk(history) == set() and history.media_file("browser-1", digest) is None
        with Image.open(__import__("io").BytesIO(history.thumbnail("browser-1", digest))) as thumb:
            assert thumb.getpixel((0, 0))[0] > 200  # red
    finally:
        history.close()


def test_media_files_expire_after_the_retention_and_thumbnails_stay(url: str, tmp_path: Path):
    now = [1000.0]
    history = History(url, tmp_path / "media", retention_s=3600, clock=lambda: now[0])
    try:
        record = conversation(history, "browser-1", tmp_path, "red")
        digest = record.turns[0].media[0].hash
        now[0] += 1800
        assert history.expire_media() == 0 and history.media_file("browser-1", digest) is not None
        now[0] += 3600
        assert history.expire_media() == 1
        assert history.media_file("browser-1", digest) is None and media_on_disk(history) == set()
        assert history.thumbnail("browser-1", digest) and history.load("browser-1", record.id).turns[0].media
    finally:
        history.close()


def newest_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from app.storage.history import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config).get_current_head() or ""


def test_the_migrations_match_the_tables_and_running_them_again_keeps_the_data(history: History, url: str):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    record = ConversationRecord(id=new_id(), turns=[TurnRecord(text="kept")])
    history.save("browser-1", record)
    with history.engine.connect() as connection:
        context = MigrationContext.configure(connection)
        assert compare_metadata(context, Base.metadata) == []
        assert context.get_current_revision() == newest_revision()
    again = History(url, history.media_dir)  # an app restart or an upgrade
    assert again.load("browser-1", record.id).turns[0].text == "kept"
    again.close()


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from app.storage.history import ConversationRecord, History, ReplyRecord, TurnRecord, new_id
    url, media, browser, count = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    history = History(url, media)
    for index in range(count):
        turn = TurnRecord(text=f"{browser} {index}", replies=[ReplyRecord(model="m", answer="a")])
        record = ConversationRecord(id=new_id(), turns=[turn])
        history.save(browser, record)
        history.save(browser, record.model_copy(update={"turns": [turn, turn]}))
        history.rename(browser, record.id, f"renamed {index}")
    print("done")
    """
)


def test_two_app_processes_write_at_once(url: str, tmp_path: Path):
    """Two replicas on one database (PostgreSQL), or two processes on one SQLite file."""
    History(url, tmp_path / "media").close()  # migrated once, as the first replica does
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, str(tmp_path / "media"), browser, "60"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for browser in ("browser-1", "browser-2")
    ]
    for writer in writers:
        out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0 and out.strip() == "done", err[-2000:]
    history = History(url, tmp_path / "media")
    try:
        for browser in ("browser-1", "browser-2"):
            listed = history.list(browser)
            assert len(listed) == 60 and all(s.turns == 2 and s.title.startswith("renamed") for s in listed)
    finally:
        history.close()


MIGRATOR = (
    "import sys; from pathlib import Path; from app.storage.history import History; "
    "History(sys.argv[1], Path(sys.argv[2])).close()"
)


def test_app_processes_starting_at_once_on_a_new_database_all_start(url: str, tmp_path: Path):
    """Replicas started together each run the migrations: they take turns instead of failing."""
    starting = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATOR, url, str(tmp_path / "media")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for process in starting:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-2000:]


# --- a property: whatever a browser does, the list and the disk say what it kept ---

Action = st.one_of(
    st.tuples(
        st.just("save"), st.integers(0, 2), st.lists(st.sampled_from(["red", "blue", "lime"]), max_size=3)
    ),
    st.tuples(st.just("delete"), st.integers(0, 2), st.integers(0, 5)),
    st.tuples(st.just("import"), st.integers(0, 2), st.integers(0, 5)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(Action, max_size=12))
def test_whatever_users_do_the_lists_and_the_media_folder_hold_exactly_what_they_kept(
    tmp_path_factory: pytest.TempPathFactory, actions: list[tuple]
):
    folder = tmp_path_factory.mktemp("property")
    history = History(sqlite_url(folder), folder / "media")
    kept: dict[str, dict[str, ConversationRecord]] = {f"browser-{i}": {} for i in range(3)}
    try:
        for action, who, detail in actions:
            browser = f"browser-{who}"
            mine = list(kept[browser])
            if action == "save":
                record = conversation(history, browser, folder, *detail)
                kept[browser][record.id] = record
            elif mine and action == "delete":
                chosen = mine[detail % len(mine)]
                history.delete(browser, chosen)
                del kept[browser][chosen]
            elif mine and action == "import":
                source = kept[browser][mine[detail % len(mine)]]
                other = f"browser-{(who + 1) % 3}"
                imported = history.import_json(other, history.export(browser, source.id))
                kept[other][imported.id] = imported
        for browser, records in kept.items():
            assert {s.id for s in history.list(browser)} == set(records)
        held = {
            m.hash for records in kept.values() for r in records.values() for t in r.turns for m in t.media
        }
        assert media_on_disk(history) == held
    finally:
        history.close()


def database_at(url: str, revision: str, *statements: str, parameters: dict[str, Any] | None = None) -> None:
    """A database made by the app's schema at `revision` (an older version of the app), holding
    the rows `statements` insert (each given the `parameters` it names)."""
    from alembic import command
    from alembic.config import Config

    from app.storage.history import MIGRATIONS, make_engine

    engine = make_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        for statement in statements:
            named = {name: value for name, value in (parameters or {}).items() if f":{name}" in statement}
            connection.execute(text(statement), named)
    engine.dispose()


def test_an_upgrade_from_the_first_version_keeps_its_conversations(url: str, tmp_path: Path):
    """A database made by version 0001 (before the votes), upgraded by today's app."""
    database_at(
        url,
        "0001",
        "INSERT INTO conversations VALUES "
        "('0123456789abcdef0123456789abcdef', 'browser-1', 'chat', 'Old', '', '', 1.0, 2.0)",
        "INSERT INTO turns (conversation_id, position, text, media, replies) VALUES "
        "('0123456789abcdef0123456789abcdef', 0, 'An old question', '[]', '[]')",
    )
    history = History(url, tmp_path / "media")
    try:
        assert [s.title for s in history.list("browser-1")] == ["Old"]
        assert history.votes() == []
        # Version 0003's grid fields are empty on the turns made before it.
        (turn,) = history.load("browser-1", "0123456789abcdef0123456789abcdef").turns
        assert (turn.text, turn.item_id, turn.expected) == ("An old question", "", "")
    finally:
        history.close()


def test_an_upgrade_from_version_0004_reads_its_turns_as_without_versions(url: str, tmp_path: Path):
    """A database made by version 0004 (before edit and branch), with a turn holding a picture,
    upgraded by today's app: the turn has no other versions and still holds its picture."""
    digest = "ab" * 32
    old_turn = {
        "media": json.dumps([{"hash": digest, "name": "old.png", "kind": "image"}]),
        "replies": json.dumps([{"model": "m", "answer": "a square"}]),
        "hash": digest,
    }
    database_at(
        url,
        "0004",
        "INSERT INTO conversations (id, browser_id, kind, title, model, system_prompt, created_at, "
        "updated_at, version) VALUES ('0123456789abcdef0123456789abcdef', 'browser-1', 'chat', 'Old', "
        "'', '', 1.0, 2.0, 3)",
        "INSERT INTO turns (conversation_id, position, text, media, replies) VALUES "
        "('0123456789abcdef0123456789abcdef', 0, 'What is this?', :media, :replies)",
        "INSERT INTO media (hash, kind, suffix, size, thumbnail, stored_at) "
        "VALUES (:hash, 'image', '.png', 5, '', 1.0)",
        "INSERT INTO media_links (turn_id, hash) SELECT id, :hash FROM turns",
        "INSERT INTO media_owners (hash, browser_id, has_file) VALUES (:hash, 'browser-1', true)",
        parameters=old_turn,
    )
    history = History(url, tmp_path / "media")
    try:
        with history.engine.connect() as connection:
            assert connection.execute(text("SELECT shown_at FROM turns")).scalar_one() == 0
        record = history.load("browser-1", "0123456789abcdef0123456789abcdef")
        (turn,) = record.turns
        assert (turn.text, turn.versions, turn.shown_at) == ("What is this?", [], 0)
        assert turn.media[0].hash == digest and turn.replies[0].answer == "a square" and record.version == 3
        assert row_count(history, "media_links") == 1  # the upgrade kept the turn's hold on it
        history.save("browser-1", record.model_copy(update={"turns": []}))
        assert row_count(history, "media") == 0
    finally:
        history.close()


def test_a_downgrade_past_edit_and_branch_keeps_the_turns_hold_on_their_pictures(
    history: History, tmp_path: Path
):
    """Going back to 0004 through the app's own engine (SQLite with foreign keys on): the turns'
    new columns are dropped in place, not by copying the table, whose drop would cascade through
    the media links and leave every picture unheld."""
    from alembic import command
    from alembic.config import Config

    from app.storage.history import MIGRATIONS

    conversation(history, "browser-1", tmp_path, "red", "blue")
    assert row_count(history, "media_links") == 2
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with history.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0004")
    assert row_count(history, "turns") == 2 and row_count(history, "media_links") == 2


def test_votes_are_stored_and_read_back_per_modality(history: History):
    battle = new_id()
    history.add_votes(
        [
            VoteRecord(
                battle_id=battle, browser_id="b", model_a="x", model_b="y", outcome="a", modality="image"
            ),
            VoteRecord(
                battle_id=battle, browser_id="b", model_a="y", model_b="x", outcome="tie", modality="text"
            ),
        ]
    )
    assert sorted(history.votes(), key=str) == sorted([Vote("x", "y", "a"), Vote("y", "x", "tie")], key=str)
    assert history.votes("image") == [Vote("x", "y", "a")]
    with pytest.raises(ValueError):
        VoteRecord(
            battle_id=battle, browser_id="b", model_a="x", model_b="y", outcome="maybe", modality="text"
        )


def test_two_votes_at_the_same_moment_cannot_both_slip_under_the_limit(url: str, tmp_path: Path):
    """Two app processes (or threads) checking the hourly limit at once: one vote gets the last
    place, the other is refused."""
    import threading

    history = History(url, tmp_path / "media")
    try:
        limit, refused, start = 3, [], threading.Barrier(4)

        def check(by_browser: list[float], _by_client: list[float]) -> None:
            if len(by_browser) >= limit:
                raise HistoryError("over the limit")

        def vote() -> None:
            record = VoteRecord(
                battle_id=new_id(), browser_id="racer", model_a="x", model_b="y", outcome="a", modality="text"
            )
            start.wait()
            try:
                history.add_vote_checked(record, 0.0, check)
            except HistoryError:
                refused.append(1)

        threads = [threading.Thread(target=vote) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(history.votes()) == limit and len(refused) == 1
    finally:
        history.close()


def test_the_list_tells_alike_titles_apart_by_model_turns_and_time():
    from app.storage.history import Summary
    from app.views.history import summary_label

    at = time.mktime((2026, 11, 25, 9, 30, 0, 0, 0, -1))
    chat = Summary(id="a", kind="chat", title="What is this?", model="demo_seeing", turns=2, updated_at=at)
    other = Summary(id="b", kind="chat", title="What is this?", model="gone_model", turns=1, updated_at=at)
    names = {"demo_seeing": "Shapes and colours"}
    assert summary_label(chat, names) == "What is this? · Shapes and colours · 2 turns · 25 Nov 09:30"
    assert summary_label(other, names) == "What is this? · gone_model · 1 turn · 25 Nov 09:30"


def test_a_thumbnail_is_made_only_of_a_picture_the_chat_would_take(tmp_path: Path):
    """The history makes thumbnails in the server's process: a picture past the media pipeline's
    pixel limit (81 megapixels in 97 KB grew the process by 389 MiB in a hostile review) or in a
    format the chat refuses is not decoded, and the record is kept without one."""
    ordinary, huge, other = tmp_path / "ok.png", tmp_path / "huge.png", tmp_path / "scan.tiff"
    Image.new("RGB", (640, 480), "red").save(ordinary)
    Image.new("1", (9000, 9000)).save(huge)
    Image.new("RGB", (640, 480), "red").save(other)
    with Image.open(io.BytesIO(thumbnail(ordinary))) as small:
        assert max(small.size) <= 160 and small.getpixel((10, 10))[0] > 200
    assert thumbnail(huge) == b"" and thumbnail(other) == b""
