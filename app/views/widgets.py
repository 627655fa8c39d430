"""Controls more than one view uses: the message box, the sampling controls, the examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from app.catalog.cards import ModelCard
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
    return gr.MultimodalTextbox(
        elem_id=elem_id,
        file_count="multiple",
        file_types=["image", "video"],
        placeholder=placeholder,
        show_label=False,
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


# Questions the seeing demo model (`app.demo.seeing_model`) answers, on files it never saw: first in
# the examples where it is offered (a machine without a GPU), so the demo's answers mean something.
SEEING_EXAMPLES = [
    ("What shape is it?", ["one_shape.png"]),
    ("Which side of the picture is the shape on?", ["one_shape.png"]),
    ("How many shapes are there?", ["three_shapes.png"]),
    ("What colour is the shape in the second picture?", ["one_shape.png", "green_square.png"]),
    ("What colour does the clip end with?", ["colour_change.mp4"]),
]


def example_messages(seeing: bool = False) -> list[list[dict[str, Any]]]:
    """The examples under the chat; with `seeing`, the seeing demo model's questions first."""
    first = [[{"text": text, "files": [str(EXAMPLES / f) for f in files]}] for text, files in SEEING_EXAMPLES]
    return (first if seeing else []) + [
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
