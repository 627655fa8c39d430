"""The browser app: a chat view and a compare view over one shared engine manager.

This module builds Gradio Blocks and imports neither torch nor vLLM: the engine factory is
given to the manager by `app.__main__`. Handlers stay short; the work is in
`app.conversation` (turns, files, size check) and `app.compare` (side-by-side runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from app import compare
from app.cards import ModelCard
from app.compare import Comparison
from app.config import Settings
from app.conversation import (
    ConversationError,
    Session,
    Turn,
    check_fits,
    check_media,
    engine_messages,
    make_turn,
    user_message,
)
from app.engine import (
    EngineManager,
    ModelState,
    ModelStatus,
    SamplingSettings,
    StreamEnd,
    TextDelta,
    card_sampling,
)
from app.media import VideoDecoderPool

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent.parent / "static"
EXAMPLES = STATIC / "examples"
STATUS_REFRESH_S = 1.0
PRIVATE: dict[str, Any] = {"api_visibility": "private"}  # page events, not API endpoints
SYSTEM_HINT = "Optional; used where the model's prompt format has a system prompt"
WAITING = "Waiting for the model"
WARNING = "⚠️ "
ENDINGS = {"length": "cut at the token limit", "abort": "stopped"}
# Files older than this are removed from Gradio's upload cache (checked as often).
UPLOAD_MAX_AGE_S = 3600
MAX_TOKENS_SLIDER = 4096
# A closed tab's conversation and files are deleted after this long without use.
SESSION_TTL_S = 6 * 3600
CSS = """
#notice:empty, #compare-notice:empty { display: none; }
#notice, #compare-notice { color: var(--error-text-color); }
.frames .caption-label { font-size: 0.75em; }
"""


@dataclass(frozen=True)
class Choice:
    card: ModelCard
    reason: str  # why it cannot be served here; empty when it can

    @property
    def label(self) -> str:
        name = f"{self.card.family} · {self.card.display_name}"
        return f"{name} (unavailable)" if self.reason else name


class Playground:
    """The app's pieces, shared by every browser session: the catalog as offered, the engine
    manager and the video decoders. Per-user data lives in each session's `gr.State`."""

    def __init__(self, manager: EngineManager, settings: Settings, decoder: VideoDecoderPool) -> None:
        self.manager = manager
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
        self.remote = remote
        self.default_model = settings.default_model or next(
            (key for key, choice in self.choices.items() if not choice.reason), None
        )
        self.loop: asyncio.AbstractEventLoop | None = None

    def close(self, timeout_s: float = 120) -> None:
        """Shuts the engines down on the server's loop, if it still runs (called at exit)."""
        if self.loop is not None and self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.manager.close(), self.loop).result(timeout_s)

    # --- what handlers share ---------------------------------------------------------------

    def servable(self, key: str | None) -> ModelCard:
        """The card for a model a user picked; refuses anything the operator does not serve."""
        choice = self.choices.get(key or "")
        if choice is None:
            raise ConversationError("Pick a model from the list first.")
        if choice.reason:
            raise ConversationError(f"{choice.card.display_name} cannot be served here: {choice.reason}.")
        return choice.card

    def card_panel(self, key: str | None) -> str:
        choice = self.choices.get(key or "")
        if choice is None:
            return "Pick a model."
        card = choice.card
        limits = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in card.media_limits.items())
        lines = [
            f"### {card.display_name}",
            f"**Repository:** `{card.hf_repo}`" + (f" @ `{card.revision}`" if card.revision else ""),
            f"**Takes:** text, {' and '.join(card.modalities)} (at most {limits} per conversation)",
            f"**Context:** {card.max_model_len or 'model default'} tokens · "
            f"**video frames sampled:** {card.video_frames}",
        ]
        if not card.takes_system_prompt:
            lines.append("**No system prompt:** this model's prompt format has none.")
        if not card.multi_turn:
            lines.append("**One turn only:** this model's format has no conversation history.")
        if card.notes:
            lines.append(f"**Notes:** {card.notes}")
        if choice.reason:
            lines.append(f"**Unavailable here:** {choice.reason}")
        return "\n\n".join(lines)

    def picked(self, key: str | None) -> tuple[Any, ...]:
        """The card, the state, the system prompt box and the model's sampling defaults."""
        choice = self.choices.get(key or "")
        takes = choice is None or choice.card.takes_system_prompt
        hint = SYSTEM_HINT if takes else "This model's prompt format has no system prompt"
        defaults = card_sampling(choice.card) if choice is not None else SamplingSettings().for_card(None)
        return (
            self.card_panel(key),
            self.status_line(key),
            gr.Textbox(interactive=takes, placeholder=hint),
            gr.Slider(value=defaults.temperature),
            gr.Slider(value=defaults.top_p),
            gr.Slider(value=defaults.max_tokens, maximum=page_max_tokens(choice and choice.card)),
        )

    def status_line(self, key: str | None) -> str:
        choice = self.choices.get(key or "")
        if choice is None:
            return ""
        if choice.reason:
            return "**State:** unavailable"
        return f"**State:** {self.manager.status(key).describe()}"

    def sampling(
        self, temperature: float | None, top_p: float | None, max_tokens: float | None, seed: float | None
    ) -> SamplingSettings:
        """The sampling asked for; a value left empty (the API's None) takes the model card's
        default, then the app's."""
        return SamplingSettings(
            temperature=None if temperature is None else float(temperature),
            top_p=None if top_p is None else float(top_p),
            max_tokens=None if max_tokens is None else int(max_tokens),
            seed=int(seed) if seed else None,  # 0 or empty: a random seed
        )

    async def prompt_for(
        self, card: ModelCard, turns: list[Turn], system: str | None, clips: dict[Path, Any] | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """The engine's messages for `turns` and their estimated size; refuses what will not
        fit. The system prompt is dropped for formats without one (its box is disabled there)."""
        system = system if card.takes_system_prompt else ""
        messages = await engine_messages(turns, system, self.decoder, card.video_frames, clips)
        return messages, check_fits(card, messages)

    # --- chat ------------------------------------------------------------------------------

    async def send(
        self, message: dict[str, Any], session: Session, key: str, system: str, *sampling: Any
    ) -> AsyncIterator[tuple[Any, ...]]:
        """A new user message: checked and loaded, then answered as it streams."""
        self.loop = asyncio.get_running_loop()
        session.stop_requested = False
        text, files = message.get("text") or "", list(message.get("files") or [])
        try:
            card = self.servable(key)
            within_page_bounds(card, self.sampling(*sampling))
            check_media(card, session.turns, files)
            turn, clip = await make_turn(session, text, files, self.decoder, card.video_frames)
            clips = {turn.video: clip} if clip else None
            messages, estimate = await self.prompt_for(card, [*session.turns, turn], system, clips)
        except Exception as error:
            yield chat_view(session), gr.MultimodalTextbox(value=message), refusal(error), gr.skip()
            return
        session.turns.append(turn)
        yield chat_view(session), gr.MultimodalTextbox(value=None), "", self.size_line(card, estimate, None)
        try:
            async for update in self.answer(
                card, session, turn, messages, self.sampling(*sampling), estimate
            ):
                yield update
        except Exception as error:
            session.turns.remove(turn)
            yield chat_view(session), gr.MultimodalTextbox(value=message), refusal(error), gr.skip()

    async def regenerate(
        self, session: Session, key: str, system: str, *sampling: Any
    ) -> AsyncIterator[tuple[Any, ...]]:
        self.loop = asyncio.get_running_loop()
        session.stop_requested = False
        if not session.turns:
            yield chat_view(session), gr.skip(), "Nothing to regenerate yet.", gr.skip()
            return
        turn = session.turns[-1]
        try:
            card = self.servable(key)
            check_media(card, session.turns[:-1], [str(path) for path in turn.files])
            messages, estimate = await self.prompt_for(card, session.turns, system)
        except Exception as error:
            yield chat_view(session), gr.skip(), refusal(error), gr.skip()
            return
        previous = (turn.answer, turn.model, turn.ending)
        turn.answer, turn.ending = "", ""
        yield chat_view(session), gr.skip(), "", self.size_line(card, estimate, None)
        try:
            async for update in self.answer(
                card, session, turn, messages, self.sampling(*sampling), estimate
            ):
                yield update
        except Exception as error:
            turn.answer, turn.model, turn.ending = previous  # the old answer rather than none
            yield chat_view(session), gr.skip(), refusal(error), gr.skip()

    async def answer(
        self,
        card: ModelCard,
        session: Session,
        turn: Turn,
        messages: list[dict[str, Any]],
        sampling: SamplingSettings,
        estimate: int,
    ) -> AsyncIterator[tuple[Any, ...]]:
        """Streams the model's answer into `turn`, showing the load progress until it starts.
        A stop request closes the stream, which aborts the request in the engine."""
        turn.model = card.display_name
        async with contextlib.aclosing(self.manager.stream(card.key, messages, sampling)) as events:
            async for event in events:
                if isinstance(event, ModelStatus):
                    waiting = event.state is not ModelState.READY
                    turn.status = f"{WAITING}: {card.display_name} is {event.describe()}" if waiting else ""
                elif isinstance(event, TextDelta):
                    turn.answer += event.text
                elif isinstance(event, StreamEnd):
                    turn.ending = ENDINGS.get(event.finish_reason, "")
                    yield (
                        chat_view(session),
                        gr.skip(),
                        "",
                        self.size_line(card, estimate, event.prompt_tokens),
                    )
                    return
                if session.stop_requested:
                    turn.status = ""
                    turn.ending = "stopped"
                    break
                yield chat_view(session), gr.skip(), "", gr.skip()
        yield chat_view(session), gr.skip(), "", gr.skip()

    def stop(self, session: Session) -> None:
        session.stop_requested = True

    def undo(self, session: Session) -> tuple[Any, ...]:
        if not session.turns:
            return chat_view(session), gr.skip(), ""
        turn = session.turns.pop()
        files = [str(path) for path in turn.files]
        return chat_view(session), gr.MultimodalTextbox(value={"text": turn.text, "files": files}), ""

    def clear(self, session: Session) -> tuple[Any, ...]:
        session.close()
        return chat_view(session), gr.MultimodalTextbox(value=None), "", ""

    def size_line(self, card: ModelCard, estimate: int, counted: int | None) -> str:
        limit = f" of {card.max_model_len:,}" if card.max_model_len else ""
        text = f"Prompt: about {estimate:,}{limit} tokens (estimated before sending)"
        return text + (f"; the engine counted {counted:,}." if counted is not None else ".")

    # --- compare ---------------------------------------------------------------------------

    async def compare(
        self, message: dict[str, Any], session: Session, keys: list[str], system: str, *sampling: Any
    ) -> AsyncIterator[tuple[Any, ...]]:
        self.loop = asyncio.get_running_loop()
        session.stop_requested = False
        text, files = message.get("text") or "", list(message.get("files") or [])
        try:
            cards = [self.servable(key) for key in keys or []]
            if not compare.MIN_MODELS <= len(cards) <= compare.MAX_MODELS:
                raise ConversationError(
                    f"Pick {compare.MIN_MODELS} to {compare.MAX_MODELS} models to compare."
                )
            for card in cards:
                within_page_bounds(card, self.sampling(*sampling))
            session.close()
            turn, clip = await make_turn(session, text, files, self.decoder, cards[0].video_frames)
        except Exception as error:
            yield *compare_view(None), refusal(error), gr.skip(), gr.skip()
            return
        comparison = Comparison(text, [Path(f).name for f in files], system, self.sampling(*sampling))

        async def messages_for(card: ModelCard) -> list[dict[str, Any]]:
            check_media(card, [], files)
            same_frames = clip is not None and card.video_frames == cards[0].video_frames
            messages, _ = await self.prompt_for(
                card, [turn], system, {turn.video: clip} if same_frames else None
            )
            return messages

        run = compare.run(
            self.manager,
            comparison,
            cards,
            messages_for,
        )
        async with contextlib.aclosing(run) as updates:
            async for update in updates:
                yield *compare_view(update), "", gr.skip(), gr.skip()
                if session.stop_requested:
                    break
        yield *compare_view(comparison), "", *self.exports(session, comparison)

    def exports(
        self, session: Session, comparison: Comparison
    ) -> tuple[gr.DownloadButton, gr.DownloadButton]:
        name = compare.export_name(comparison)
        json_path, markdown_path = session.folder / f"{name}.json", session.folder / f"{name}.md"
        json_path.write_text(compare.to_json(comparison), encoding="utf-8")
        markdown_path.write_text(compare.to_markdown(comparison), encoding="utf-8")
        return gr.DownloadButton(value=str(json_path), interactive=True), gr.DownloadButton(
            value=str(markdown_path), interactive=True
        )

    # --- API -------------------------------------------------------------------------------

    async def api_chat(
        self, message: dict[str, Any], key: str, system: str, *sampling: Any
    ) -> AsyncIterator[str]:
        """One message answered by one model, streamed as the growing answer (`/chat`)."""
        session = Session()
        try:
            async for update in self.send(message, session, key, system, *sampling):
                if update[2]:
                    raise gr.Error(update[2].removeprefix(WARNING))
                if session.turns and session.turns[-1].answer:
                    yield session.turns[-1].answer
        finally:
            session.close()

    # --- the page --------------------------------------------------------------------------

    def build(self) -> gr.Blocks:
        with gr.Blocks(title="VLM Playground", delete_cache=(UPLOAD_MAX_AGE_S, UPLOAD_MAX_AGE_S)) as demo:
            gr.Markdown("# VLM Playground\nChat with vision-language models served by vLLM.")
            with gr.Tab("Chat", id="chat-tab"):
                self.chat_tab()
            with gr.Tab("Compare", id="compare-tab"):
                self.compare_tab()
            self.api_endpoint()
        return demo

    def chat_tab(self) -> None:
        session = gr.State(Session(), time_to_live=SESSION_TTL_S, delete_callback=Session.close)
        labels = [(choice.label, key) for key, choice in self.choices.items()]
        with gr.Row():
            with gr.Column(scale=3):
                chatbot = gr.Chatbot(elem_id="chat", height=520, label="Conversation", buttons=["copy"])
                # Above the input box: a grown box pushed a refusal below the window's edge.
                notice = gr.Markdown(elem_id="notice")
                box = message_box(
                    "chat-input", "Ask about images or a video: drop several images or one clip"
                )
                with gr.Row():
                    stop = gr.Button("Stop", elem_id="stop", variant="stop", size="sm")
                    regenerate = gr.Button("Regenerate", elem_id="regenerate", size="sm")
                    undo = gr.Button("Undo last turn", elem_id="undo", size="sm")
                    clear = gr.Button("Clear", elem_id="clear", size="sm")
                size = gr.Markdown(elem_id="prompt-size")
                gr.Examples(examples=example_messages(), inputs=[box], label="Examples")
            with gr.Column(scale=2):
                model = gr.Dropdown(labels, value=self.default_model, label="Model", elem_id="model")
                state = gr.Markdown(self.status_line(self.default_model), elem_id="model-state")
                panel = gr.Markdown(self.card_panel(self.default_model), elem_id="model-card")
                system = gr.Textbox(label="System prompt", elem_id="system", placeholder=SYSTEM_HINT)
                default = self.choices.get(self.default_model or "")
                sampling = sampling_controls("chat", default.card if default is not None else None)
        inputs, outputs = [session, model, system, *sampling], [chatbot, box, notice, size]
        sent = box.submit(self.send, [box, *inputs], outputs, show_progress_on=[chatbot], **PRIVATE)
        sent.then(self.status_line, [model], [state], show_progress="hidden", **PRIVATE)
        regenerate.click(self.regenerate, inputs, outputs, show_progress_on=[chatbot], **PRIVATE)
        stop.click(self.stop, [session], None, concurrency_limit=None, **PRIVATE)
        undo.click(self.undo, [session], [chatbot, box, notice], **PRIVATE)
        # The chat's own trash icon clears the conversation too, not only the screen.
        gr.on([clear.click, chatbot.clear], self.clear, [session], outputs, **PRIVATE)
        model.change(
            self.picked, [model], [panel, state, system, *sampling[:3]], show_progress="hidden", **PRIVATE
        )
        gr.Timer(STATUS_REFRESH_S).tick(
            self.status_line, [model], [state], concurrency_limit=None, show_progress="hidden", **PRIVATE
        )

    def compare_tab(self) -> None:
        session = gr.State(Session(), time_to_live=SESSION_TTL_S, delete_callback=Session.close)
        servable = [(choice.label, key) for key, choice in self.choices.items() if not choice.reason]
        keys = gr.Dropdown(
            servable,
            multiselect=True,
            max_choices=compare.MAX_MODELS,
            elem_id="compare-models",
            label=f"Models to compare ({compare.MIN_MODELS} to {compare.MAX_MODELS})",
        )
        box = message_box("compare-input", "One message (text, images or a clip) for every model")
        notice = gr.Markdown(elem_id="compare-notice")
        columns: list[Any] = []
        with gr.Row():
            for index in range(compare.MAX_MODELS):
                with gr.Column(visible=False, min_width=220) as column:
                    columns += [column, gr.Markdown(elem_id=f"compare-head-{index}")]
                    columns.append(gr.Markdown(elem_id=f"compare-answer-{index}"))
        with gr.Row():
            stop = gr.Button("Stop", elem_id="compare-stop", variant="stop", size="sm")
            export_json = gr.DownloadButton(
                "Export JSON", elem_id="export-json", interactive=False, size="sm"
            )
            export_md = gr.DownloadButton(
                "Export Markdown", elem_id="export-md", interactive=False, size="sm"
            )
        system = gr.Textbox(label="System prompt", elem_id="compare-system", placeholder=SYSTEM_HINT)
        sampling = sampling_controls("compare")
        box.submit(
            self.compare,
            [box, session, keys, system, *sampling],
            [*columns, notice, export_json, export_md],
            show_progress="hidden",
            **PRIVATE,
        )
        stop.click(self.stop, [session], None, concurrency_limit=None, **PRIVATE)

    def api_endpoint(self) -> None:
        """`/chat` for `gradio_client`: one message, a model key, a system prompt and sampling
        settings in; the answer out as it grows. It goes through the queue like the page."""
        with gr.Group(visible=False):
            message = gr.MultimodalTextbox(file_count="multiple")
            key, system, answer = gr.Textbox(), gr.Textbox(), gr.Textbox()
            sampling = [gr.Number(), gr.Number(), gr.Number(), gr.Number()]
            trigger = gr.Button()
        trigger.click(self.api_chat, [message, key, system, *sampling], [answer], api_name="chat")


def refusal(error: Exception) -> str:
    """The line shown above the input box when a message is refused or an answer fails."""
    return WARNING + user_message(error)


def message_box(elem_id: str, placeholder: str) -> gr.MultimodalTextbox:
    return gr.MultimodalTextbox(
        elem_id=elem_id,
        file_count="multiple",
        file_types=["image", "video"],
        placeholder=placeholder,
        show_label=False,
    )


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


def sampling_controls(prefix: str, card: ModelCard | None = None) -> list[Any]:
    """Temperature, top-p, max tokens and seed, starting at `card`'s defaults (else the app's)."""
    defaults = card_sampling(card) if card is not None else SamplingSettings().for_card(None)
    with gr.Accordion("Sampling", open=False, elem_id=f"{prefix}-sampling"):
        return [
            gr.Slider(
                0.0,
                2.0,
                value=defaults.temperature,
                step=0.05,
                label="Temperature",
                elem_id=f"{prefix}-temperature",
            ),
            gr.Slider(0.05, 1.0, value=defaults.top_p, step=0.05, label="Top-p"),
            gr.Slider(
                16,
                page_max_tokens(card),
                value=defaults.max_tokens,
                step=16,
                label="Max tokens",
                elem_id=f"{prefix}-max-tokens",
            ),
            gr.Number(value=0, precision=0, label="Seed (0: random)", elem_id=f"{prefix}-seed"),
        ]


def example_messages() -> list[list[dict[str, Any]]]:
    return [
        [
            {
                "text": "What shapes do you see, and what colour is each?",
                "files": [str(EXAMPLES / "shapes.png")],
            }
        ],
        [{"text": "Which bar is the tallest?", "files": [str(EXAMPLES / "bar_chart.png")]}],
        [{"text": "Describe how the ball moves.", "files": [str(EXAMPLES / "bouncing_ball.mp4")]}],
        [
            {
                "text": "Compare these two pictures.",
                "files": [str(EXAMPLES / "shapes.png"), str(EXAMPLES / "bar_chart.png")],
            }
        ],
    ]


def chat_view(session: Session) -> list[dict[str, Any]]:
    """The conversation as the Chatbot shows it: files, video frames with times, answers."""
    messages: list[dict[str, Any]] = []
    for turn in session.turns:
        for path in turn.files:
            messages.append({"role": "user", "content": {"path": str(path)}})
        if turn.frames:
            gallery = gr.Gallery(
                [(str(path), f"{seconds:.1f} s") for path, seconds in turn.frames],
                # Four a row: the chat's bubble is about 580 px wide, and eight a row (100 px
                # each) hid six of sixteen frames past its edge.
                columns=4,
                height="auto",
                label=f"The {len(turn.frames)} frames the model sees",
                elem_classes=["frames"],
                allow_preview=False,
                buttons=[],
            )
            messages.append({"role": "user", "content": gallery})
        if turn.text:
            messages.append({"role": "user", "content": turn.text})
        answer = (turn.answer or turn.status) + (f"\n\n*({turn.ending})*" if turn.ending else "")
        if answer:
            messages.append({"role": "assistant", "content": answer})
    return messages


def compare_view(comparison: Comparison | None) -> list[Any]:
    updates: list[Any] = []
    columns = comparison.columns if comparison else []
    for index in range(compare.MAX_MODELS):
        if index < len(columns):
            column = columns[index]
            head = f"### {column.display_name}\n{column.header()}"
            body = column.answer or (f"{WARNING}{column.error}" if column.error else "…")
            updates += [gr.Column(visible=True), head, body]
        else:
            updates += [gr.Column(visible=False), "", ""]
    return updates


def launch(demo: gr.Blocks, settings: Settings, block: bool = True, quiet: bool | None = None) -> gr.Blocks:
    """Serves the page with a public page's defaults: a bounded queue, no API route that skips
    it, an upload limit, no monitoring page, no tracebacks, no share link unless asked for.
    Gradio prints the page's address unless `quiet` (default: when not blocking)."""
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=settings.concurrency, api_open=False)
    demo.launch(
        server_name=settings.host,
        server_port=settings.port,
        share=settings.share,
        max_file_size=settings.max_upload_bytes,
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
    )
    return demo
