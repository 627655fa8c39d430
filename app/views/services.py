"""What every view shares: the catalog as offered here, the engine manager, the video decoders,
and the steps from a user's message to a measured reply. Nothing here lays out a page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from app.catalog.cards import ModelCard
from app.config import Settings
from app.demo.models import SEEING_MODELS
from app.domain import compare
from app.domain.conversation import (
    ConversationError,
    Prompt,
    Session,
    Turn,
    fitted_prompt,
    user_message,
)
from app.domain.replies import Reply, stream_reply
from app.domain.sessions import SessionStore, Visit
from app.engines.base import SamplingError, SamplingSettings, card_sampling, sampling_refusal
from app.engines.manager import EngineManager
from app.engines.metrics import EngineMetrics
from app.media.grounding import draw_answer_boxes
from app.media.loading import VideoDecoderPool
from app.storage.history import History
from app.views.accounts import SignIn
from app.views.fairness import Allowance
from app.views.identity import PRIVATE_RANGES, Identity, signing_key
from app.views.metrics import Visitors

log = logging.getLogger(__name__)

MAX_TOKENS_SLIDER = 4096
# How often tabs past their time-to-live and media past the retention are deleted.
HOUSEKEEPING_S = 600.0
WARNING = "⚠️ "


@dataclass(frozen=True)
class Choice:
    card: ModelCard
    reason: str  # why it cannot be served here; empty when it can

    @property
    def label(self) -> str:
        return f"{self.card.family} · {self.card.display_name}"


class Playground:
    """The app's pieces, shared by every browser session. Per-user data lives in each
    session's `gr.State`."""

    def __init__(
        self,
        manager: EngineManager,
        settings: Settings,
        decoder: VideoDecoderPool,
        history: History | None = None,
    ) -> None:
        self.manager = manager
        # Stored conversations (`app.storage.history`); None when the operator turned history off.
        self.history = history
        self.settings = settings
        self.decoder = decoder
        catalog = manager.cards
        remote = compare.remote_keys(catalog, settings.remote_engines)
        choices = [
            Choice(
                card, card.availability(settings.gpu_count, settings.allow_remote_code, key in remote).reason
            )
            for key, card in catalog.items()
        ]
        # Servable models first (the demo family before the rest), then each family together.
        choices.sort(
            key=lambda c: (bool(c.reason), c.card.family != "Demo", c.card.family, c.card.display_name)
        )
        self.choices = {choice.card.key: choice for choice in choices}
        self.default_model = settings.default_model or next(iter(self.served_models()), None)
        # Each browser tab's conversations, kept across a reload and deleted when it is gone.
        self.sessions = SessionStore(settings.reload_grace_s, settings.session_ttl_s)
        # Who a visitor is, as the server says (a signed cookie), and where they come from.
        # Its key is kept beside the history's media (the data folder), where there is one.
        # On a Space, only Hugging Face's proxy reaches the container, from a private address
        # (10.16.3.80 was seen), and its X-Forwarded-For names the visitor: believed by default.
        on_space = bool(os.environ.get("SPACE_HOST"))
        self.identity = Identity(
            signing_key(history.media_dir.parent if history is not None else None),
            settings.trusted_proxies or (PRIVATE_RANGES if on_space else ()),
            secure=(settings.public_url or "").startswith("https://") or on_space,
            framed=on_space,
        )
        # Answers one visitor, and one address, may have running at once (`app.views.fairness`).
        self.allowance = Allowance(settings.answers_per_visitor, settings.answers_per_address)
        # An operator's metrics (`APP_METRICS`): the manager tells them what it does.
        self.metrics: CollectorRegistry | None = None
        if settings.metrics:
            engine_metrics = EngineMetrics()
            engine_metrics.watch(manager)
            engine_metrics.registry.register(Visitors(self.sessions))
            manager.events = engine_metrics
            self.metrics = engine_metrics.registry
        # Who signed in, where the operator turned sign-in on (`app.views.accounts`).
        self.sign_in = SignIn(settings.sign_in, settings.sign_in_header, settings.trusted_proxies)
        self.loop: asyncio.AbstractEventLoop | None = None
        # Gradio's queue, and the sessions it held empty at the last housekeeping round.
        self._gradio_queue: Any = None
        self._gradio_loop: asyncio.AbstractEventLoop | None = None
        self._empty_sessions: set[str] = set()
        self._housekeeping_stop = threading.Event()
        self._housekeeping: threading.Thread | None = None
        # What must happen to each tab's conversation before its files go at exit (the history
        # stores it, an answer cut by the stop included).
        self.on_close: list[Callable[[Visit], None]] = []

    def housekeeping(self) -> None:
        """One round of what nobody's click does: tabs unused past the time-to-live go, and so do
        stored media files past the history's retention (their thumbnails stay)."""
        self.sessions.sweep()
        if self._gradio_loop is not None and self._gradio_queue is not None:
            self._gradio_loop.call_soon_threadsafe(self._prune_finished_sessions)
        if self.history is not None:
            expired = self.history.expire_media()
            if expired:
                log.info("deleted %d media file(s) kept longer than the retention", expired)

    def start_housekeeping(self, every_s: float = HOUSEKEEPING_S) -> None:
        """Runs `housekeeping` now and then every `every_s` seconds, until `close`."""

        def rounds() -> None:
            while not self._housekeeping_stop.is_set():
                try:
                    self.housekeeping()
                except Exception:  # a database away for a moment: the next round tries again
                    log.warning("housekeeping failed; trying again in %.0f s", every_s, exc_info=True)
                self._housekeeping_stop.wait(every_s)

        self._housekeeping = threading.Thread(target=rounds, name="housekeeping", daemon=True)
        self._housekeeping.start()

    def stop_housekeeping(self) -> None:
        self._housekeeping_stop.set()
        if self._housekeeping is not None:
            self._housekeeping.join(timeout=30)

    def close(self, timeout_s: float = 120) -> None:
        """At exit, in this order: the engines shut down on the server's loop, if it still runs
        (answers under way end, marked stopped); each tab's conversation is stored as it is then
        (`on_close`); then every session's files are deleted. The engine's error, if any, is
        raised once the rest is done."""
        self.stop_housekeeping()
        failure: BaseException | None = None
        if self.loop is not None and self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self.manager.close(), self.loop).result(timeout_s)
            except BaseException as error:  # raised again below, once the rest is done
                failure = error
        for visit in list(self.sessions.visits.values()):
            for store in self.on_close:
                try:
                    store(visit)
                except Exception:
                    log.exception("storing a conversation at exit failed")
        self.sessions.close()
        if self.history is not None:
            self.history.close()
        if failure is not None:
            raise failure

    def _prune_finished_sessions(self) -> None:
        """Gradio 6.31 keeps an entry in `Queue.pending_event_ids_session` for every session it
        has seen, emptied once the session's events are delivered but never dropped: about 2.7 KB
        for each `/chat` call by a script (`bench/bench_visitors.py`). On the server's loop, where
        Gradio changes it: entries empty at this round and the last are dropped (one that a new
        event fills again meanwhile is kept; Gradio makes a new entry for a session it lacks)."""
        pending = getattr(self._gradio_queue, "pending_event_ids_session", None)
        if not isinstance(pending, dict):
            return
        empty = {session for session, ids in pending.items() if not ids}
        for session in empty & self._empty_sessions:
            pending.pop(session, None)
        self._empty_sessions = empty - self._empty_sessions

    def forget_api_session(self, request: Any) -> None:
        """Ends what Gradio keeps for an API call's session (a `gr.Request`; None when called
        in-process). Gradio keeps a copy of the page's configuration for every session (about
        0.3 MB of memory for this page, `gradio.state_holder.SessionState`) until 10,000 sessions
        have come, and a `/call/<name>` without a page is a session of its own each time: the
        server grew by that much a call. The API endpoints keep nothing there; a page's own
        session (one attached to a visit) is left alone."""
        session_hash = getattr(request, "session_hash", None)
        app = getattr(getattr(request, "request", None), "app", None)
        holder = getattr(app, "state_holder", None)
        if self._gradio_queue is None and hasattr(app, "get_blocks"):
            with contextlib.suppress(RuntimeError):  # the server's loop, where Gradio's queue lives
                self._gradio_loop = asyncio.get_running_loop()
                self._gradio_queue = getattr(app.get_blocks(), "_queue", None)
        if not session_hash or holder is None or self.sessions.attached(session_hash):
            return
        with holder.lock:
            holder.session_data.pop(session_hash, None)
            holder.time_last_used.pop(session_hash, None)

    def active(self, visit: Visit | None) -> None:
        """The tab did something: its time-to-live counts from now, not from the page's load."""
        if visit is not None:
            self.sessions.touch(visit)

    def servable(self, key: str | None) -> ModelCard:
        """The card for a model a user picked; refuses anything the operator does not serve."""
        choice = self.choices.get(key or "")
        if choice is None:
            raise ConversationError("Pick a model from the list first.")
        if choice.reason:
            raise ConversationError(f"{choice.card.display_name} cannot be served here: {choice.reason}.")
        return choice.card

    def random_weights(self, key: str) -> bool:
        """Whether the model answers with random weights (the demo's twins, or every model where
        the operator set vLLM's dummy load format for the engines built here): its answers are
        noise. A remote server's model has its own weights."""
        if key in self.settings.remote_engines:
            return False
        card = self.choices[key].card
        return "dummy" in (self.settings.load_format, card.reference_engine_args.get("load_format"))

    def served_models(self) -> list[str]:
        """The models this server serves, in the pickers' order."""
        return [key for key, choice in self.choices.items() if not choice.reason]

    def model_options(self) -> list[tuple[str, str]]:
        """The pickers' options: (label, key) of every model served here."""
        return [(self.choices[key].label, key) for key in self.served_models()]

    def compare_picks(self) -> list[str]:
        """The models compare picks before the visitor does: on a machine without a GPU, the two
        trained demo models, which answer about shapes and differ, so a first comparison has
        something to judge; elsewhere (a GPU box, even with the demo models asked for) none."""
        served = self.served_models()
        on_cpu = self.settings.gpu_count == 0
        return list(SEEING_MODELS) if on_cpu and all(key in served for key in SEEING_MODELS) else []

    def status_line(self, key: str | None) -> str:
        choice = self.choices.get(key or "")
        if choice is None:
            return ""
        if choice.reason:
            return f"**State:** unavailable: {choice.reason}"
        return f"**State:** {self.manager.status(key).describe()}"

    def sampling(
        self, card: ModelCard, temperature: Any, top_p: Any, max_tokens: Any, seed: Any
    ) -> SamplingSettings:
        """The sampling asked for, checked against what the page's controls allow (the API takes
        no more). A value left empty (the API's None) takes the card's default, then the app's."""
        sampling = SamplingSettings(
            temperature=None if temperature is None else finite("temperature", temperature),
            top_p=None if top_p is None else finite("top_p", top_p),
            max_tokens=None if max_tokens is None else int(finite("max_tokens", max_tokens)),
            seed=int(finite("seed", seed)) if seed else None,  # 0 or empty: a random seed
        )
        within_page_bounds(card, sampling)
        return sampling

    async def prompt_for(
        self, card: ModelCard, turns: list[Turn], system: str | None, clips: dict[Path, Any] | None = None
    ) -> Prompt:
        """The engine's messages for `turns`, their size and the earlier files left out to keep
        within the model's media limits and context (`fitted_prompt`); refuses what still will not
        fit. The system prompt is dropped for formats without one (its box is disabled there)."""
        system = system if card.takes_system_prompt else ""
        return await fitted_prompt(card, turns, system, self.decoder, clips)

    async def draw_boxes(self, card: ModelCard, session: Session, turn: Turn, reply: Reply) -> None:
        """Once an answer has ended: the boxes it names (cards that ground) drawn on the latest
        picture sent up to its turn, into the session's folder. The answer's text stays as it is."""
        if card.grounding is None or not reply.answer:
            return
        sent = [
            image for earlier in session.turns[: session.turns.index(turn) + 1] for image in earlier.images
        ]
        if not sent:
            return
        out = session.folder / f"boxes-{len(list(session.folder.iterdir())):04d}.png"
        try:
            count = await asyncio.to_thread(draw_answer_boxes, card, reply.answer, sent[-1], out)
        except Exception:  # a picture gone or unreadable: the answer shows without its drawing
            log.warning("could not draw the boxes of an answer", exc_info=True)
            return
        reply.boxes_drawn, reply.box_count = (out, count) if count else (None, 0)

    def reply_stream(
        self, card: ModelCard, messages: list[dict[str, Any]], sampling: SamplingSettings, reply: Reply
    ) -> AsyncIterator[Reply]:
        """`card`'s answer streamed into `reply` (closing it stops the answer in the engine)."""
        self.loop = asyncio.get_running_loop()
        return stream_reply(self.manager, card, messages, sampling, reply)


def finite(name: str, value: Any) -> float:
    """A sampling control's value as a number; NaN, infinities and text (which the API can send)
    are refused in the control's own words."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number):
        raise SamplingError(sampling_refusal(name, value))
    return number


def page_max_tokens(card: ModelCard | None) -> int:
    """The longest answer the page offers for `card`: the slider's end, or the card's default
    where that is longer (DeepSeek-OCR's 8192)."""
    default = card_sampling(card).max_tokens if card is not None else None
    return max(MAX_TOKENS_SLIDER, default or 0)


def within_page_bounds(card: ModelCard, sampling: SamplingSettings) -> None:
    """The API takes what the page's controls take: no answer longer than the slider allows."""
    sampling.check()
    if sampling.max_tokens is not None and sampling.max_tokens > page_max_tokens(card):
        raise ConversationError(
            f"Max tokens is {sampling.max_tokens:,}; this page allows at most "
            f"{page_max_tokens(card):,} for {card.display_name}: ask for fewer."
        )


def refusal(error: Exception) -> str:
    """The line shown above the input box when a message is refused or an answer fails."""
    return WARNING + user_message(error)
