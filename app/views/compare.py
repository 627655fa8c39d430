"""The compare tab: one message answered by two to four models side by side, then exported.

Every handler takes the tab's `Visit` (`app.domain.sessions`) and changes only its `compare` session.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import gradio as gr

from app.catalog.cards import ModelCard
from app.domain import compare
from app.domain.compare import Comparison
from app.domain.conversation import ConversationError, Session, check_media, make_turn
from app.domain.replies import Reply
from app.domain.sessions import Visit
from app.views.chat import NO_VISIT, PRIVATE
from app.views.services import WARNING, Playground, refusal, within_page_bounds
from app.views.widgets import (
    LATEX_DELIMITERS,
    SYSTEM_HINT,
    ExampleShelves,
    box_idle,
    box_streaming,
    forget_sent,
    message_box,
    sampling_controls,
    settled_box,
)

OPENED_MEANWHILE = "Another comparison was opened while this message was being prepared; send it again."


class CompareView:
    def __init__(self, playground: Playground) -> None:
        self.playground = playground
        # Set by the history where conversations are kept (`HistoryView.keep_compare`): a run
        # is stored before the page is shown its end.
        self.keeper: Callable[[Visit, Session, list[str], str], Awaitable[str]] | None = None

    async def kept_before_dropping(self, visit: Visit) -> str:
        """The comparison shown stored before the tab drops it (another opened), under its own
        run's models and system prompt (the page may show others by now), a run still streaming
        as stopped, and stopped; "" or why not (`SAVE_FAILED`: it stays open, stopped)."""
        session = visit.compare
        if self.keeper is None or not session.turns:
            return ""
        session.stop_unended()
        keys = [column.key for column in session.turns[-1].columns]
        return await self.keeper(visit, session, keys, session.system_prompt)

    # --- handlers ----------------------------------------------------------------------------

    async def compare(
        self,
        message: dict[str, Any],
        visit: Visit | None,
        keys: list[str],
        system: str,
        own_defaults: bool,
        *controls: Any,
    ) -> AsyncIterator[tuple[Any, ...]]:
        """`own_defaults`: each model answers with its own temperature and top-p, as it does in
        the chat, the arena and the grid (the seeing model's 0, say), not the sliders'."""
        text, files = message.get("text") or "", list(message.get("files") or [])
        self.playground.active(visit)
        forget_sent(visit, "compare")  # an earlier message's, whose end never came
        session = visit.compare if visit is not None else Session()
        held = contextlib.ExitStack()  # the visitor's allowance, while the answers run
        try:
            if visit is None:
                raise ConversationError(NO_VISIT)
            held.enter_context(self.playground.allowance.held(visit))
            cards = [self.playground.servable(key) for key in keys or []]
            if not compare.MIN_MODELS <= len(cards) <= compare.MAX_MODELS:
                raise ConversationError(
                    f"Pick {compare.MIN_MODELS} to {compare.MAX_MODELS} models to compare."
                )
            if own_defaults:
                controls = (None, None, *controls[2:])
            sampling = self.playground.sampling(cards[0], *controls)
            for card in cards[1:]:
                within_page_bounds(card, sampling)  # the same values, each model's bounds
            async with session.saving:  # not while the last run is being stored: its files go
                session.close()
            turn, clip = await make_turn(session, text, files, self.playground.decoder, cards[0].video_frames)
        except Exception as error:
            held.close()
            yield (
                *columns_view(None),
                gr.skip(),
                box_idle(value=message),
                refusal(error),
                gr.skip(),
                gr.skip(),
            )
            return
        except BaseException:  # cancelled while it was prepared: the place back now
            held.close()
            raise
        # What the run yields where another comparison was opened meanwhile: the one shown stays.
        left_alone = (*(gr.skip(),) * len(columns_view(None)), gr.skip(), box_idle(), *(gr.skip(),) * 3)
        if visit.compare is not session:  # another opened while the message was prepared: back to the box
            held.close()
            notice = refusal(ConversationError(OPENED_MEANWHILE))
            yield (*left_alone[:-4], box_idle(value=message), notice, *left_alone[-2:])
            return
        comparison = Comparison(text, [Path(f).name for f in files], system, sampling)
        # The session holds the run as one turn whose columns fill as they stream (the history
        # stores it from there once it ends).
        session.turns.append(turn)
        visit.sent["compare"] = message
        session.system_prompt = system
        turn.columns = comparison.columns

        async def messages_for(card: ModelCard) -> list[dict[str, Any]]:
            check_media(card, files)
            same_frames = clip is not None and card.video_frames == cards[0].video_frames
            prompt = await self.playground.prompt_for(
                card, [turn], system, {turn.video: clip} if same_frames else None
            )
            return prompt.messages

        session.stop_requested = False
        sent = sent_view(comparison, turn.media)
        box = box_streaming(value=None)

        def gone() -> bool:  # another comparison opened meanwhile
            return visit.compare is not session or not any(t is turn for t in session.turns)

        with held:
            async with contextlib.aclosing(
                compare.run(self.playground.manager, comparison, cards, messages_for, media=turn.media)
            ) as run:
                async for update in run:
                    turn.columns = update.columns
                    if session.stop_requested or gone():
                        break
                    if all(column.ended for column in update.columns):
                        continue  # the end is shown below, once stored
                    yield *columns_view(update), sent, box, "", gr.skip(), gr.skip()
                    sent, box = gr.skip(), gr.skip()
        for card, column in zip(cards, comparison.columns, strict=True):
            if column.state == "done" and not gone():
                await self.playground.draw_boxes(card, session, turn, column)
        unkept = await self.keeper(visit, session, keys, system) if self.keeper and not gone() else ""
        if gone():  # (checked again after each wait)
            yield left_alone
            return
        yield *columns_view(comparison), sent, box_idle(), unkept, *self.exports(session, comparison)

    def stop(self, visit: Visit | None) -> None:
        if visit is not None:
            visit.compare.stop_requested = True

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

    # --- layout ------------------------------------------------------------------------------

    def layout(self, visit: gr.State) -> None:
        servable = self.playground.model_options()
        picked = self.playground.compare_picks()
        keys = gr.Dropdown(
            servable,
            value=picked,
            multiselect=True,
            max_choices=compare.MAX_MODELS,
            elem_id="compare-models",
            label=f"Models to compare ({compare.MIN_MODELS} to {compare.MAX_MODELS})",
        )
        notice = gr.Markdown(elem_id="compare-notice")
        self.box = box = message_box("compare-input", "One message (text, images or a clip) for every model")
        # The examples every model picked can answer (before a pick, the default model's).
        cards = [self.playground.choices[key].card for _, key in servable]
        default = self.playground.choices.get(self.playground.default_model or "")
        shown = [default.card] if default is not None and not default.reason else []
        picked_cards = [self.playground.choices[key].card for key in picked]
        pairs = [[a, b] for i, a in enumerate(cards) for b in cards[i + 1 :]]
        shelves = ExampleShelves(box, [[c] for c in cards] + pairs, picked_cards or shown, "compare-examples")
        keys.change(
            lambda picked: shelves.show([self.playground.choices[k].card for k in picked or []] or shown),
            [keys],
            shelves.columns,
            show_progress="hidden",
            **PRIVATE,
        )
        sent = gr.Markdown(elem_id="compare-sent")
        columns: list[Any] = []
        with gr.Row():
            for index in range(compare.MAX_MODELS):
                with gr.Column(visible=False, min_width=220) as column:
                    columns += [column, gr.Markdown(elem_id=f"compare-head-{index}")]
                    columns.append(
                        gr.Markdown(
                            elem_id=f"compare-answer-{index}",
                            buttons=["copy"],
                            latex_delimiters=LATEX_DELIMITERS,
                        )
                    )
                    columns.append(
                        gr.Image(visible=False, interactive=False, elem_id=f"compare-boxes-{index}")
                    )
        with gr.Row():
            export_json = gr.DownloadButton(
                "Export JSON", elem_id="export-json", interactive=False, size="sm"
            )
            export_md = gr.DownloadButton(
                "Export Markdown", elem_id="export-md", interactive=False, size="sm"
            )
        system = gr.Textbox(label="System prompt", elem_id="compare-system", placeholder=SYSTEM_HINT)
        own_defaults = gr.Checkbox(
            True,
            label="Each model's own temperature and top-p (as in the chat); off: the sliders' for all",
            elem_id="compare-own-sampling",
        )
        sampling = sampling_controls("compare")
        asked = box.submit(
            self.compare,
            [box, visit, keys, system, own_defaults, *sampling],
            [*columns, sent, box, notice, export_json, export_md],
            show_progress="hidden",
            **PRIVATE,
        )
        asked.then(
            settled_box("compare"), [box, visit], [box], show_progress="hidden", queue=False, **PRIVATE
        )
        # What the history view stores and restores (`HistoryView`).
        self.asked, self.keys, self.system, self.notice, self.sent = asked, keys, system, notice, sent
        self.columns, self.exported = columns, [export_json, export_md]
        box.stop(self.stop, [visit], None, concurrency_limit=None, **PRIVATE)


def sent_view(comparison: Comparison, media: list[str]) -> str:
    """What every model was sent, above the columns."""
    files = "; ".join(media) or "no files"
    system = f" · system prompt: {len(comparison.system):,} characters" if comparison.system else ""
    return f"**Sent to every model:** {comparison.text or '(no text)'}  \n*{files}{system}*"


def columns_view(comparison: Comparison | None) -> list[Any]:
    updates: list[Any] = []
    columns = comparison.columns if comparison else []
    for index in range(compare.MAX_MODELS):
        if index < len(columns):
            column = columns[index]
            head = f"### {column.display_name}\n{column.header()}"
            body = column.answer or (f"{WARNING}{column.error}" if column.error else "…")
            updates += [gr.Column(visible=True), head, body, boxes_view(column)]
        else:
            updates += [gr.Column(visible=False), "", "", gr.Image(value=None, visible=False)]
    return updates


def boxes_view(column: Reply) -> gr.Image:
    """The boxes a column's answer names, drawn on the picture (models that ground)."""
    if column.boxes_drawn is None:
        return gr.Image(value=None, visible=False)
    boxes = f"{column.box_count} box{'es' if column.box_count != 1 else ''}"
    return gr.Image(value=str(column.boxes_drawn), visible=True, label=f"The {boxes} this answer names")
