"""Controls more than one view uses: the message box, the sampling controls, the examples."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from app.catalog.cards import ModelCard
from app.demo.models import EXAMPLE_KINDS, SEEING_MODELS
from app.domain.sessions import Visit
from app.engines.base import SamplingSettings, card_sampling
from app.views.services import page_max_tokens

STATIC = Path(__file__).resolve().parent.parent.parent / "static"
EXAMPLES = STATIC / "examples"
SYSTEM_HINT = "Optional; used where the model's prompt format has a system prompt"
# The message box while an answer streams: its Send button becomes Stop (Escape clicks it),
# and what the user types meanwhile stays in the box for the next message.
STREAMING = {"submit_btn": False, "stop_btn": True}
IDLE = {"submit_btn": True, "stop_btn": False}


# LaTeX as OCR and document models write it: display between $$ or \[ \], inline between
# \( \). A lone $ is left as text: it is far more often a price than a formula.
LATEX_DELIMITERS: list[dict[str, str | bool]] = [
    {"left": "$$", "right": "$$", "display": True},
    {"left": "\\[", "right": "\\]", "display": True},
    {"left": "\\(", "right": "\\)", "display": False},
]


def message_box(elem_id: str, placeholder: str) -> gr.MultimodalTextbox:
    """A view's message box. It takes input once the page has its session (`Page.resume`): on
    a busy server a message typed as the page opened was sent before the session was there, and
    refused as if the page had lost it."""
    return gr.MultimodalTextbox(
        elem_id=elem_id,
        file_count="multiple",
        file_types=["image", "video"],
        placeholder=placeholder,
        show_label=False,
        interactive=False,
        **IDLE,
    )


def box_streaming(**value: Any) -> gr.MultimodalTextbox:
    return gr.MultimodalTextbox(**value, **STREAMING)


def box_idle(**value: Any) -> gr.MultimodalTextbox:
    """The message box ready for input; a refused message goes back into it, with those of its
    files that are still there (a file gone meanwhile cannot be shown again)."""
    message = value.get("value")
    if isinstance(message, dict) and message.get("files"):
        kept = [f for f in message["files"] if isinstance(f, str) and Path(f).is_file()]
        value = {**value, "value": {**message, "files": kept}}
    return gr.MultimodalTextbox(**value, **IDLE)


def plain_message(message: Any) -> dict[str, Any]:
    """A message as the page sends it ({"text": str, "files": [str]}), whatever the API sent:
    other types are taken as no text and no files, never passed on to fail deeper."""
    if not isinstance(message, dict):
        message = {"text": message if isinstance(message, str) else ""}
    text = message.get("text")
    files = message.get("files")
    return {
        "text": text if isinstance(text, str) else "",
        "files": [f for f in files if isinstance(f, str)] if isinstance(files, list) else [],
    }


def forget_sent(visit: Visit | None, view: str) -> None:
    """`view`'s box holds the visitor's own message again (put back, taken back, or a new one
    sent): nothing of it is the server's to empty (`settled_box`)."""
    if visit is not None:
        visit.sent.pop(view, None)


def settled_box(view: str) -> Callable[[Any, Visit | None], gr.MultimodalTextbox]:
    """What a view's box becomes when an answer ends: ready for input, and emptied if it still
    holds, whole, the message `view` sent (`Visit.sent`). The answer's first update clears the box,
    and in about 4 of 190 tries on a busy machine the page did not take that clear: the whole
    message (two pictures picked together, and its text) stayed, and went again with the next
    (docs/TESTING.md). A message typed since, put back after a refusal or taken back by
    Undo or Edit (`forget_sent`) stays."""

    def settle(message: Any, visit: Visit | None) -> gr.MultimodalTextbox:
        sent = visit.sent.pop(view, None) if visit is not None else None
        if sent is not None and plain_message(message) == plain_message(sent):
            return box_idle(value=None)
        return box_idle()

    return settle


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
            # Seeds are whole numbers from 0; 0 asks for a random one.
            gr.Number(value=0, minimum=0, precision=0, label="Seed (0: random)", elem_id=f"{prefix}-seed"),
        ]


@dataclass(frozen=True)
class Example:
    """A message the page offers to send: its text and the example files it attaches."""

    text: str
    files: tuple[str, ...]
    # Asks for a box: offered only to models that write boxes the chat draws (a card's grounding).
    boxes: bool = False
    # The seeing models' kind of question (`app.demo.shapes.KINDS`): offered to a seeing model only
    # where it answers that kind (`EXAMPLE_KINDS`).
    kind: str | None = None

    def message(self) -> dict[str, Any]:
        return {"text": self.text, "files": [str(EXAMPLES / name) for name in self.files]}

    def count(self, kind: str) -> int:
        suffixes = {"image": (".png", ".jpg"), "video": (".mp4",)}[kind]
        return sum(name.endswith(suffixes) for name in self.files)


# Questions the seeing demo models (`app.demo.seeing_model`, `app.demo.seeing_llava`) answer, on
# files they never saw: all they are offered, since they answer nothing else ("Which bar is the
# tallest?" got "three"), and to each only the kinds it answers (the second model described the
# three shapes as two).
SEEING_EXAMPLES = (
    Example("What shape is it?", ("one_shape.png",), kind="shape"),
    Example("What colour is the shape?", ("one_shape.png",), kind="colour"),
    Example("Which side of the picture is the shape on?", ("one_shape.png",), kind="side"),
    Example("Describe the picture.", ("three_shapes.png",), kind="describe"),
    Example("Where is the red circle?", ("three_shapes.png",), boxes=True, kind="box"),
    Example("What colour is the square?", ("three_shapes.png",), kind="colour of"),
    Example("How many shapes are there?", ("three_shapes.png",), kind="count"),
    Example("How many red shapes are there?", ("three_shapes.png",), kind="colour count"),
    Example(
        "What colour is the shape in the second picture?",
        ("one_shape.png", "green_square.png"),
        kind="second",
    ),
    Example("What colour does the clip end with?", ("colour_change.mp4",), kind="end"),
)
# For every other model.
GENERAL_EXAMPLES = (
    Example("What shapes do you see, and what colour is each?", ("shapes.png",)),
    Example("Which bar is the tallest?", ("bar_chart.png",)),
    Example("Describe how the ball moves.", ("bouncing_ball.mp4",)),
    Example("Compare these two pictures.", ("shapes.png", "bar_chart.png")),
)


def fitting_examples(cards: Sequence[ModelCard], enough: int | None = None) -> tuple[Example, ...]:
    """The examples `enough` of `cards` (default: every one) can answer: the seeing models' own
    questions where one is among them, else the general ones; each only where those cards take its
    kinds of file and as many of them in one prompt (no clip for a model of pictures, no two
    pictures for a model of one), and a question for a box only where they write boxes."""
    if not cards:
        return ()
    pool = SEEING_EXAMPLES if any(card.key in SEEING_MODELS for card in cards) else GENERAL_EXAMPLES
    needed = len(cards) if enough is None else enough
    return tuple(example for example in pool if sum(answers(card, example) for card in cards) >= needed)


def answers(card: ModelCard, example: Example) -> bool:
    """Whether `card`'s model takes the example's files, for a box writes boxes, and for a seeing
    model's question answers its kind."""
    fits = all(example.count(kind) <= card.media_limits.get(kind, 0) for kind in ("image", "video"))
    answered = example.kind is None or example.kind in EXAMPLE_KINDS.get(card.key, (example.kind,))
    return fits and answered and (card.grounding is not None or not example.boxes)


class ExampleShelves:
    """The examples under a message box, as many blocks as the choices of models can need, the
    one that fits the models chosen shown (Gradio's examples cannot change their list in place:
    a click loads an example by its number in the list it was built with)."""

    def __init__(
        self,
        box: gr.MultimodalTextbox,
        choices: Sequence[Sequence[ModelCard]],
        shown: Sequence[ModelCard],
        elem_id: str,
        enough: int | None = None,
    ) -> None:
        self.enough = enough
        self.sets: list[tuple[Example, ...]] = []
        for cards in choices:
            examples = fitting_examples(cards, enough)
            if examples and examples not in self.sets:
                self.sets.append(examples)
        current = self._best(fitting_examples(shown, enough))
        self.columns = []
        for number, examples in enumerate(self.sets):
            with gr.Column(visible=examples == current, elem_id=f"{elem_id}-{number}") as column:
                messages = [[example.message()] for example in examples]
                shelf = gr.Examples(messages, inputs=[box], label="Examples")
                # A click puts the example in the box and changes nothing else. Gradio sets the
                # box's other properties back as it was built: closed as before the tab's session
                # (`message_box`), Send in place of Stop while an answer streams.
                shelf.input_component_props = [{} for _ in shelf.input_component_props]
            self.columns.append(column)

    def _best(self, fitting: tuple[Example, ...]) -> tuple[Example, ...] | None:
        """The block to show: the one of exactly these examples, else the largest of some of them."""
        if fitting in self.sets:
            return fitting
        inside = [examples for examples in self.sets if set(examples) <= set(fitting)]
        return max(inside, key=len) if inside and fitting else None

    def show(self, cards: Sequence[ModelCard]) -> list[gr.Column]:
        current = self._best(fitting_examples(cards, self.enough))
        return [gr.Column(visible=examples == current) for examples in self.sets]
