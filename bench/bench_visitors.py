"""Under load: simulated visitors at once, for minutes, on the demo models: real pages in Chromium
(chatting, reloading, importing, voting, exporting) and scripts on the `/chat` API. Counts every
action and error, checks afterwards that no answered turn and no vote was lost (in the history
database and on the leaderboard), and watches the server's memory.

    .venv/bin/python bench/bench_visitors.py [--visitors 50] [--browsers 8] [--duration 180]

The app runs as `python -m app` in a subprocess on a free port, with its own data folder and
temporary folder, the default CPU catalog (the two seeing demo models and two random-weight twins)
and its public defaults, but for the arena's vote limits: every visitor here comes from
127.0.0.1, so they are raised (`APP_ARENA_VOTES_PER_HOUR`, `..._PER_ADDRESS_PER_HOUR`), and so is
the answers one address may have running (`APP_ANSWERS_PER_ADDRESS`), the requests it may
start a minute (`APP_REQUESTS_PER_ADDRESS_PER_MINUTE`) and have waiting (`APP_WAITING_PER_ADDRESS`).
`--browsers` of the visitors drive a page each (one Chromium, a context per visitor: its own
signed cookie); the others call `/chat` (and `/leaderboard`) over HTTP with server-sent events,
as `gradio_client` does. Each visitor loops through actions with a random think time between
them until the time is up. Prints Markdown tables; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from chromium import CHROMIUM, CHROMIUM_FLAGS  # noqa: E402
from ports import free_port  # noqa: E402

from app.demo.models import DEMO_MODELS  # noqa: E402
from app.storage.history import (  # noqa: E402
    ConversationRecord,
    Export,
    History,
    ReplyRecord,
    TurnRecord,
    new_id,
    sqlite_url,
)
from app.views.chat import PREPARING, WAITING  # noqa: E402

EXAMPLES = ROOT / "static" / "examples"
# Questions the seeing model answers (it was trained on them); the twins answer anything.
QUESTIONS = [
    ("What shape is it?", "one_shape.png"),
    ("Which side of the picture is the shape on?", "one_shape.png"),
    ("How many shapes are there?", "three_shapes.png"),
    ("What colour is the shape?", "green_square.png"),
]
# A page visitor's next action, by weight; an API visitor mostly chats.
PAGE_ACTIONS = {"chat": 40, "reload": 15, "vote": 15, "export": 10, "import": 10, "new chat": 10}
API_ACTIONS = {"api chat": 9, "api leaderboard": 1}
API_MAX_TOKENS = (32, 128, 512)
ACTION_TIMEOUT_S = 300.0
# A page's wait for one thing (an answer's end, a reload): under it, the action's own limit.
WAIT_MS = 240_000
# In the server's log, a line that says something went wrong (vLLM's and Gradio's own words).
BAD_LINE = re.compile(r"Traceback|\bERROR\b|Exception|exception|CRITICAL")
BOTS = "#chat [data-testid=bot]:not(:has(.thought-group))"
LABELS = "#chat .thought-group .title"
REVEALED = re.compile(r"Model A was (.+?); Model B was (.+?)\. Your vote")
# The arena's verdicts, as its buttons are named (`app.storage.votes.OUTCOMES`).
VERDICTS = ("a", "b", "tie", "bad")


# --- the server --------------------------------------------------------------------------------


class Server:
    """`python -m app` in a subprocess: its own data and temporary folders, its log in a file."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.port = port
        self.url = f"http://127.0.0.1:{port}/"
        self.data = folder / "data"
        self.log_path = folder / "server.log"
        # The app's session folders and vLLM's scratch go to the temporary folder: a private one,
        # removed with the rest afterwards.
        scratch = folder / "tmp"
        scratch.mkdir(parents=True)
        env = {
            **os.environ,
            "TMPDIR": str(scratch),
            "APP_ARENA_VOTES_PER_HOUR": "100000",
            "APP_ARENA_VOTES_PER_ADDRESS_PER_HOUR": "100000",
            "APP_ANSWERS_PER_ADDRESS": "1000",  # every visitor here is 127.0.0.1
            "APP_REQUESTS_PER_ADDRESS_PER_MINUTE": "1000000",
            "APP_WAITING_PER_ADDRESS": "1000",
            "PYTHONUNBUFFERED": "1",
        }
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(  # noqa: S603 (our own interpreter and module)
            [sys.executable, "-m", "app", "--port", str(port), "--data-dir", str(self.data)],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.tree = psutil.Process(self.process.pid)

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the app stopped at start (code {self.process.returncode}): {self.log_path}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url, timeout=5).status_code == 200:
                    return
            time.sleep(1)
        raise RuntimeError(f"the app did not answer within {timeout_s:.0f} s")

    def memory(self) -> tuple[float, float, int, int]:
        """The process tree's RSS (MiB), the server process's own, its child processes, and its
        open file descriptors (a leak of connections or files shows there first)."""
        own = self.tree.memory_info().rss
        children = self.tree.children(recursive=True)
        total = own
        for child in children:
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total / 2**20, own / 2**20, len(children), self.tree.num_fds()

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def stop(self) -> int:
        """SIGTERM, as Docker stops it; the app stops within 30 s by design."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()
        return self.process.returncode


@dataclass
class Sample:
    at_s: float
    tree_mib: float
    server_mib: float
    children: int
    fds: int


class Sampler(threading.Thread):
    """The server's memory every `every_s` seconds, in a thread of its own so a busy event loop
    driving the visitors does not delay it."""

    def __init__(self, server: Server, every_s: float) -> None:
        super().__init__(daemon=True, name="memory-sampler")
        self.server = server
        self.every_s = every_s
        self.started = time.monotonic()
        self.samples: list[Sample] = []
        self.done = threading.Event()

    def take(self) -> Sample:
        sample = Sample(time.monotonic() - self.started, *self.server.memory())
        self.samples.append(sample)
        return sample

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            with contextlib.suppress(psutil.Error):
                self.take()


# --- what the visitors record ------------------------------------------------------------------


@dataclass
class Stats:
    done: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    ttft: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    empty: list[str] = field(default_factory=list)  # API calls completed with no text
    console: list[str] = field(default_factory=list)
    http: list[str] = field(default_factory=list)

    async def timed(self, kind: str, who: str, action: Callable[[], Awaitable[None]]) -> None:
        started = time.monotonic()
        try:
            await asyncio.wait_for(action(), ACTION_TIMEOUT_S)
        except Exception as error:  # every failure is counted and kept, with its visitor
            self.failed[kind] += 1
            text = " ".join(str(error).split())[:300] or type(error).__name__
            self.errors.append(f"{time.strftime('%H:%M:%S')} {who} {kind}: {type(error).__name__}: {text}")
        else:
            self.done[kind] += 1
            self.seconds[kind].append(time.monotonic() - started)


class VisitorError(Exception):
    """What the page or the API showed instead of the expected result."""


def think(rng: random.Random, low: float, high: float) -> float:
    return rng.uniform(low, high)


# --- a visitor in a real page ------------------------------------------------------------------


class PageVisitor:
    def __init__(
        self, index: int, browser: Browser, url: str, stats: Stats, rng: random.Random, folder: Path
    ) -> None:
        self.name = f"page-{index:02d}"
        self.browser, self.url, self.stats, self.rng = browser, url, stats, rng
        self.folder = folder
        self.context: BrowserContext | None = None
        self.page: Page | None = None
        self.browser_id = ""
        self.sent = 0
        self.current: list[str] = []  # the answered turns of the chat open in the page
        self.answered: list[str] = []  # every turn this visitor saw answered
        self.conversations = 0  # chats begun with an answered turn
        self.imports = 0
        self.exported: bytes | None = None
        self.export_url = ""
        self.export_turns: list[str] | None = None
        self.votes: list[tuple[str, str, str]] = []  # (model A's name, model B's, outcome)
        self.attached: dict[str, str] = {}  # the last picture put in each message box
        self.trail: list[str] = []  # the last actions, for the line that says what failed

    @property
    def p(self) -> Page:
        if self.page is None:
            raise VisitorError("no page")
        return self.page

    async def open(self) -> None:
        self.context = await self.browser.new_context(
            viewport={"width": 1400, "height": 1000}, accept_downloads=True
        )
        self.page = await self.context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.page.on("pageerror", lambda error: self.stats.console.append(f"{self.name}: {error}"))
        # Any refusal the server sends a page (an upload, a queue join) is kept with its address.
        self.page.on(
            "response",
            lambda response: (
                self.stats.http.append(
                    f"{self.name}: {response.status} {response.request.method} {response.url}"
                )
                if response.status >= 400
                else None
            ),
        )
        await self.page.goto(self.url)
        await self.page.wait_for_selector("#chat-input textarea")
        await self.p.wait_for_function("localStorage.getItem('vlm-playground-browser')")
        self.browser_id = await self.p.evaluate("localStorage.getItem('vlm-playground-browser')")

    async def close(self) -> None:
        if self.context is not None:
            with contextlib.suppress(Exception):
                await self.context.close()

    async def check_page(self) -> None:
        """A refusal above the box, or Gradio's error toast: the action failed."""
        notice = await self.p.inner_text("#notice")
        toasts = await self.p.evaluate(
            "() => { const t = [...document.querySelectorAll('.toast-body')].map(e => e.innerText);"
            " document.querySelectorAll('.toast-body .toast-close').forEach(b => b.click()); return t; }"
        )
        problems = [" ".join(t.split()) for t in toasts if "rror" in t] + (
            ["⚠️" + notice] if "⚠️" in notice else []
        )
        if problems:
            raise VisitorError("; ".join(problems)[:300])

    async def chat(self) -> None:
        self.sent += 1
        question, picture = self.rng.choice(QUESTIONS)
        text = f"{self.name} turn {self.sent}: {question}"
        answers = len(self.current) + 1
        try:
            if self.rng.random() < 0.5:
                await self.attach("chat-input", picture)
            await self.p.fill("#chat-input textarea", text)
            started = time.monotonic()
            await self.p.press("#chat-input textarea", "Enter")
            await self.answered_in_page(answers, started)
        except VisitorError:
            raise
        except Exception as error:
            raise VisitorError(f"{type(error).__name__}; {await self.snapshot(answers)}") from None
        if not self.current:
            self.conversations += 1
        self.current.append(text)
        self.answered.append(text)

    async def attach(self, box: str, picture: str) -> None:
        # The same file picked twice in a row in one box never shows there (the file input's
        # value is unchanged, so no change event: Gradio's box, not load); another is taken.
        if self.attached.get(box) == picture:
            picture = self.rng.choice([p for _, p in QUESTIONS if p != picture])
        self.attached[box] = picture
        await self.p.set_input_files(f"#{box} input[type=file]", str(EXAMPLES / picture))
        try:
            await self.p.wait_for_function(
                f"document.querySelectorAll('#{box} button[aria-label=\"Remove file\"]').length >= 1",
                timeout=120_000,
            )
        except Exception:
            raise VisitorError(f"the picture never showed in the box; {await self.snapshot(0)}") from None

    async def snapshot(self, answers: int) -> str:
        """What the chat shows, for the line that says why an answer was not seen."""
        bots = await self.p.locator(BOTS).all_inner_texts()
        toasts = await self.p.locator(".toast-body").all_inner_texts()
        trail = " > ".join(self.trail[-5:-1])
        return (
            f"expected answer {answers}; the chat shows {await self.p.locator(LABELS).count()} ended, "
            f"{len(bots)} bubbles, the last {' '.join((bots or [''])[-1].split())[:80]!r}; box "
            f"{(await self.p.input_value('#chat-input textarea'))[:60]!r}; notice "
            f"{' '.join((await self.p.inner_text('#notice')).split())[:120]!r}; toasts "
            f"{' '.join(' '.join(toasts).split())[:160]!r}; after {trail}"
        )

    async def answered_in_page(self, answers: int, started: float) -> None:
        # First token: the answer's bubble holds words past the placeholders (or it ended).
        await self.p.wait_for_function(
            """([n, waiting, preparing, labels, bubbles]) => {
                 if (document.querySelectorAll(labels).length >= n) return true;
                 const bots = document.querySelectorAll(bubbles);
                 if (bots.length < n) return false;
                 const t = bots[bots.length - 1].innerText.trim();
                 return t.length > 0 && !t.startsWith(waiting) && !t.startsWith(preparing);
               }""",
            arg=[answers, WAITING, PREPARING, LABELS, BOTS],
            polling=100,
        )
        self.stats.ttft["page chat"].append(time.monotonic() - started)
        # The end: the line under the answer (its model and speed) shows once it ended.
        await self.p.wait_for_function(
            f"n => document.querySelectorAll('{LABELS}').length >= n", arg=answers, polling=200
        )
        await self.check_page()
        label = (await self.p.locator(LABELS).all_inner_texts())[-1]
        if label.endswith(("stopped", "failed")):
            raise VisitorError(f"the answer ended {label}")

    async def reload(self) -> None:
        await self.p.reload()
        await self.p.wait_for_selector("#chat-input textarea")
        try:
            await self.p.wait_for_function(
                f"n => document.querySelectorAll('{LABELS}').length === n",
                arg=len(self.current),
                timeout=60_000,
            )
        except Exception:
            shown = await self.p.locator(LABELS).count()
            raise VisitorError(
                f"after the reload the chat shows {shown} of {len(self.current)} answers"
            ) from None
        await self.check_page()

    async def open_sidebar(self) -> None:
        box = await self.p.locator("#history-new").bounding_box()
        if box is None or box["x"] < 0:
            await self.p.click("#history .toggle-button")
        await self.p.wait_for_function(
            "() => { const b = document.querySelector('#history-new'); "
            "return b && b.getBoundingClientRect().x >= 0; }"
        )

    async def new_chat(self) -> None:
        await self.open_sidebar()
        await self.p.click("#history-new")
        await self.p.wait_for_function(f"document.querySelectorAll('{LABELS}').length === 0")
        self.current = []

    async def export(self) -> None:
        """Exports the open conversation (selected in the list once stored) and checks that the
        file holds every turn the page answered."""
        await self.open_sidebar()
        await self.p.wait_for_function(
            "document.querySelectorAll('#history-list input:checked').length === 1"
        )
        await self.p.click("#history-export")
        # The button keeps the previous export's file until this one's is ready. Gradio serves a
        # file under its content's hash: where the chat changed since the last export, a download
        # from the old address is the old file, and is tried again.
        await self.p.wait_for_selector("#history-download", state="visible")
        deadline = time.monotonic() + WAIT_MS / 1000
        changed = self.current != self.export_turns
        while True:
            async with self.p.expect_download() as waiting:
                await self.p.click("#history-download")
            download = await waiting.value
            if not changed or download.url != self.export_url:
                break
            await download.delete()
            if time.monotonic() > deadline:
                raise VisitorError("the export's file never came")
            await asyncio.sleep(0.5)
        self.export_url, self.export_turns = download.url, list(self.current)
        data = Path(await download.path()).read_bytes()
        exported = json.loads(data)
        texts = [turn["text"] for turn in exported["conversation"]["turns"]]
        missing = [text for text in self.current if text not in texts]
        if missing:
            raise VisitorError(
                f"the export of {exported['conversation']['title']!r} ({len(texts)} turns) lacks "
                f"{len(missing)} of the {len(self.current)} turns answered in the page"
            )
        self.exported = data
        with contextlib.suppress(Exception):
            await download.delete()

    async def import_(self) -> None:
        """Imports this visitor's last export (a round trip), else a conversation written here."""
        self.imports += 1
        data = self.exported or made_export(f"{self.name} import {self.imports}")
        path = self.folder / f"{self.name}-import-{self.imports}.json"
        path.write_bytes(data)
        await self.open_sidebar()
        listed = await self.p.locator("#history-list label").count()
        async with self.p.expect_file_chooser() as chooser:
            await self.p.click("#history-import")
        await (await chooser.value).set_files(str(path))
        try:
            # A notice alone can be the last import's (the same title says the same line): the
            # list must have grown by the imported conversation too.
            await self.p.wait_for_function(
                "n => document.querySelector('#history-notice').innerText.includes('Imported') && "
                "document.querySelectorAll('#history-list label').length > n",
                arg=listed,
                polling=200,
            )
        except Exception:
            self.imports -= 1
            raise VisitorError(await self.p.inner_text("#history-notice")) from None
        path.unlink()

    async def vote(self) -> None:
        """A blind battle in the arena: one message, both answers, a vote, the names revealed."""
        await self.p.get_by_role("tab", name="Arena").click()
        await self.p.wait_for_selector("#arena-input textarea")
        question, picture = self.rng.choice(QUESTIONS)
        if self.rng.random() < 0.5:
            await self.attach("arena-input", picture)
        await self.p.fill("#arena-input textarea", f"{self.name} battle: {question}")
        await self.p.press("#arena-input textarea", "Enter")
        await self.p.wait_for_function(
            "() => ['a', 'b'].every(s => { const h = document.querySelector('#arena-head-' + s); "
            "return h && /\\b(done|failed|stopped)\\b/.test(h.innerText); })",
            polling=250,
        )
        heads = [await self.p.inner_text(f"#arena-head-{side}") for side in "ab"]
        notice = await self.p.inner_text("#arena-notice")
        if not all("done" in head for head in heads) or "⚠️" in notice:
            raise VisitorError(f"battle: {' / '.join(' '.join(h.split()) for h in heads)} {notice}".strip())
        outcome = self.rng.choice(VERDICTS)
        await self.p.click(f"#arena-vote-{outcome}")
        await self.p.wait_for_function(
            "document.querySelector('#arena-reveal').innerText.includes('Model A was') || "
            "document.querySelector('#arena-notice').innerText.includes('⚠️')",
            polling=200,
        )
        revealed = REVEALED.search(" ".join((await self.p.inner_text("#arena-reveal")).split()))
        if revealed is None:
            raise VisitorError(f"vote refused: {await self.p.inner_text('#arena-notice')}")
        self.votes.append((revealed[1], revealed[2], outcome))
        await self.p.click("#arena-new")
        await self.p.wait_for_function("document.querySelector('#arena-reveal').innerText.trim() === ''")
        await self.p.get_by_role("tab", name="Chat").click()
        await self.p.wait_for_selector("#chat-input textarea")

    async def run(self, deadline: float, think_s: tuple[float, float]) -> None:
        await self.stats.timed("page open", self.name, self.open)
        if self.page is None or not self.browser_id:
            return
        actions: dict[str, Callable[[], Awaitable[None]]] = {
            "chat": self.chat,
            "reload": self.reload,
            "vote": self.vote,
            "export": self.export,
            "import": self.import_,
            "new chat": self.new_chat,
        }
        while time.monotonic() < deadline:
            await asyncio.sleep(think(self.rng, *think_s))
            if time.monotonic() >= deadline:
                break
            kind = self.rng.choices(list(PAGE_ACTIONS), weights=list(PAGE_ACTIONS.values()))[0]
            if kind == "export" and not self.current:
                kind = "chat"  # nothing stored to export yet
            self.trail.append(kind)
            await self.stats.timed(kind, self.name, actions[kind])


def made_export(title: str) -> bytes:
    """A conversation as another server would export it, for a visitor with no export of its own."""
    turns = [
        TurnRecord(
            text=f"{title}: question {i}",
            replies=[ReplyRecord(model=DEMO_MODELS[0], answer="triangle", ttft_s=0.1)],
        )
        for i in range(3)
    ]
    record = ConversationRecord(id=new_id(), title=title, model=DEMO_MODELS[0], turns=turns)
    return Export(conversation=record).model_dump_json(indent=1).encode()


# --- a visitor through the API -----------------------------------------------------------------


class ApiVisitor:
    """A script on `/chat` and `/leaderboard` (`/gradio_api/call/<name>`, answers streamed as
    server-sent events: what `gradio_client` does), with its own cookie."""

    def __init__(self, index: int, url: str, stats: Stats, rng: random.Random) -> None:
        self.name = f"api-{index:02d}"
        self.url, self.stats, self.rng = url, stats, rng
        self.sent = 0

    async def call(self, client: httpx.AsyncClient, name: str, data: list[Any]) -> tuple[float | None, Any]:
        """The call's last value, and the seconds to its first non-empty update."""
        started = time.monotonic()
        posted = await client.post(f"gradio_api/call/{name}", json={"data": data})
        if posted.status_code != 200:
            raise VisitorError(f"HTTP {posted.status_code}: {posted.text[:200]}")
        first: float | None = None
        event, last = "", None
        async with client.stream("GET", f"gradio_api/call/{name}/{posted.json()['event_id']}") as stream:
            if stream.status_code != 200:
                raise VisitorError(f"HTTP {stream.status_code} on the stream")
            async for line in stream.aiter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event in ("generating", "complete", "error"):
                    value = json.loads(line.removeprefix("data: "))
                    if event == "error":
                        raise VisitorError(f"error event: {value}")
                    last = value[0] if isinstance(value, list) and value else value
                    if first is None and last:
                        first = time.monotonic() - started
                    if event == "complete":
                        return first, last
        raise VisitorError("the stream ended without its answer")

    async def chat(self, client: httpx.AsyncClient) -> None:
        self.sent += 1
        question, picture = self.rng.choice(QUESTIONS)
        files: list[dict[str, Any]] = []
        if self.rng.random() < 0.3:
            with (EXAMPLES / picture).open("rb") as handle:
                uploaded = await client.post(
                    "gradio_api/upload", files={"files": (picture, handle.read(), "image/png")}
                )
            if uploaded.status_code != 200:
                raise VisitorError(f"upload: HTTP {uploaded.status_code}: {uploaded.text[:200]}")
            path = uploaded.json()[0]
            files = [{"path": path, "orig_name": picture, "meta": {"_type": "gradio.FileData"}}]
        model = self.rng.choice(DEMO_MODELS)
        message = {"text": f"{self.name} turn {self.sent}: {question}", "files": files}
        max_tokens = self.rng.choice(API_MAX_TOKENS)
        first, answer = await self.call(client, "chat", [message, model, "", None, None, max_tokens, 0])
        if not answer:
            # The call completed with no text: `/chat` streams only a growing answer, so an answer
            # that ended at its first token (a random-weight twin can sample its end-of-sequence
            # token first) looks the same as one lost. Counted apart, never as answered.
            self.stats.empty.append(f"{self.name} turn {self.sent} ({model}, max {max_tokens} tokens)")
            return
        if first is not None:
            self.stats.ttft["api chat"].append(first)

    async def leaderboard(self, client: httpx.AsyncClient) -> None:
        _, board = await self.call(client, "leaderboard", ["all"])
        if not isinstance(board, dict) or "votes" not in board:
            raise VisitorError(f"leaderboard: {str(board)[:200]}")

    async def run(self, deadline: float, think_s: tuple[float, float]) -> None:
        timeout = httpx.Timeout(ACTION_TIMEOUT_S, connect=30)
        async with httpx.AsyncClient(base_url=self.url, timeout=timeout) as client:
            while time.monotonic() < deadline:
                await asyncio.sleep(think(self.rng, *think_s))
                if time.monotonic() >= deadline:
                    break
                kind = self.rng.choices(list(API_ACTIONS), weights=list(API_ACTIONS.values()))[0]
                action = self.chat if kind == "api chat" else self.leaderboard
                await self.stats.timed(kind, self.name, lambda action=action: action(client))


# --- the run -----------------------------------------------------------------------------------


async def warm_up(url: str) -> dict[str, float]:
    """Each demo model answers once, one after the other: their engines are built before the
    visitors come (a build is a start-up cost, measured in bench_engine.py, not load)."""
    built = {}
    stats = Stats()
    visitor = ApiVisitor(0, url, stats, random.Random(0))  # noqa: S311 (a fixed question)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600, connect=30)) as client:
        for key in DEMO_MODELS:
            started = time.monotonic()
            message = {"text": "What shape is it?", "files": []}
            await visitor.call(client, "chat", [message, key, "", None, None, 16, 0])
            built[key] = time.monotonic() - started
    return built


async def drive(
    args: argparse.Namespace, server: Server, folder: Path
) -> tuple[Stats, list[PageVisitor], float]:
    stats = Stats()
    rng = random.Random(args.seed)  # noqa: S311 (simulated visitors, seeded to be reproducible)
    think_s = (args.think_min, args.think_max)
    browsers = min(args.browsers, args.visitors)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        pages = [
            PageVisitor(i, browser, server.url, stats, random.Random(rng.random()), folder)  # noqa: S311
            for i in range(browsers)
        ]
        apis = [
            ApiVisitor(i, server.url, stats, random.Random(rng.random()))  # noqa: S311
            for i in range(args.visitors - browsers)
        ]
        started = time.monotonic()
        deadline = started + args.duration
        await asyncio.gather(
            *(v.run(deadline, think_s) for v in pages), *(v.run(deadline, think_s) for v in apis)
        )
        elapsed = time.monotonic() - started
        # The last answers' saves run after the page saw them end (`HistoryView.save_chat`):
        # a real visitor would read them for longer than this.
        await asyncio.sleep(args.settle)
        await asyncio.gather(*(v.close() for v in pages))
        await browser.close()
    return stats, pages, elapsed


def lost_turns(server: Server, pages: list[PageVisitor]) -> tuple[list[str], int, int]:
    """Every turn a page saw answered, looked up in the history database under its visitor's
    id; and the conversations stored against those each visitor began or imported."""
    history = History(sqlite_url(server.data), server.data / "media")
    lost: list[str] = []
    stored_total = expected_total = 0
    try:
        for visitor in pages:
            if not visitor.browser_id:
                continue
            summaries = history.list(visitor.browser_id)
            texts = {
                turn.text
                for summary in summaries
                for turn in history.load(visitor.browser_id, summary.id).turns
                if turn.replies
            }
            lost += [f"{visitor.name}: {text}" for text in visitor.answered if text not in texts]
            expected = visitor.conversations + visitor.imports
            stored_total += len(summaries)
            expected_total += expected
            if len(summaries) != expected:
                lost.append(f"{visitor.name}: {len(summaries)} conversations stored, {expected} expected")
    finally:
        history.close()
    return lost, stored_total, expected_total


def leaderboard_check(server: Server, pages: list[PageVisitor]) -> tuple[bool, str]:
    """The leaderboard's counts (through `/leaderboard`) against the votes the pages cast."""
    votes = [vote for visitor in pages for vote in visitor.votes]
    client = ApiVisitor(99, server.url, Stats(), random.Random(0))  # noqa: S311

    async def board() -> Any:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            return (await client.call(http, "leaderboard", ["all"]))[1]

    table = asyncio.run(board())
    expected_votes: Counter[str] = Counter()
    expected_wins: Counter[str] = Counter()
    for a, b, outcome in votes:
        expected_votes.update([a, b])
        if outcome in ("a", "b"):
            expected_wins[a if outcome == "a" else b] += 1.0
        else:  # ties and "both bad" count half a win to each side
            expected_wins.update({a: 0.5, b: 0.5})
    shown_votes = {row["name"]: row["votes"] for row in table["rows"]}
    shown_wins = {row["name"]: row["wins"] for row in table["rows"]}
    same = (
        table["votes"] == len(votes)
        and shown_votes == dict(expected_votes)
        and all(abs(shown_wins.get(name, 0) - wins) < 1e-6 for name, wins in expected_wins.items())
    )
    line = f"{table['votes']} votes on the leaderboard, {len(votes)} cast; per model " + ", ".join(
        f"{name}: {shown_votes.get(name, 0)} (cast {expected_votes[name]})" for name in sorted(expected_votes)
    )
    return same, line


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def slope_mib_per_min(samples: list[Sample]) -> float:
    if len(samples) < 2:
        return 0.0
    xs = [s.at_s / 60 for s in samples]
    ys = [s.tree_mib for s in samples]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visitors", type=int, default=50, help="visitors at once, pages and API")
    parser.add_argument("--browsers", type=int, default=8, help="of them, visitors driving a real page")
    parser.add_argument("--duration", type=float, default=180, help="seconds of load")
    parser.add_argument("--warmup", type=float, default=60, help="seconds into the load memory is flat from")
    parser.add_argument("--think-min", type=float, default=2.0, help="shortest think time, seconds")
    parser.add_argument("--think-max", type=float, default=8.0, help="longest think time, seconds")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between memory samples")
    parser.add_argument(
        "--memory-margin", type=float, default=0.05, help="end within this fraction of after warm-up"
    )
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the load before checking")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the data folder and the server's log")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="bench-visitors-"))
    server = Server(folder, free_port())
    ok = False
    try:
        server.wait_ready()
        sampler = Sampler(server, args.sample_every)
        at_start = sampler.take()
        built = asyncio.run(warm_up(server.url))
        after_builds = sampler.take()
        sampler.started = time.monotonic()  # sample times count from the load's start
        sampler.samples = []
        sampler.start()
        stats, pages, elapsed = asyncio.run(drive(args, server, folder))
        sampler.done.set()
        sampler.join()
        load = [s for s in sampler.samples if s.at_s <= args.duration + 1]
        warmed = next((s for s in load if s.at_s >= args.warmup), load[-1])
        end = load[-1]
        after = sampler.take()
        lost, stored, expected = lost_turns(server, pages)
        board_ok, board_line = leaderboard_check(server, pages)
        bad_lines = [line for line in server.log_lines() if BAD_LINE.search(line)]
        ok = report(
            args,
            stats,
            elapsed,
            built,
            (at_start, after_builds, warmed, end, after),
            load,
            lost,
            (stored, expected),
            (board_ok, board_line),
            bad_lines,
        )
    finally:
        code = server.stop()
        print(f"\nThe app stopped with code {code} after SIGTERM.")
        if args.keep:
            print(f"Kept: {folder} (server.log, data/)")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0 if ok else 1


def report(
    args: argparse.Namespace,
    stats: Stats,
    elapsed: float,
    built: dict[str, float],
    points: tuple[Sample, Sample, Sample, Sample, Sample],
    load: list[Sample],
    lost: list[str],
    conversations: tuple[int, int],
    board: tuple[bool, str],
    bad_lines: list[str],
) -> bool:
    browsers = min(args.browsers, args.visitors)
    memory = psutil.virtual_memory().total / 2**30
    print(
        f"{args.visitors} visitors at once ({browsers} in Chromium pages, "
        f"{args.visitors - browsers} on the API) for {elapsed:.0f} s, think time {args.think_min:g} to "
        f"{args.think_max:g} s; {platform.machine()}, {os.cpu_count()} cores, {memory:.0f} GiB, "
        f"Python {platform.python_version()}; {time.strftime('%Y-%m-%d')}."
    )
    builds = ", ".join(f"{key} {seconds:.1f} s" for key, seconds in built.items())
    print(f"Engines built before the load (first answer of each): {builds}.\n")

    print("| action | done | failed | median s | p95 s |\n| --- | --- | --- | --- | --- |")
    for kind in sorted(set(stats.done) | set(stats.failed)):
        seconds = stats.seconds.get(kind) or [float("nan")]
        print(
            f"| {kind} | {stats.done[kind]} | {stats.failed[kind]} | {statistics.median(seconds):.2f} "
            f"| {percentile(seconds, 0.95):.2f} |"
        )
    total_done, total_failed = sum(stats.done.values()), sum(stats.failed.values())
    print(f"| **all** | **{total_done}** | **{total_failed}** | | |")

    print(
        "\n| time to first token under load | chats | p50 s | p95 s | max s |\n"
        "| --- | --- | --- | --- | --- |"
    )
    for kind, values in sorted(stats.ttft.items()):
        if values:
            print(
                f"| {kind} | {len(values)} | {percentile(values, 0.5):.2f} | {percentile(values, 0.95):.2f} "
                f"| {max(values):.2f} |"
            )

    at_start, after_builds, warmed, end, after = points
    print(
        "\n| server memory (process tree RSS) | MiB | server process MiB | child processes | open fds |\n"
        "| --- | --- | --- | --- | --- |"
    )
    for name, sample in (
        ("at start (no engine)", at_start),
        ("engines built, before the load", after_builds),
        (f"after warm-up ({warmed.at_s:.0f} s into the load)", warmed),
        (f"at the end of the load ({end.at_s:.0f} s)", end),
        ("after the run (visitors gone)", after),
    ):
        print(
            f"| {name} | {sample.tree_mib:.0f} | {sample.server_mib:.0f} | {sample.children} | {sample.fds} |"
        )
    steady = [s for s in load if s.at_s >= warmed.at_s]
    peak = max(load, key=lambda s: s.tree_mib)
    growth = end.tree_mib - warmed.tree_mib
    flat = growth <= args.memory_margin * warmed.tree_mib
    print(
        f"\nPeak {peak.tree_mib:.0f} MiB at {peak.at_s:.0f} s; from warm-up to the end {growth:+.0f} MiB "
        f"({100 * growth / warmed.tree_mib:+.1f}%), trend {slope_mib_per_min(steady):+.1f} MiB/min over "
        f"{len(steady)} samples."
    )
    minutes = [s for s in load if s.at_s >= 0][:: max(1, round(60 / args.sample_every))]
    print(
        "Tree RSS each minute of the load: "
        + ", ".join(f"{s.tree_mib:.0f}" for s in [*minutes, end])
        + " MiB."
    )

    lost_all = lost
    stored, expected = conversations
    board_ok, board_line = board
    checks = [
        ("no failed action", total_failed == 0, f"{total_failed} of {total_done + total_failed}"),
        ("no error in the server's log", not bad_lines, f"{len(bad_lines)} lines"),
        (
            "no lost turn",
            not lost_all,
            f"{len(lost_all)} lost of {stats.done['chat']} answered page turns ({stored} conversations "
            f"stored, {expected} begun or imported); {len(stats.empty)} API calls completed with no text",
        ),
        ("leaderboard = votes cast", board_ok, board_line),
        (
            f"memory flat (end within {100 * args.memory_margin:g}% of after warm-up)",
            flat,
            f"{warmed.tree_mib:.0f} -> {end.tree_mib:.0f} MiB",
        ),
    ]
    print("\n| check | result | detail |\n| --- | --- | --- |")
    for name, passed, detail in checks:
        print(f"| {name} | {'met' if passed else '**NOT MET**'} | {detail} |")
    if stats.errors:
        print("\nFailed actions (first 30):\n")
        print("\n".join(f"    {line}" for line in stats.errors[:30]))
    if lost_all:
        print("\nLost turns (first 30):\n")
        print("\n".join(f"    {line}" for line in lost_all[:30]))
    if bad_lines:
        print("\nThe server's log, lines that say something went wrong (first 40):\n")
        print("\n".join(f"    {line[:300]}" for line in bad_lines[:40]))
    if stats.empty:
        print("\nAPI calls that completed with no text:\n")
        print("\n".join(f"    {line}" for line in stats.empty[:30]))
    if stats.http:
        print(f"\nRefusals the pages got from the server: {len(stats.http)} (first 10):\n")
        print("\n".join(f"    {line[:300]}" for line in stats.http[:10]))
    if stats.console:
        print(f"\nErrors in the pages' scripts: {len(stats.console)} (first 5):\n")
        print("\n".join(f"    {line[:300]}" for line in stats.console[:5]))
    return all(passed for _, passed, _ in checks)


if __name__ == "__main__":
    sys.exit(main())
