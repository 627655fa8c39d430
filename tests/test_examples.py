"""The page's examples follow the models chosen (app.views.widgets): the seeing demo models are
offered only the questions they answer, and no model a file kind or count it does not take, nor a
box it does not write."""

from __future__ import annotations

import re
from pathlib import Path

import gradio as gr

from app.catalog.cards import load_cards
from app.demo.models import EXAMPLE_KINDS, SEEING_MODELS
from app.demo.seeing_llava import SECOND_BASE_CARD, second_card
from app.demo.seeing_model import BASE_CARD, seeing_card
from app.demo.shapes import COLOURS, KINDS, QUESTIONS, SHAPES
from app.views.widgets import GENERAL_EXAMPLES, SEEING_EXAMPLES, ExampleShelves, fitting_examples

CARDS = load_cards()
SEEING = seeing_card(CARDS[BASE_CARD], Path("/nonexistent/seeing"))
SECOND = second_card(CARDS[SECOND_BASE_CARD], Path("/nonexistent/second"))


def texts(cards) -> list[str]:
    return [example.text for example in fitting_examples(cards)]


def test_each_model_is_offered_what_it_can_answer():
    # The seeing model: its own questions only ("Which bar is the tallest?" got "three").
    assert texts([SEEING]) == [
        e.text for e in SEEING_EXAMPLES if e.count("video") <= SEEING.media_limits.get("video", 0)
    ]
    assert "Which bar is the tallest?" not in texts([SEEING])
    # The second, a LLaVA: no clip (it takes none), no box (it writes none), none of the kinds it
    # gets wrong more often than right (it described the three shapes as two).
    assert texts([SECOND]) == [
        "What colour is the shape?",
        "Which side of the picture is the shape on?",
        "How many shapes are there?",
        "What colour is the shape in the second picture?",
    ]
    assert "Where is the red circle?" in texts([SEEING]) and "Where is the red circle?" not in texts([SECOND])
    assert "What colour is the square?" in texts([SEEING]) and "Describe the picture." in texts([SEEING])
    # Counts of a colour: the first since run U (25 of the tests' 36 held out), not the second (26%).
    assert "How many red shapes are there?" in texts([SEEING])
    assert "How many red shapes are there?" not in texts([SECOND])
    # Pictures and a clip: every general example; pictures only: no clip; one picture: no pair.
    assert texts([CARDS["qwen2_vl"]]) == [e.text for e in GENERAL_EXAMPLES]
    assert "Describe how the ball moves." not in texts([CARDS["llava"]])
    assert "Compare these two pictures." in texts([CARDS["llava"]])
    assert texts([CARDS["paligemma2"]]) == [
        "What shapes do you see, and what colour is each?",
        "Which bar is the tallest?",
    ]
    # Several models (compare, arena): what every one of them takes.
    assert texts([CARDS["qwen2_vl"], CARDS["paligemma2"]]) == texts([CARDS["paligemma2"]])
    assert texts([SEEING, SECOND]) == texts([SECOND])
    # A catalog model beside a seeing one: the seeing model's own, as far as the other takes the files.
    assert texts([SEEING, CARDS["llava"]]) == [
        e.text for e in SEEING_EXAMPLES if not e.count("video") and not e.boxes
    ]
    assert texts([]) == []


def test_each_seeing_example_asks_its_kind_in_a_wording_training_uses():
    """An example's kind decides which seeing model is offered it: it must be what is asked, the
    wording of that kind and of no other ("What colour is the shape?" is not "What colour is the
    square?")."""
    colours, kinds = "|".join(COLOURS), "|".join(SHAPES)

    def asks(kind: str, text: str) -> bool:
        wordings = [
            re.escape(q).replace(r"\{colour\}", f"({colours})").replace(r"\{shape\}", f"({kinds})")
            for q in QUESTIONS[kind]
        ]
        return any(re.fullmatch(wording, text) for wording in wordings)

    for example in SEEING_EXAMPLES:
        assert [kind for kind in KINDS if asks(kind, example.text)] == [example.kind], example
    assert set(EXAMPLE_KINDS) == set(SEEING_MODELS)
    assert all(set(kinds) <= set(KINDS) for kinds in EXAMPLE_KINDS.values())


def test_the_shelf_shown_follows_the_models_chosen():
    with gr.Blocks():
        box = gr.MultimodalTextbox()
        choices = [[SEEING], [CARDS["qwen2_vl"]], [CARDS["llava"]], [CARDS["paligemma2"]]]
        shelves = ExampleShelves(box, choices, [SEEING], "test-examples")
    assert len(shelves.sets) == 4 and len(shelves.columns) == 4
    assert [column.visible for column in shelves.columns] == [True, False, False, False]

    def shown(cards) -> list[bool]:
        return [column.visible for column in shelves.show(cards)]

    assert shown([CARDS["llava"]]) == [False, False, True, False]
    # A combination no shelf was built for: the largest shelf of examples every model takes.
    assert shown([CARDS["llava"], CARDS["qwen2_vl"], CARDS["smolvlm"]]) == [False, False, True, False]
    assert shown([]) == [False] * 4


def test_the_arena_offers_what_two_of_its_models_take():
    """On a GPU box a model of videos alone is in the arena's pool: examples every model takes
    were none at all; a battle draws two models that take the message's files."""
    pool = [CARDS["llava-next-video"], CARDS["qwen2_vl"], CARDS["llava"]]
    assert texts(pool) == []
    two = [example.text for example in fitting_examples(pool, enough=2)]
    assert "Which bar is the tallest?" in two and "Describe how the ball moves." in two
