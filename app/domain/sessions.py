"""Browser sessions that outlive a reload and nothing else.

A tab keeps a random token (in its `sessionStorage`, so a reload keeps it and another tab has
its own); the store maps tokens to the tab's conversations. A Gradio session (one page load)
attaches to the token when the page loads and detaches when Gradio ends it (tab closed or
reloaded). A token with no page attached is deleted, files included, after `grace_s` unless a
reload takes it back first; a token nobody used for `ttl_s` is deleted too, and so are session
folders on disk that no live token owns (left by a process that died) once `ttl_s` old.
Nothing here knows about Gradio.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.domain.arena import Battle
from app.domain.conversation import SESSION_FOLDER_ROOT, Session
from app.domain.grid import GridWork

log = logging.getLogger(__name__)


@dataclass
class Visit:
    """What one tab holds: its chat and its comparison, each with its own files."""

    chat: Session = field(default_factory=Session)
    compare: Session = field(default_factory=Session)
    # The arena's conversation (each turn with one reply per side) and its two hidden models.
    arena: Session = field(default_factory=Session)
    battle: Battle | None = None
    # The grid tab's prompt set and run.
    grid: GridWork | None = None
    chat_model: str | None = None  # the model picked in the chat, restored after a reload
    # The conversation a first click on Delete asked about, and when (a second click deletes).
    delete_asked: tuple[str, float] | None = None
    # Whose stored conversations these are: the server-issued id of the browser (a signed cookie)
    # or of the signed-in account.
    browser_id: str = ""
    # The account's name where the visitor signed in (`app.views.accounts`); `browser_id` is then
    # the account's id, the same on every browser.
    account: str | None = None
    # The client's address as the server sees it (`app.views.identity`): the arena's vote limit.
    address: str = ""
    # The visitor whose allowance of answers running at once this tab's answers count against,
    # with its address's (`app.views.fairness`): the page's visitor, or a `/chat` call's (its
    # cookie's, where it sent one; a `/chat` call stores nothing, so `browser_id` stays empty).
    counted_as: str = ""
    # The message each view's box sent last (by view: "chat", "compare", "arena"), kept from when
    # the server took it until its answer ends (`app.views.widgets.settled_box`).
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    pages: set[str] = field(default_factory=set)  # Gradio session hashes attached now
    last_used: float = 0.0
    detached_at: float | None = None

    def close(self) -> None:
        self.chat.close()
        self.compare.close()
        self.arena.close()
        if self.grid is not None:
            self.grid.close()


class SessionStore:
    def __init__(
        self,
        grace_s: float,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        scratch: Path | None = None,
    ) -> None:
        self.grace_s = grace_s
        self.ttl_s = ttl_s
        self.clock = clock
        self.scratch = scratch or Path(tempfile.gettempdir())
        self.visits: dict[str, Visit] = {}
        self.lock = threading.Lock()

    def attach(self, token: str | None, page: str) -> tuple[str, Visit]:
        """The tab's visit for `token` (a reload), or a new one under a new token."""
        with self.lock:
            visit = self.visits.get(token or "")
            if visit is None:
                token = secrets.token_urlsafe(24)
                visit = Visit()
                self.visits[token] = visit
            visit.pages.add(page)
            visit.detached_at = None
            visit.last_used = self.clock()
        self.sweep()
        return token, visit

    def detach(self, page: str) -> None:
        """Gradio ended page `page`: its visit is deleted after the grace period unless a
        reload attaches to it first."""
        with self.lock:
            for visit in self.visits.values():
                if page in visit.pages:
                    visit.pages.discard(page)
                    if not visit.pages:
                        visit.detached_at = self.clock()
        self.sweep()
        with_loop(lambda loop: loop.call_later(self.grace_s + 0.1, self.sweep))

    def attached(self, page: str) -> bool:
        """Whether Gradio session `page` is a page attached to a visit now."""
        with self.lock:
            return any(page in visit.pages for visit in self.visits.values())

    def touch(self, visit: Visit) -> None:
        visit.last_used = self.clock()

    def sweep(self) -> int:
        """Deletes what its tab left: detached past the grace period, or unused past the TTL.
        Returns how many visits it deleted."""
        now = self.clock()
        with self.lock:
            gone = {
                token: visit
                for token, visit in self.visits.items()
                if (visit.detached_at is not None and now - visit.detached_at >= self.grace_s)
                or now - visit.last_used >= self.ttl_s
            }
            for token in gone:
                del self.visits[token]
            owned = {s._folder for v in self.visits.values() for s in (v.chat, v.compare, v.arena)}
            # A grid's run folder and the folder its uploaded or unzipped set lives in, which
            # stay as old as the upload while the tab still runs the set.
            grids = [v.grid for v in self.visits.values() if v.grid is not None]
            owned |= {g.folder for g in grids} | {g.prompt_set.unpacked for g in grids}
        for visit in gone.values():
            visit.close()
        self._sweep_orphans(owned)
        return len(gone)

    def _sweep_orphans(self, owned: set[Path | None]) -> None:
        """Session folders no visit owns, older than the TTL: left by a process that died (or
        lost by this one). Another live app process's folders are its own to sweep."""
        cutoff = time.time() - self.ttl_s
        for folder in self.scratch.glob(f"{SESSION_FOLDER_ROOT}*"):
            if made_by_another_live_process(folder):
                continue
            try:
                if folder not in owned and folder.stat().st_mtime < cutoff:
                    shutil.rmtree(folder, ignore_errors=True)
            except OSError:
                continue  # deleted meanwhile

    def close(self) -> None:
        with self.lock:
            visits, self.visits = list(self.visits.values()), {}
        for visit in visits:
            visit.close()


def made_by_another_live_process(folder: Path) -> bool:
    pid = folder.name.removeprefix(SESSION_FOLDER_ROOT).split("-", 1)[0]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)  # no signal: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def with_loop(action: Callable[[asyncio.AbstractEventLoop], object]) -> None:
    """Runs `action` with the running event loop, if this thread has one."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    action(loop)
