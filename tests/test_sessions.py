"""Tabs' sessions: a reload finds its conversation, a closed tab's files go, and nothing is
kept past its bounds, whatever tabs open, reload, close or go silent, and in whatever order.
Real folders and files; the clock is the test's."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.conversation import SESSION_FOLDER_PREFIX, SESSION_FOLDER_ROOT, Session
from app.domain.sessions import SessionStore

GRACE_S, TTL_S = 30.0, 600.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# Steps: a tab (0-3) opens or reloads, closes, uses its chat; or time passes.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("load"), st.integers(0, 3)),
        st.tuples(st.just("close"), st.integers(0, 3)),
        st.tuples(st.just("use"), st.integers(0, 3)),
        st.tuples(st.just("wait"), st.sampled_from([1.0, 10.0, GRACE_S, 200.0, TTL_S])),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(steps=STEPS)
def test_a_tab_keeps_its_conversation_across_reloads_and_its_files_go_within_bounds(
    steps: list[tuple[str, float]], tmp_path_factory
):
    upload_root = tmp_path_factory.mktemp("uploads")
    clock = Clock()
    store = SessionStore(GRACE_S, TTL_S, clock, scratch=tmp_path_factory.mktemp("scratch"))
    tokens: dict[int, str] = {}  # the tab's sessionStorage
    pages: dict[int, str] = {}  # the tab's live Gradio session
    folders: dict[str, Path] = {}
    last_seen: dict[str, float] = {}  # when a token last had a page or was used
    closed_at: dict[str, float] = {}
    written: list[Path] = []
    serial = 0
    for action, value in steps:
        tab = int(value)
        if action == "load":
            if tab in pages:
                store.detach(pages[tab])  # a reload ends the old page
            serial += 1
            pages[tab] = f"page-{serial}"
            before = tokens.get(tab)
            token, visit = store.attach(before, pages[tab])
            if before in folders and before == token:
                assert visit.chat.folder == folders[before]  # a reload finds its conversation
            tokens[tab] = token
            closed_at.pop(token, None)
            last_seen[token] = clock.now
        elif action == "close" and tab in pages:
            store.detach(pages.pop(tab))
            closed_at[tokens[tab]] = clock.now
            tokens.pop(tab)  # a closed tab's sessionStorage is gone
        elif action == "use" and tab in pages:
            visit = store.visits.get(tokens[tab])
            if visit is not None:
                upload = upload_root / f"upload-{serial}-{tab}.png"
                upload.write_bytes(b"png")
                written.append(upload)
                visit.chat.keep(upload)
                store.touch(visit)
                folders[tokens[tab]] = visit.chat.folder
                last_seen[tokens[tab]] = clock.now
        elif action == "wait":
            clock.now += value
            store.sweep()
        for token, folder in folders.items():
            live = token in store.visits
            if token in closed_at and clock.now - closed_at[token] >= GRACE_S:
                assert not live and not folder.exists()  # a closed tab's files go after the grace
            if clock.now - last_seen[token] >= TTL_S:
                assert not live and not folder.exists()  # nothing outlives the TTL
            if token in tokens.values() and clock.now - last_seen[token] < TTL_S:
                assert live  # an open tab's conversation stays
    store.close()
    assert not any(folder.exists() for folder in folders.values())
    # The uploads are Gradio's (shared by identical uploads of other tabs): its sweep takes them.
    assert all(upload.exists() for upload in written)


def test_folders_left_by_a_process_that_died_are_swept_once_old(tmp_path: Path):
    store = SessionStore(GRACE_S, TTL_S, scratch=tmp_path)
    old, recent = tmp_path / f"{SESSION_FOLDER_PREFIX}old", tmp_path / f"{SESSION_FOLDER_PREFIX}recent"
    for folder in (old, recent):
        folder.mkdir()
        (folder / "0000.png").write_bytes(b"png")
    stale = time.time() - TTL_S - 60
    os.utime(old, (stale, stale))
    unrelated = tmp_path / "someone-else"
    unrelated.mkdir()
    os.utime(unrelated, (stale, stale))
    store.sweep()
    assert not old.exists() and recent.exists() and unrelated.exists()


def test_another_live_app_processs_folders_are_left_to_it_and_a_dead_ones_are_swept(tmp_path: Path):
    """Two app processes sharing one temporary folder: neither sweeps the other's live sessions."""
    import subprocess
    import sys

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        stale = time.time() - TTL_S - 60
        folders = {}
        for who, pid in (("alive", alive.pid), ("dead", dead.pid)):
            folders[who] = tmp_path / f"{SESSION_FOLDER_ROOT}{pid}-abc"
            folders[who].mkdir()
            os.utime(folders[who], (stale, stale))
        SessionStore(GRACE_S, TTL_S, scratch=tmp_path).sweep()
        assert folders["alive"].exists() and not folders["dead"].exists()
    finally:
        alive.kill()
        alive.wait()


def test_an_upload_gone_before_sending_is_one_line_to_attach_it_again(tmp_path: Path):
    import pytest

    from app.domain.conversation import ConversationError

    session = Session()
    with pytest.raises(ConversationError, match=r"^photo\.png is no longer on the server.*attach it again"):
        session.keep(tmp_path / "photo.png")
    session.close()


def test_a_tab_running_an_uploaded_set_keeps_its_files_however_old_and_they_go_with_the_tab(
    tmp_path: Path, monkeypatch
):
    """The grid's set, uploaded as a zip hours ago, is still the tab's while the tab is used;
    the sweeper takes it only with the tab (or after a crash, once old)."""
    import tempfile
    import zipfile

    from app.domain.grid import GridWork
    from app.domain.promptsets import Checked, read_set

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the app makes its folders
    clock = Clock()
    store = SessionStore(GRACE_S, TTL_S, clock, scratch=tmp_path)
    upload = tmp_path / "uploads"
    upload.mkdir()
    (upload / "set.jsonl").write_text('{"id": "a", "question": "What is it?", "media": ["a.png"]}\n')
    with zipfile.ZipFile(upload / "files.zip", "w") as archive:
        archive.writestr("a.png", b"png")
    _token, visit = store.attach(None, "page-1")
    prompt_set = read_set(upload / "set.jsonl", upload / "files.zip")
    visit.grid = GridWork(prompt_set, Checked())
    unpacked = prompt_set.unpacked
    assert unpacked is not None and unpacked.name.startswith(SESSION_FOLDER_PREFIX)
    for _ in range(3):  # hours of use: the folders' files are older than the TTL
        stale = time.time() - 3 * TTL_S
        for folder in (unpacked, visit.grid.folder):
            os.utime(folder, (stale, stale))
        clock.now += TTL_S / 2
        store.touch(visit)
        store.sweep()
        assert (unpacked / "a.png").is_file() and visit.grid.folder.is_dir()
    run_folder = visit.grid.folder
    store.detach("page-1")
    clock.now += GRACE_S
    store.sweep()
    assert not unpacked.exists() and not run_folder.exists()
