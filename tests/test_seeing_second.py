"""The second seeing demo model (`app.demo.seeing_llava`, a tiny LLaVA-1.5) answers sensibly and
differs measurably from the first (a tiny Qwen3-VL), asked the same held-out questions side by
side through the app's engine manager and the real vLLM engine: the two that compare and the
arena pit on a CPU box (issue 29, item 8). And the LLaVA path keeps pixels as the first's does:
no channel swap, two pictures in order (its several-picture prompt comes from the processor's
chat template), a wide picture's sides kept (it is squeezed to a square, not cropped).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image
from test_seeing import BELOW_FLOOR, FLOOR, FOREIGN, PER_KIND, answer, grounding_card
from test_seeing import decoder as decoder  # the module's video decoding pool, as in test_seeing

from app.catalog.cards import ModelCard, load_cards
from app.config import Settings
from app.demo.models import EXAMPLE_KINDS
from app.demo.seeing_check import STRANGER_WORDINGS, answers, by_wording, stranger_questions, tally
from app.demo.seeing_llava import (
    SECOND_BASE_CARD,
    SECOND_KEY,
    SECOND_KINDS,
    accuracy,
    build_second_model,
    second_card,
)
from app.demo.seeing_model import BASE_CARD, SEEING_KEY, seeing_card
from app.demo.shapes import Drawn, picture
from app.engines.manager import EngineManager
from app.media.grounding import image_boxes
from app.views.widgets import EXAMPLES, SEEING_EXAMPLES, fitting_examples

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# What it answers at the floor, as the first does: colours, sides, the background, which picture.
SENSIBLE = ("colour", "side", "background", "first", "second", "outside")
# How much more often the first is right, over the kinds both answer: "differ measurably".
MARGIN = 0.05


@pytest.fixture(scope="module")
def second() -> ModelCard:
    """The committed weights while they carry the stamp of this code, else trained again here."""
    from app.demo.models import SECOND_FOLDER, default_demo_dir

    base = load_cards()[SECOND_BASE_CARD]
    return second_card(base, build_second_model(default_demo_dir(), base, committed=SECOND_FOLDER))


@pytest.fixture(scope="module")
def manager(loop, second: ModelCard) -> Iterator[EngineManager]:
    """Both seeing models, as a CPU box serves them (the first's committed weights)."""
    from app.demo.models import SEEING_FOLDER
    from app.engines.vllm_engine import VllmEngineFactory

    first = seeing_card(load_cards()[BASE_CARD], SEEING_FOLDER)
    settings = Settings(gpu_count=0, cpu_kv_cache_bytes=64 * 2**20, idle_unload_s=0, max_resident=1)
    manager = EngineManager({SEEING_KEY: first, SECOND_KEY: second}, settings, VllmEngineFactory(settings))
    yield manager
    loop.run(manager.close())


@pytest.fixture(scope="module")
def side_by_side(loop, manager: EngineManager) -> dict[str, dict[str, float]]:
    """Each model's share right per kind, on the same held-out questions (one seed for both)."""
    scores = {key: loop.run(accuracy(manager, key, PER_KIND, seed=7)) for key in (SECOND_KEY, SEEING_KEY)}
    for key, score in scores.items():
        print(f"{key}:", {kind: f"{share:.0%}" for kind, share in score.items()})
    return scores


def test_it_answers_sensibly(side_by_side: dict[str, dict[str, float]]):
    scores = side_by_side[SECOND_KEY]
    assert set(scores) == set(SECOND_KINDS)
    assert all(scores[kind] >= FLOOR for kind in SENSIBLE), scores


def test_it_differs_measurably_from_the_first(side_by_side: dict[str, dict[str, float]]):
    """Smaller and trained less: right less often, over the kinds both answer."""
    second, first = (sum(side_by_side[key].values()) / len(SECOND_KINDS) for key in (SECOND_KEY, SEEING_KEY))
    assert first - second >= MARGIN, side_by_side


def test_it_reads_a_short_colour_question_as_about_the_shape(loop, manager, decoder):
    """Asked just "Which colour?" about the foreign set's pictures, run K's weights were wrong on
    11 of 12, 10 of them the page's colour ("white", "grey"): no training wording was that short.
    That one is a training wording now; the colour wordings training never uses must be read as
    it is."""
    colour = ("Which colour?", *STRANGER_WORDINGS["colour"])
    questions = stranger_questions(FOREIGN, {"colour": colour})
    scores = tally(questions, loop.run(answers(manager, SECOND_KEY, decoder, questions)), by_wording)
    assert len(scores) == len(colour) and all(right >= FLOOR * asked for right, asked in scores.values()), (
        scores
    )


def shape_at(colour: str, side: str, size: tuple[int, int]) -> Image.Image:
    return picture(random.Random(2), [Drawn(colour, "square", side)], size)


def test_the_llava_path_keeps_colours_order_and_sides(loop, manager, decoder, tmp_path: Path):
    red, blue = tmp_path / "red.png", tmp_path / "blue.png"
    shape_at("red", "left", (200, 150)).save(red)
    shape_at("blue", "right", (200, 150)).save(blue)

    def said(question: str, files: list[Path]) -> str:
        return answer(loop, manager, decoder, [(question, files)], SECOND_KEY)

    assert said("What colour is the shape?", [red]) == "red"
    assert said("What colour is the shape?", [blue]) == "blue"
    assert said("What colour is the shape in the second picture?", [red, blue]) == "blue"
    assert said("What colour is the shape in the second picture?", [blue, red]) == "red"
    # A picture three times as wide as it is high: a centre crop would cut off both sides.
    for side in ("left", "right"):
        wide = tmp_path / f"wide-{side}.png"
        shape_at("green", side, (600, 200)).save(wide)
        assert said("Which side of the picture is the shape on?", [wide]) == side


# The page's example files, as drawn: one_shape.png a blue triangle on the right, green_square.png
# a green square, three_shapes.png a red circle, a yellow square and a black triangle from left to
# right; colour_change.mp4 goes from yellow to red. The right answer to each example.
EXAMPLE_ANSWERS = {
    "What shape is it?": "triangle",
    "What colour is the shape?": "blue",
    "Which side of the picture is the shape on?": "right",
    "Describe the picture.": (
        "a red circle on the left, a yellow square in the middle and a black triangle on the right"
    ),
    "Where is the red circle?": "red circle",  # the label of its one box
    "What colour is the square?": "yellow",
    "How many shapes are there?": "three",
    "How many red shapes are there?": "one",
    "What colour is the shape in the second picture?": "green",
    "What colour does the clip end with?": "red",
}


def test_each_seeing_model_is_offered_only_kinds_it_gets_right_at_least_half_the_time(side_by_side):
    """Measured here on the kinds the second answers (24 each), for both; the first's other kinds
    below the floor are held by `test_seeing.BELOW_FLOOR`, which must keep each it is offered at
    half or more, boxes aside."""
    for key in (SECOND_KEY, SEEING_KEY):
        offered = [kind for kind in EXAMPLE_KINDS[key] if kind in side_by_side[key] and kind != "box"]
        assert all(side_by_side[key][kind] >= 0.5 for kind in offered), (key, side_by_side[key])
    assert set(EXAMPLE_KINDS[SECOND_KEY]) <= set(side_by_side[SECOND_KEY])
    offered_below = [kind for kind in EXAMPLE_KINDS[SEEING_KEY] if kind in BELOW_FLOOR and kind != "box"]
    assert all(BELOW_FLOOR[kind] >= 0.5 for kind in offered_below), BELOW_FLOOR


@pytest.mark.parametrize("key", [SEEING_KEY, SECOND_KEY])
def test_every_example_the_page_offers_a_seeing_model_it_answers_right(loop, manager, decoder, key: str):
    """What a visitor clicks first: each example shown with this model chosen, asked of it, on the
    page's own files (the second model, offered every picture question, described the three shapes
    as two). A box is checked by its label only: where it lands is `test_seeing`'s (few boxes are
    within a tenth: 2 of 36 held out)."""
    card = manager.cards[key]
    offered = fitting_examples([card])
    assert offered and {example.text for example in SEEING_EXAMPLES} == set(EXAMPLE_ANSWERS)
    said = {}
    for example in offered:
        files = [EXAMPLES / name for name in example.files]
        said[example.text] = answer(loop, manager, decoder, [(example.text, files)], key)
        if example.boxes:
            with Image.open(files[0]) as first:
                said[example.text] = " ".join(
                    box.label for box in image_boxes(grounding_card(), said[example.text], first.size)
                )
    assert said == {example.text: EXAMPLE_ANSWERS[example.text] for example in offered}
