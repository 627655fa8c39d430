"""The chat tab: one model, a conversation of several turns with images or a video.

Each answer is labelled with its model and speed, and opens to the exact prompt the engine got.
Every handler takes the tab's `Visit` (`app.domain.sessions`) and changes only its `chat` session.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import gradio as gr

from app.catalog.cards import ModelCard
from app.domain.compare import fenced
from app.domain.conversation import (
    ConversationError,
    GoneFile,
    Prompt,
    Session,
    Turn,
    check_media,
    left_out_notice,
    make_turn,
    same_turns,
    sent_media,
)
from app.domain.replies import Reply, until_stopped
from app.domain.sessions import Visit
from app.engines.base import SamplingSettings, card_sampling
from app.engines.tokens import context_length
from app.storage.history import shortened
from app.views.services import Playground, page_max_tokens, refusal
from app.views.widgets import (
    LATEX_DELIMITERS,
    SYSTEM_HINT,
    ExampleShelves,
    box_idle,
    box_streaming,
    forget_sent,
    message_box,
    plain_message,
    sampling_controls,
    settled_box,
)

log = logging.getLogger(__name__)

PRIVATE: dict[str, Any] = {"api_visibility": "private"}  # page events, not API endpoints
WAITING = "Waiting for the model"
PREPARING = "Preparing the prompt…"
STATUS_REFRESH_S = 1.0
NO_VISIT = "This page lost its session; reload it to start again."
CHANGED_MEANWHILE = "The chat changed while this message was being prepared; send it again."
EDITING = (
    "Editing message {number}: change its text or files in the box and send it; the chat goes on "
    "from there as a new version, and the earlier one stays under Versions."
)
# A version's place in the Versions menu: "message position:version", both counted from 0; a
# message's in the Edit menu: its position. Picks come from the page (or a script): data.
VERSION_CHOICE = re.compile(r"(\d{1,6}):(\d{1,6})")
MESSAGE_CHOICE = re.compile(r"\d{1,6}")
SNIPPET = 40


SAVE_FAILED = (
    "This conversation could not be stored just now; it is still here, and the next answer tries again."
)
KEPT_OPEN = "This conversation could not be stored just now, so it stays open: try again in a moment."
CLOSED_UNSTORED = (
    "The conversation before could not be stored just now, and a message went on in this one: "
    "its last changes were not kept."
)
# Stores a tab's chat (the session given: the one an answer went into, though another may be open
# by the time it ends) with the page's model and system prompt: "" once stored, else the line that
# says why not (`HistoryView.keep_chat`).
Keeper = Callable[[Visit, Session, str, str], Awaitable[str]]


class ChatView:
    def __init__(self, playground: Playground) -> None:
        self.playground = playground
        # Set by the history where conversations are kept: an answer is stored before the page
        # is shown its end, and a chat before Clear drops it.
        self.keeper: Keeper | None = None

    async def kept(self, visit: Visit | None, session: Session, key: str, system: str) -> str:
        """`session` stored as it is now (where a keeper is set); "" or why not."""
        if self.keeper is None or visit is None:
            return ""
        return await self.keeper(visit, session, key, system)

    async def kept_before_dropping(
        self, visit: Visit, key: str, system: str, session: Session | None = None
    ) -> str:
        """The open chat (or `session`, just let go of) stored before the tab drops it (Clear,
        New chat, another conversation opened), an answer still streaming in it as stopped (it
        stops once dropped); "" or why not (`SAVE_FAILED`: it stays open)."""
        session = visit.chat if session is None else session
        session.stop_unended()
        return await self.kept(visit, session, key, system)

    # --- handlers ----------------------------------------------------------------------------

    async def send(
        self, message: dict[str, Any], visit: Visit | None, key: str, system: str, *controls: Any
    ) -> AsyncIterator[tuple[Any, ...]]:
        """A new user message: checked and loaded, then answered as it streams."""
        message = plain_message(message)
        text, files = message["text"], message["files"]
        self.playground.active(visit)
        forget_sent(visit, "chat")  # an earlier message's, whose end never came (a tab closed)
        session = visit.chat if visit is not None else Session()
        # An edited message becomes a new version of its place; anything else follows the chat.
        editing = (
            session.editing if session.editing is not None and session.editing < len(session.turns) else None
        )
        # What must still be shown when the prompt is ready: the turns before, and the one edited.
        expected = session.turns[: editing + 1] if editing is not None else list(session.turns)
        earlier = expected[:-1] if editing is not None else expected
        # Shown at once: keeping the files and counting the prompt take seconds (a clip's frames,
        # a tokenizer's first load). A refusal below puts the message back in the box.
        shown = conversation(session, until=editing)
        yield [*shown, *preparing(text, files)], box_streaming(value=None), "", ""
        held = contextlib.ExitStack()  # the visitor's allowance, while the answer runs
        try:
            if visit is None:
                raise ConversationError(NO_VISIT)
            held.enter_context(self.playground.allowance.held(visit))
            card = self.playground.servable(key)
            sampling = self.playground.sampling(card, *controls)
            check_media(card, files)
            turn, clip = await make_turn(session, text, files, self.playground.decoder, card.video_frames)
            clips = {turn.video: clip} if clip else None
            prompt = await self.playground.prompt_for(card, [*earlier, turn], system, clips)
            # Undo, Clear, another version picked or another conversation opened while the prompt
            # was made: it was made for a chat that is no longer shown.
            if not session.starts_with(expected) or visit.chat is not session:
                raise ConversationError(CHANGED_MEANWHILE)
            if editing is None:
                session.turns.append(turn)
            else:
                session.branch(editing, turn)
            visit.sent["chat"] = message
        except Exception as error:
            held.close()
            yield shown_if(visit, session), box_idle(value=message), refusal(error), gr.skip()
            return
        except BaseException:  # cancelled while it was prepared: the place back now
            held.close()
            raise
        session.editing = None
        keep = partial(self.kept, visit, session, key, system)
        gone = partial(let_go, visit, session, turn)
        with held:
            async for update in self.answer(
                card, session, turn, prompt, sampling, box_streaming(value=None), keep, gone
            ):
                yield update
        if turn.reply is not None and turn.reply.state == "failed" and not gone():
            session.discard(turn)  # the message goes back to the box, to send again
            forget_sent(visit, "chat")
            session.editing = editing if session.starts_with(earlier) else None
            yield conversation(session), box_idle(value=message), gr.skip(), gr.skip()

    async def regenerate(
        self, visit: Visit | None, key: str, system: str, *controls: Any
    ) -> AsyncIterator[tuple[Any, ...]]:
        self.playground.active(visit)
        session = visit.chat if visit is not None else Session()
        if not session.turns:
            yield conversation(session), gr.skip(), "Nothing to regenerate yet.", gr.skip()
            return
        session.editing = None
        turn = session.turns[-1]
        held = contextlib.ExitStack()  # the visitor's allowance, while the answer runs
        try:
            if visit is not None:
                held.enter_context(self.playground.allowance.held(visit))
            card = self.playground.servable(key)
            sampling = self.playground.sampling(card, *controls)
            check_media(card, [str(path) for path in turn.files])
            prompt = await self.playground.prompt_for(card, session.turns, system)
            if not session.turns or session.turns[-1] is not turn or visit.chat is not session:
                raise ConversationError(CHANGED_MEANWHILE)  # changed while it was made
            # A new version of the last exchange: the earlier answer stays, under Versions.
            again = turn.again()
            session.branch(len(session.turns) - 1, again)
        except Exception as error:
            held.close()
            yield shown_if(visit, session), gr.skip(), refusal(error), gr.skip()
            return
        except BaseException:  # cancelled while it was prepared: the place back now
            held.close()
            raise
        keep = partial(self.kept, visit, session, key, system)
        gone = partial(let_go, visit, session, again)
        with held:
            async for update in self.answer(
                card, session, again, prompt, sampling, box_streaming(), keep, gone
            ):
                yield update
        if again.reply is not None and again.reply.state == "failed" and not gone():
            session.discard(again)  # the earlier answer shown again, rather than none
            yield conversation(session), gr.skip(), gr.skip(), gr.skip()

    async def answer(
        self,
        card: ModelCard,
        session: Session,
        turn: Turn,
        prompt: Prompt,
        sampling: SamplingSettings,
        box: gr.MultimodalTextbox,
        keep: Callable[[], Awaitable[str]],
        gone: Callable[[], bool],
    ) -> AsyncIterator[tuple[Any, ...]]:
        """Streams `card`'s answer into `turn`. Yields (chat, box, notice, size line); a
        failure ends with its notice and leaves the reply "failed". The stop button closes the
        stream, which aborts the request in the engine. The notice names the earlier files the
        model no longer sees. An answer that ended (or was stopped) is stored (`keep`) before
        the page is shown its end: a tab closed, or a New chat clicked, as it ends loses nothing.
        Where the tab let go of the turn meanwhile (`gone`), the answer stops and the chat shown
        then, another, is left alone."""
        session.stop_requested = False
        turns = session.turns[: session.turns.index(turn) + 1]
        turn.reply = Reply.of(card, media=sent_media(turns, prompt.left_out))
        messages, size = prompt.messages, prompt.size
        notice = left_out_notice(card, turns, prompt.left_out)
        yield conversation(session), box, notice, size_line(card, size, None)
        try:
            async with contextlib.aclosing(
                self.playground.reply_stream(card, messages, sampling, turn.reply)
            ) as replies:
                async for _ in until_stopped(replies, lambda: session.stop_requested or gone()):
                    if not turn.reply.ended:  # its end is shown below, once stored
                        yield conversation(session), gr.skip(), notice, gr.skip()
            if not turn.reply.ended:  # stopped before its stream started (it marks it otherwise)
                turn.reply.state = "stopped"
        except Exception as error:
            turn.reply.state = "failed"
            if gone():
                yield gr.skip(), box_idle(), gr.skip(), gr.skip()
                return
            yield conversation(session), box_idle(), refusal(error), gr.skip()
            return
        if not gone():
            await self.playground.draw_boxes(card, session, turn, turn.reply)
        unkept = "" if gone() else await keep()
        if gone():  # (checked again after each wait: the tab may let go of it meanwhile)
            yield gr.skip(), box_idle(), gr.skip(), gr.skip()
            return
        yield (
            conversation(session),
            box_idle(),
            unkept or notice,
            size_line(card, size, turn.reply.prompt_tokens or None),
        )

    def with_menus(
        self, handler: Callable[..., AsyncIterator[tuple[Any, ...]]], visit_at: int
    ) -> Callable[..., AsyncIterator[tuple[Any, ...]]]:
        """`handler`'s updates (the visit its input number `visit_at`) with the edit controls
        (`menus`) wherever the chat's shape changed: an edited message's versions are there
        to pick while its answer streams, not only once it ends."""

        async def updates(*inputs: Any) -> AsyncIterator[tuple[Any, ...]]:
            visit, shown = inputs[visit_at], None
            # Closed with this one: a tab gone mid-answer stops the answer in the engine at once.
            async with contextlib.aclosing(handler(*inputs)) as inner:
                async for update in inner:
                    now = menus_shape(visit)
                    changed = now is not None and not now.same_as(shown)
                    yield (*update, *(self.menus(visit) if changed else (gr.skip(),) * 3))
                    shown = now

        return updates

    def stop(self, visit: Visit | None) -> None:
        if visit is not None:
            visit.chat.stop_requested = True

    def undo(self, visit: Visit | None) -> tuple[Any, ...]:
        """Takes the last turn back into the box (where it was one version of several, the one
        shown before it comes back)."""
        session = visit.chat if visit is not None else Session()
        session.editing = None
        forget_sent(visit, "chat")  # taken back into the box: the visitor's again
        if not session.turns:
            return conversation(session), gr.skip(), ""
        turn = session.drop_last()
        files = [str(path) for path in turn.files]
        return conversation(session), box_idle(value={"text": turn.text, "files": files}), ""

    async def clear(self, visit: Visit | None, key: str | None = None, system: str = "") -> tuple[Any, ...]:
        """A new, empty chat; the one shown is stored first (where that fails, it stays). What
        the box holds stays there, unless it is a message being edited (its files are the
        dropped chat's): on a busy server the reply to Clear can come after the user typed on."""
        if visit is None:
            return [], box_idle(value=None), "", ""
        editing = visit.chat.editing is not None
        unkept = await self.replaced_by_a_new_chat(visit, key, system)
        if unkept == SAVE_FAILED:  # (the trash icon has emptied the chat on the page: shown again)
            return conversation(visit.chat), gr.skip(), KEPT_OPEN, gr.skip()
        return conversation(visit.chat), box_idle(value=None) if editing else box_idle(), unkept, ""

    async def replaced_by_a_new_chat(
        self, visit: Visit, key: str | None, system: str, new: Session | None = None
    ) -> str:
        """`new` (else a new, empty chat) in place of the open chat at once, then the open one
        stored (where `key`, its model, is given) and closed: a message sent while the store runs
        goes into the chat now shown (closed in place, the old one took it along; a CI run lost
        one so). "" or why it was not stored: where the store failed (`SAVE_FAILED`) and the tab
        has not changed the chat since, the old one is put back and `new` closed; where it has,
        the old chat's unstored changes are lost, and the line says so (`CLOSED_UNSTORED`)."""
        dropped = visit.chat
        new = Session() if new is None else new
        before = list(new.turns)
        visit.chat = new
        unkept = await self.kept_before_dropping(visit, key, system, dropped) if key is not None else ""
        if unkept == SAVE_FAILED:
            if visit.chat is new and same_turns(new.turns, before):
                visit.chat = dropped
                async with new.saving:
                    new.close()
                return SAVE_FAILED
            log.warning("conversation %s closed unstored: its store failed", dropped.conversation_id)
            unkept = CLOSED_UNSTORED
        async with dropped.saving:  # not while it is being stored: its files go
            dropped.close()
        return unkept

    def edit(self, choice: Any, visit: Visit | None) -> tuple[Any, ...]:
        """A message of the user's picked in the Edit menu: it goes into the box with its files,
        to change and send as a new version of that place (see `send`). Gradio's own inline
        edit is not used: its submit breaks on a message shown with pictures (Gradio 6.31)."""
        session = visit.chat if visit is not None else Session()
        found = MESSAGE_CHOICE.fullmatch(choice) if isinstance(choice, str) else None
        if found is None or int(found[0]) >= len(session.turns):
            return gr.skip(), "That message is no longer in the chat; pick another.", gr.skip()
        position = int(found[0])
        turn = session.turns[position]
        session.editing = position
        forget_sent(visit, "chat")
        files = [str(path) for path in turn.files]
        return (
            box_idle(value={"text": turn.text, "files": files}),
            EDITING.format(number=position + 1),
            gr.Button(visible=True),
        )

    def cancel_edit(self, visit: Visit | None) -> tuple[Any, ...]:
        if visit is not None:
            visit.chat.editing = None
        return box_idle(value=None), "", gr.Button(visible=False)

    def switch(self, choice: Any, visit: Visit | None) -> tuple[Any, ...]:
        """Shows another version of the chat, picked in the Versions menu."""
        session = visit.chat if visit is not None else Session()
        found = VERSION_CHOICE.fullmatch(choice) if isinstance(choice, str) else None
        if found is None:
            return gr.skip(), gr.skip()
        session.editing = None
        try:
            session.switch(int(found[1]), int(found[2]))
        except ConversationError as error:
            return conversation(session), str(error)
        return conversation(session), ""

    def refreshes_after(self, event: Any, visit: gr.State) -> None:
        """After `event`, the edit controls show the chat as it now is (`menus`)."""
        event.then(
            self.menus,
            [visit],
            [self.edit_menu, self.versions, self.cancel],
            show_progress="hidden",
            **PRIVATE,
        )

    def menus(self, visit: Visit | None) -> tuple[gr.Dropdown, gr.Dropdown, gr.Button]:
        """The Edit menu (the user's messages) and the Versions menu (every version of every
        edited or regenerated place on the chat's shown path), each hidden while empty, and
        Cancel edit, shown while a message is being edited."""
        session = visit.chat if visit is not None else Session()
        messages = [
            (f"{n + 1}. {snippet(turn, answer=False)}", str(n)) for n, turn in enumerate(session.turns)
        ]
        choices = []
        for position, turn in enumerate(session.turns):
            if turn.versions is None:
                continue
            shown, count = turn.versions.place(turn), len(turn.versions.tails)
            for version, tail in enumerate(turn.versions.tails):
                mark = " (shown)" if version == shown else ""
                label = f"Message {position + 1}, version {version + 1} of {count}{mark}: {snippet(tail[0])}"
                choices.append((label, f"{position}:{version}"))
        return (
            gr.Dropdown(choices=messages, value=None, visible=bool(messages)),
            gr.Dropdown(choices=choices, value=None, visible=bool(choices)),
            gr.Button(visible=session.editing is not None),
        )

    def picked(self, key: str | None, visit: Visit | None) -> tuple[Any, ...]:
        """The card, the state, the system prompt box and the model's sampling defaults."""
        if visit is not None and key:
            visit.chat_model = key
        choice = self.playground.choices.get(key or "")
        takes = choice is None or choice.card.takes_system_prompt
        hint = SYSTEM_HINT if takes else "This model's prompt format has no system prompt"
        defaults = card_sampling(choice.card) if choice is not None else SamplingSettings().for_card(None)
        return (
            self.card_panel(key),
            self.playground.status_line(key),
            gr.Textbox(interactive=takes, placeholder=hint),
            gr.Slider(value=defaults.temperature),
            gr.Slider(value=defaults.top_p),
            gr.Slider(value=defaults.max_tokens, maximum=page_max_tokens(choice and choice.card)),
            # The examples this model can answer.
            *self.shelves.show([choice.card] if choice is not None else []),
        )

    def resumed(self, visit: Visit | None) -> tuple[Any, ...]:
        """After a (re)load: the tab's conversation and model as they were."""
        if visit is None:
            return gr.skip(), gr.skip()
        visit.chat.editing = None  # the box starts empty after a reload
        return conversation(visit.chat), visit.chat_model or gr.skip()

    def card_panel(self, key: str | None) -> str:
        choice = self.playground.choices.get(key or "")
        if choice is None:
            return "Pick a model."
        card = choice.card
        limits = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in card.media_limits.items())
        frames = f" · **video frames sampled:** {card.video_frames}" if "video" in card.modalities else ""
        lines = [
            f"### {card.display_name}",
            f"**Model:** `{card.source}`",
            f"**Takes:** text, {' and '.join(card.modalities)} (at most {limits} per prompt: past "
            "that, a chat's oldest files are left out)",
            f"**Context:** {context_length(card) or 'model default'} tokens{frames}",
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

    # --- layout ------------------------------------------------------------------------------

    def layout(self, visit: gr.State) -> gr.Chatbot:
        """The tab's components and events; returns the conversation (the page restores it)."""
        playground = self.playground
        labels = playground.model_options()
        with gr.Row(equal_height=False):
            # On a phone the columns stack: the model and its settings come first, above the chat.
            with gr.Column(scale=2, min_width=300, elem_id="chat-settings"):
                self.model = model = gr.Dropdown(
                    labels, value=playground.default_model, label="Model", elem_id="model"
                )
                state = gr.Markdown(playground.status_line(playground.default_model), elem_id="model-state")
                self.system = system = gr.Textbox(
                    label="System prompt", elem_id="system", placeholder=SYSTEM_HINT
                )
                default = playground.choices.get(playground.default_model or "")
                sampling = sampling_controls("chat", default.card if default is not None else None)
                with gr.Accordion("About this model", open=False, elem_id="model-card-box"):
                    # Written again when the page loads (`Page`): a context registered since shows.
                    self.panel = panel = gr.Markdown(
                        self.card_panel(playground.default_model), elem_id="model-card"
                    )
                unavailable = [c for c in playground.choices.values() if c.reason]
                if unavailable:
                    # Listed with the reason rather than offered in the picker and refused on send.
                    with gr.Accordion(
                        f"Not served here ({len(unavailable)})", open=False, elem_id="unavailable"
                    ):
                        gr.Markdown("\n".join(f"- **{c.label}**: {c.reason}" for c in unavailable))
            with gr.Column(scale=3, min_width=320):
                chatbot = gr.Chatbot(
                    elem_id="chat",
                    # Most of the window, so that a turn with pictures fits without scrolling.
                    height="72vh",
                    min_height=420,
                    label="Conversation",
                    # Copies an answer's raw text (its Markdown and LaTeX as the model wrote them).
                    buttons=["copy"],
                    latex_delimiters=LATEX_DELIMITERS,
                )
                with gr.Row():
                    # A message to edit and send again, and the chat's versions to go back to.
                    self.edit_menu = edit_menu = gr.Dropdown(
                        [], value=None, label="Edit a message", elem_id="edit-menu", visible=False
                    )
                    self.versions = versions = gr.Dropdown(
                        [], value=None, label="Versions", elem_id="versions", visible=False
                    )
                # Above the input box: a grown box pushed a refusal below the window's edge.
                notice = gr.Markdown(elem_id="notice")
                self.box = box = message_box(
                    "chat-input", "Ask about images or a video: drop several images or one clip"
                )
                with gr.Row():
                    regenerate = gr.Button("Regenerate", elem_id="regenerate", size="sm")
                    undo = gr.Button("Undo last turn", elem_id="undo", size="sm")
                    clear = gr.Button("Clear", elem_id="clear", size="sm")
                    self.cancel = cancel = gr.Button(
                        "Cancel edit", elem_id="cancel-edit", size="sm", visible=False
                    )
                size = gr.Markdown(elem_id="prompt-size")
                cards = {key: playground.choices[key].card for _, key in labels}
                shown = [cards[playground.default_model]] if playground.default_model in cards else []
                self.shelves = ExampleShelves(box, [[c] for c in cards.values()], shown, "chat-examples")
        inputs, outputs = [visit, model, system, *sampling], [chatbot, box, notice, size]
        # A second Enter while an answer streams is sent when it ends (not dropped).
        menus = [edit_menu, versions, cancel]
        sent = box.submit(
            self.with_menus(self.send, visit_at=1),
            [box, *inputs],
            [*outputs, *menus],
            show_progress_on=[chatbot],
            trigger_mode="always_last",
            **PRIVATE,
        )
        sent.then(playground.status_line, [model], [state], show_progress="hidden", **PRIVATE)
        again = regenerate.click(
            self.with_menus(self.regenerate, visit_at=0),
            inputs,
            [*outputs, *menus],
            show_progress_on=[chatbot],
            **PRIVATE,
        )
        # The Send button comes back however the answer ended.
        sent.then(settled_box("chat"), [box, visit], [box], show_progress="hidden", queue=False, **PRIVATE)
        again.then(box_idle, None, [box], show_progress="hidden", queue=False, **PRIVATE)
        box.stop(self.stop, [visit], None, concurrency_limit=None, **PRIVATE)
        undone = undo.click(self.undo, [visit], [chatbot, box, notice], **PRIVATE)
        edited = edit_menu.input(self.edit, [edit_menu, visit], [box, notice, cancel], **PRIVATE)
        cancel.click(self.cancel_edit, [visit], [box, notice, cancel], **PRIVATE)
        switched = versions.input(self.switch, [versions, visit], [chatbot, notice], **PRIVATE)
        # Where the conversation changed for good: the history stores it then (`HistoryView`).
        self.changed = [sent, again, undone, switched]
        self.notice = notice
        # The chat's own trash icon clears the conversation too, not only the screen.
        self.cleared = gr.on(
            [clear.click, chatbot.clear], self.clear, [visit, model, system], outputs, **PRIVATE
        )
        for event in (*self.changed, edited, self.cleared):
            self.refreshes_after(event, visit)
        model.change(
            self.picked,
            [model, visit],
            [panel, state, system, *sampling[:3], *self.shelves.columns],
            show_progress="hidden",
            **PRIVATE,
        )
        gr.Timer(STATUS_REFRESH_S).tick(
            playground.status_line,
            [model],
            [state],
            concurrency_limit=None,
            show_progress="hidden",
            **PRIVATE,
        )
        return chatbot


def let_go(visit: Visit | None, session: Session, turn: Turn) -> bool:
    """Whether the tab let go of `turn` while its answer streamed (Undo, Clear, New chat, another
    conversation opened): its answer is stopped, and the chat then shown is not written over."""
    if visit is not None and visit.chat is not session:
        return True
    return not any(kept is turn for kept in session.every_turn())


def shown_if(visit: Visit | None, session: Session) -> Any:
    """`session`'s chat for the page, unless the tab shows another now."""
    return conversation(session) if visit is None or visit.chat is session else gr.skip()


@dataclass(frozen=True, eq=False)
class MenusShape:
    """What the edit controls show of a chat: the very turns shown (held, so that none is freed
    and its memory taken by another turn, which `id()` then took for the same), each one's number
    of versions, and the message edited."""

    session: Session
    turns: tuple[Turn, ...]
    versions: tuple[int, ...]
    editing: int | None

    def same_as(self, other: MenusShape | None) -> bool:
        return (
            other is not None
            and other.session is self.session
            and same_turns(other.turns, self.turns)
            and (other.versions, other.editing) == (self.versions, self.editing)
        )


def menus_shape(visit: Visit | None) -> MenusShape | None:
    if visit is None:
        return None
    session = visit.chat
    versions = tuple(len(t.versions.tails) if t.versions else 0 for t in session.turns)
    return MenusShape(session, tuple(session.turns), versions, session.editing)


def size_line(card: ModelCard, size: int, counted: int | None) -> str:
    context = context_length(card)
    limit = f" of {context:,}" if context else ""
    text = f"Prompt: about {size:,}{limit} tokens (estimated before sending)"
    return text + (f"; the engine counted {counted:,}." if counted is not None else ".")


def preparing(text: str, files: list[str]) -> list[dict[str, Any]]:
    """A message just sent, as the chat shows it while its prompt is prepared."""
    names = ", ".join(Path(f).name for f in files)
    shown = [{"role": "user", "content": part} for part in (text, names and f"📎 {names}") if part]
    return [*shown, {"role": "assistant", "content": PREPARING}]


def conversation(session: Session, until: int | None = None) -> list[dict[str, Any]]:
    """The conversation as the Chatbot shows it (its first `until` turns, if given): files, video
    frames with times, answers, and under each answer a line with its model and speed (and which
    version it is, where there are several) that opens to the exact prompt."""
    return [message for turn in session.turns[:until] for message in turn_view(turn)]


def snippet(turn: Turn, answer: bool = True) -> str:
    """A turn as a menu names it: its message (then its answer), cut short."""
    files = f" (+{len(turn.files)} file{'s' if len(turn.files) != 1 else ''})" if turn.files else ""
    said = (f"“{shortened(turn.text, SNIPPET)}”" if turn.text else "files only") + files
    return f"{said} → “{shortened(turn.answer, SNIPPET)}”" if answer and turn.answer else said


def turn_view(turn: Turn) -> list[dict[str, Any]]:
    """One turn's messages in the Chatbot."""
    messages: list[dict[str, Any]] = []
    for path in turn.files:
        messages.append({"role": "user", "content": {"path": str(path)}})
    for gone in turn.gone:
        messages.append({"role": "user", "content": gone_view(gone)})
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
    reply = turn.reply
    if reply is None:
        return messages
    if reply.answer:
        messages.append({"role": "assistant", "content": reply.answer})
    if reply.boxes_drawn is not None:
        boxes = f"{reply.box_count} box{'es' if reply.box_count != 1 else ''}"
        picture = gr.Image(
            str(reply.boxes_drawn),
            label=f"The {boxes} this answer names, drawn on the picture",
            elem_classes=["boxes"],
            buttons=["download", "fullscreen"],
        )
        messages.append({"role": "assistant", "content": picture})
    if not reply.answer and not reply.ended:
        messages.append({"role": "assistant", "content": f"{WAITING}: {reply.display_name} is {reply.state}"})
    if reply.ended:
        version = ""
        if turn.versions is not None:
            version = f"Version {turn.versions.place(turn) + 1} of {len(turn.versions.tails)} · "
        details = {"title": version + reply.label(), "status": "done"}
        messages.append({"role": "assistant", "content": what_was_sent(reply), "metadata": details})
    return messages


def gone_view(gone: GoneFile) -> Any:
    """A file the server no longer keeps: its thumbnail, saying the model does not see it."""
    line = (
        f"{gone.medium.name}: no longer kept on the server, so the model does not see it; "
        "attach it again to ask about it"
    )
    if gone.thumbnail is None:
        return line
    return gr.Image(str(gone.thumbnail), label=line, elem_classes=["gone"], buttons=[])


def what_was_sent(reply: Reply) -> str:
    """The exact prompt the engine got (as it counted it), the media and the sampling."""
    if reply.prompt:
        prompt = [
            f"**Prompt** ({reply.prompt_tokens:,} tokens, as the engine counted them):",
            *fenced(reply.prompt),
        ]
    else:
        prompt = ["**Prompt:** the answer was stopped before the engine reported it."]
    media = [f"- {line}" for line in reply.media] or ["(none)"]
    sampling = ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in reply.sampling.items())
    return "\n".join(
        [
            f"**Model:** {reply.display_name} ({reply.source})",
            "",
            *prompt,
            "",
            "**Media:**",
            *media,
            "",
            f"**Sampling:** {sampling}",
        ]
    )
