"""The page around the views: the tabs, a tab's session that survives a reload (and is deleted
when the tab is gone), and the server's public defaults."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from app.config import Settings
from app.domain.sessions import Visit
from app.views.accounts import PasswordCheck, read_users
from app.views.api import CHAT_API, ChatApi
from app.views.arena import ArenaView
from app.views.chat import PRIVATE, ChatView
from app.views.compare import CompareView
from app.views.doorway import Doorway, most_waiting
from app.views.grid import GridView
from app.views.guard import Guard, allowed_hosts
from app.views.history import HistoryView
from app.views.identity import Identity, IdentityMiddleware, kept_client
from app.views.leaderboard import LEADERBOARD_API, LeaderboardView
from app.views.metrics import MetricsEndpoint
from app.views.services import Playground
from app.views.widgets import EXAMPLES

# Uploads older than this are removed from Gradio's upload cache (checked as often). A message
# keeps its own links to the files it sent, so only files never sent are lost.
UPLOAD_MAX_AGE_S = 900
STORAGE_KEY = "vlm-playground-session"
BROWSER_KEY = "vlm-playground-browser"
# The tab's token lives in sessionStorage: a reload keeps it, another tab has its own. The
# browser's id (whose stored conversations the sidebar lists) lives in localStorage: every tab
# of the browser shares it, and it outlives the browser's restart.
READ_TOKEN = (
    f"() => [sessionStorage.getItem('{STORAGE_KEY}') || '', localStorage.getItem('{BROWSER_KEY}') || '']"
)
WRITE_TOKEN = (
    f"(token, browser) => {{ sessionStorage.setItem('{STORAGE_KEY}', token); "
    f"localStorage.setItem('{BROWSER_KEY}', browser); return []; }}"
)
NO_SESSION = "⚠️ This page could not start its session (the server may be busy): reload it."
NO_SESSION_JS = f"""() => {{ document.querySelector('#notice').innerText = {NO_SESSION!r}; }}"""
# Escape stops the answer that streams in view (the message box's own stop button).
ESCAPE_STOPS = """
() => {
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    for (const box of document.querySelectorAll("#chat-input, #compare-input")) {
      const stop = box.querySelector("button.stop-button");
      if (stop && box.offsetParent !== null) { stop.click(); event.preventDefault(); }
    }
  });
}
"""
# The web fonts Gradio serves itself are cut-down copies: its default (Source Sans Pro) draws
# some capitals of a semibold heading as small capitals ("Model ᴀ", "7ʙ"), IBM Plex Sans a bold
# "a" from another font. The visitor's own interface font has every letter.
THEME = gr.themes.Default(
    font=["system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif"]
)
CSS = """
#notice:empty, #compare-notice:empty, #compare-sent:empty { display: none; }
#notice, #compare-notice { color: var(--error-text-color); }
.frames .caption-label { font-size: 0.75em; }
/* A long model name ends in "..." before the dropdown's arrow instead of running under it. */
#model input { text-overflow: ellipsis; padding-right: 1.5em; }
/* On a phone the history sidebar's toggle sits over the page's left edge: keep the title clear. */
@media (max-width: 640px) { #title h1 { padding-left: 1.75rem; } }
"""


class Page:
    def __init__(self, playground: Playground) -> None:
        self.playground = playground
        self.sessions = playground.sessions
        self.chat = ChatView(playground)
        self.compare = CompareView(playground)
        # `/chat` has a chat view of its own, which the history never stores: a call is a one-off
        # with no visitor to own it.
        self.api = ChatApi(ChatView(playground))
        self.grid = GridView(playground)
        self.history = HistoryView(playground, self.chat, self.compare, self.grid)
        # The arena and its leaderboard keep their votes in the database (`app.storage.history`).
        votes = playground.history if playground.settings.arena else None
        self.arena = ArenaView(playground, votes) if votes is not None else None
        self.leaderboard = LeaderboardView(playground, votes) if votes is not None else None

    async def resume(
        self, token: str, browser: str, request: gr.Request, profile: gr.OAuthProfile | None
    ) -> tuple[Any, ...]:
        """A page (re)loaded: the tab's session (a new one for a new tab) and the visitor's id:
        the signed-in account's where sign-in is on and the visitor signed in
        (`app.views.accounts`), else the one the server issued in a signed cookie
        (`app.views.identity`). The id the page's script keeps (`browser`) is shown back to it,
        never believed. A client that sends no cookie is a new visitor."""
        token, visit = self.sessions.attach(token, request.session_hash or "")
        peer = getattr(request.client, "host", None)
        account = self.playground.sign_in.account(
            peer, request.headers, request.username, profile.username if profile is not None else None
        )
        issued = self.playground.identity.visitor(request.headers)
        if account is not None:
            visit.browser_id, visit.account = account.visitor, account.name
        elif issued is not None:
            visit.browser_id, visit.account = issued, None
        elif not visit.browser_id or visit.account is not None:
            visit.browser_id, visit.account = secrets.token_hex(16), None
        # A tab's answers count against its visitor (a browser that keeps no cookie, as some do in
        # a Space's frame, is a visitor per tab) and its address (`app.views.fairness`).
        visit.counted_as = visit.browser_id
        visit.address = self.playground.identity.client_of(request)
        ready = (gr.update(interactive=True) for _ in self.closed_until_session())
        return token, visit.browser_id, visit, self.signed_in(visit), *self.chat.resumed(visit), *ready

    def closed_until_session(self) -> list[gr.Component]:
        """What sends the views' messages: closed until the tab has its session (`message_box`),
        since a message sent before it was refused as if the page had lost it."""
        views = [self.chat, self.compare, *([self.arena] if self.arena is not None else [])]
        return [*(view.box for view in views), self.grid.check_button]

    def signed_in(self, visit: Visit) -> str:
        """The line that says who the visitor is, where sign-in is on."""
        if not self.playground.sign_in.enabled:
            return ""
        if visit.account is not None:
            return f"Signed in as `{visit.account}`: your history and votes follow you."
        if self.playground.sign_in.mode == "huggingface":
            return "Not signed in: sign in with Hugging Face to keep your history on every device."
        return "Not signed in: your history stays with this browser."

    async def leave(self, request: gr.Request) -> None:
        """Gradio ended the page (closed or reloaded)."""
        self.sessions.detach(request.session_hash or "")

    def build(self) -> gr.Blocks:
        # The examples are served from where they lie, never copied into Gradio's upload cache,
        # where its sweep (and any code that tidies uploads) would delete them for everyone.
        gr.set_static_paths([EXAMPLES])
        with gr.Blocks(title="VLM Playground", delete_cache=(UPLOAD_MAX_AGE_S, UPLOAD_MAX_AGE_S)) as demo:
            gr.Markdown("# VLM Playground\nChat with vision-language models served by vLLM.", elem_id="title")
            with gr.Row(equal_height=True):
                who = gr.Markdown(elem_id="signed-in")
                if self.playground.sign_in.mode == "huggingface":
                    gr.LoginButton(scale=0, min_width=240)
            visit = gr.State(None)
            token, browser = gr.Textbox(visible=False), gr.Textbox(visible=False)
            with gr.Tabs() as tabs:
                with gr.Tab("Chat", id="chat-tab"):
                    chatbot = self.chat.layout(visit)
                with gr.Tab("Compare", id="compare-tab"):
                    self.compare.layout(visit)
                with gr.Tab("Grid", id="grid-tab"):
                    grid_shown = self.grid.layout(visit)
                if self.arena is not None and self.leaderboard is not None:
                    with gr.Tab("Arena", id="arena-tab"):
                        restored = self.arena.layout(visit)
                    with gr.Tab("Leaderboard", id="leaderboard-tab") as board_tab:
                        modality, board = self.leaderboard.layout()
                    # A vote shows on the leaderboard at once; so does everyone else's on opening it.
                    for event in [*self.arena.voted, board_tab.select]:
                        event(self.leaderboard.refresh, [modality], board, show_progress="hidden", **PRIVATE)
            listed = self.history.layout(visit, chatbot, tabs)
            self.api.layout()
            if self.leaderboard is not None:
                self.leaderboard.api()
            loaded = demo.load(
                self.resume,
                [token, browser],
                [token, browser, visit, who, chatbot, self.chat.model, *self.closed_until_session()],
                js=READ_TOKEN,
                **PRIVATE,
            )
            # Without its session the page's boxes stay closed (`message_box`): it says so, for
            # good, where Gradio's own toast ("busy, try again") fades and nothing tries again.
            loaded.failure(None, None, None, js=NO_SESSION_JS, queue=False, **PRIVATE)
            loaded.then(None, [token, browser], None, js=WRITE_TOKEN, queue=False, **PRIVATE)
            loaded.then(self.history.listing, [visit], [listed], show_progress="hidden", **PRIVATE)
            self.chat.refreshes_after(loaded, visit)
            # The panel of the model the page opens with, as it is now (the context a build
            # registered since the app started), not as the page was built.
            model = self.chat.model
            loaded.then(self.chat.card_panel, [model], [self.chat.panel], show_progress="hidden", **PRIVATE)
            if self.arena is not None:
                loaded.then(self.arena.resumed, [visit], restored, show_progress="hidden", **PRIVATE)
            loaded.then(self.grid.shown, [visit], grid_shown, show_progress="hidden", **PRIVATE)
            demo.unload(self.leave)
        demo.vlm_identity = self.playground.identity  # type: ignore[attr-defined]
        demo.vlm_metrics = self.playground.metrics  # type: ignore[attr-defined]
        return demo


def build(playground: Playground) -> gr.Blocks:
    return Page(playground).build()


def playground_identity(demo: gr.Blocks) -> Identity:
    """The identity the page's handlers check, kept on the Blocks by `build`."""
    return demo.vlm_identity  # type: ignore[attr-defined]


def queue_less_calls(demo: gr.Blocks) -> dict[int, Callable[[list[Any]], bool]]:
    """The page's events that run outside the queue (an example's click, an input gone idle),
    by index, each with a check of what a call may hand it: as many inputs as it takes, an
    example's number among the examples, nothing else (`Guard`)."""

    def accepts(inputs: list[Any]) -> Callable[[list[Any]], bool]:
        def check(data: list[Any]) -> bool:
            return len(data) == len(inputs) and all(
                isinstance(block, gr.Dataset) and type(value) is int and 0 <= value < len(block.samples)
                for block, value in zip(inputs, data, strict=True)
            )

        return check

    return {index: accepts(fn.inputs) for index, fn in demo.fns.items() if not fn.queue and fn.fn}


def waiting_clients(demo: gr.Blocks) -> Iterator[str]:
    """The client key of each request waiting in Gradio's queue, as the door kept it in the
    request's scope (`Doorway`). Gradio keeps the queue's events by concurrency group in `_queue`
    (6.31); `tests/test_api_sessions.py` fails where it no longer does."""
    groups = getattr(getattr(demo, "_queue", None), "event_queue_per_concurrency_id", {})
    for group in list(groups.values()):
        for event in list(group.queue):
            if (key := kept_client(getattr(event, "request", None))) is not None:
                yield key


# Gradio keeps each page load's session (a copy of the page's configuration, about 0.3 MB here,
# and its `gr.State`) after the page is gone, until this many sessions have come, then drops the
# least recently used. Its default, 10,000, is about 3 GB; a page in use is used every second
# (its model-state timer), so only closed or idle pages reach the end of the line. A dropped
# live page is told in one line to reload, and its conversation comes back from its token.
PAGE_SESSIONS = 1000


def launch(demo: gr.Blocks, settings: Settings, block: bool = True, quiet: bool | None = None) -> gr.Blocks:
    """Serves the page with a public page's defaults: a bounded queue, no API route that skips
    it, an upload limit, no monitoring page, no tracebacks, no share link unless asked for.
    Gradio prints the page's address unless `quiet` (default: when not blocking)."""
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=settings.concurrency, api_open=False)
    public_url = settings.public_url or (
        f"https://{space}" if (space := os.environ.get("SPACE_HOST")) else None
    )
    identity = Middleware(IdentityMiddleware, identity=playground_identity(demo))
    guard = Middleware(
        Guard,
        upload_folder=demo.GRADIO_CACHE,
        examples_folder=str(EXAMPLES),
        public_url=public_url,
        allowed_hosts=allowed_hosts(settings.host, public_url),
        # The leaderboard's endpoint exists where the arena does (`Page`).
        public_api=(CHAT_API, LEADERBOARD_API) if settings.arena else (CHAT_API,),
        page_calls=queue_less_calls(demo),
    )
    # Password sign-in is Gradio's own login page, checked against the users file.
    auth = (
        PasswordCheck(read_users(settings.users_file))
        if settings.users_file and settings.sign_in == "password"
        else None
    )
    # The door first: a request refused for its address's rate costs nothing else.
    doorway = Middleware(
        Doorway,
        identity=playground_identity(demo),
        per_minute=settings.requests_per_address_per_minute,
        burst=settings.request_burst_per_address,
        waiting=lambda: waiting_clients(demo),
        most_waiting=settings.waiting_per_address or most_waiting(settings.queue_size),
        queue_size=settings.queue_size,
    )
    middleware = [doorway, guard, identity]
    if (registry := getattr(demo, "vlm_metrics", None)) is not None:
        middleware.append(Middleware(MetricsEndpoint, registry=registry))
    demo.launch(
        auth=auth,
        auth_message="Sign in with the account your team gave you." if auth else None,
        root_path=public_url,
        app_kwargs={"middleware": middleware},
        server_name=settings.host,
        server_port=settings.port,
        share=settings.share,
        max_file_size=settings.max_upload_bytes,
        state_session_capacity=PAGE_SESSIONS,
        enable_monitoring=False,
        show_error=False,
        run_history=False,
        ssr_mode=False,
        pwa=False,
        mcp_server=False,
        footer_links=["api"],
        prevent_thread_lock=not block,
        quiet=not block if quiet is None else quiet,
        css=CSS,
        theme=THEME,
        js=ESCAPE_STOPS,
    )
    return demo
