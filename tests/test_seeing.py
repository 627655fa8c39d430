"""The pixels a user sends are the pixels the model sees: the seeing demo model (trained here on
shapes, `app.demo.seeing_model`) answers about files these tests write, through the app's media
pipeline (`app.domain.conversation`: the kept file, EXIF, modes, the video decoding worker), its prompt
format and engine manager, and the real vLLM engine on the CPU. A channel swap, a lost rotation,
images out of order, an earlier turn's image answered for, shuffled or repeated frames: each
gives a wrong answer here.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from operator import attrgetter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.catalog.cards import ModelCard, load_cards
from app.config import Settings
from app.demo.seeing_check import (
    FOREIGN_KINDS,
    STRANGER_PICTURES,
    STRANGER_WORDINGS,
    answers,
    answers_in_a_chat,
    by_wording,
    foreign_set,
    labelled_as_asked,
    one_colour_rows,
    readme_example,
    rows_of_three,
    stranger_questions,
    tally,
    wrong_answers,
)
from app.demo.seeing_model import (
    BASE_CARD,
    SEEING_KEY,
    accuracy,
    ask,
    build_seeing_model,
    right_answer,
    seeing_card,
)
from app.demo.shapes import BACKGROUND, COLOURS, SHAPES, Drawn, picture
from app.domain.conversation import Session, engine_messages, make_turn
from app.domain.replies import Reply
from app.engines.manager import EngineManager
from app.media.grounding import image_boxes
from app.media.loading import VideoDecoderPool
from app.views.widgets import EXAMPLES, SEEING_EXAMPLES, Example

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# Held-out questions per kind (other seeds than training's: 24 of seed 7 and 12 of seed 11), and
# the floor each kind must reach.
PER_KIND, FLOOR = 24, 0.9
# Pictures drawn by other code (OpenCV, `scripts/make_foreign_eval.py`); every other one is asked.
FOREIGN = Path(__file__).resolve().parent / "data" / "foreign-shapes"
# Issue 29 is not done: these kinds are below the floor on the held-out questions, on the foreign
# pictures and in wordings training never uses (docs/BENCHMARKS.md has the figures). Each is held to
# it in a strict xfail test of its own, which fails as soon as that kind reaches it, so that these
# sets shrink to nothing. Meanwhile each may not fall below the share given here, which lets the
# committed weights (run H1, 2026-12-06: run AB2's recipe and lessons two and three, lesson four
# also teaching heads 1 of layers 2 and 3 to look at each shape a description names; the answers
# do not change from run to run) miss one question more than they do, so that a training that trades
# one kind for another says so. Held out (36 each: 24 of seed 7 and 12 of seed 11, the same
# questions as run AB2's): counts of a colour 29 (run AB2 32), the bigger shape 31 (30),
# descriptions 32 (31), boxes 18 (20), the colour of a shape named by its kind 32 (at the floor),
# the kind of one named by its colour 32 (30) and a clip's last colour 32 (at the floor); places
# reached the floor (33, run AB2 32). On the foreign pictures asked (every other one): the bigger
# shape 10/12 (run AB2 11/12, at the floor), descriptions 10/13 (10), boxes 8/12 (6); counts
# reached the floor (23/25, run AB2 21).
BELOW_FLOOR = {
    "colour count": 0.77,
    "bigger": 0.83,
    "describe": 0.86,
    "box": 0.47,
    "colour of": 0.86,
    "shape of": 0.86,
    "end": 0.86,
}
BELOW_FLOOR_FOREIGN = {"bigger": 0.75, "describe": 0.69, "box": 0.58}
# Run H1's weights: counts 18/24 ("How many shapes are shown?" 8/12; run AB2 16/24), the bigger shape
# 9/12 (run AB2 12/12), descriptions 14/24 (13); kinds of shape reached the floor (22/24, "What shape
# is shown?" 10/12; run AB2 20/24).
STRANGER_BELOW_FLOOR = {"count": 0.70, "bigger": 0.66, "describe": 0.54}
# Tidy rows of three shapes, the page's own kind of picture (`seeing_check.rows_of_three`), the first
# 20: run H1 counts 20 and describes 18 right (run AB2 10, run OV 14; of the 40 the evaluation
# asks, 39 and 37). Before lesson four taught heads to look at each shape a description names, the
# wrong descriptions mostly gave the middle shape a neighbour's colour or kind.
ROWS_ASKED = 20
# The same rows with their three shapes in one colour (`seeing_check.one_colour_rows`, the first 20):
# run H1 counts all 20 and describes 16 (run AB2 11); run FU3, on a tower not taught each shape's
# place from the left, counted 15 and described none, each time leaving the middle shape out
# (docs/SEEING_MODEL_RUNS.md, runs OR and OV). The descriptions are held to the floor by a strict
# xfail test, and may not fall more than a question.
ONE_COLOUR_ROWS_BELOW_FLOOR = {"describe": 0.75}
# A visitor asks more than one question about a picture. Asked as the third question of a chat
# about its picture (`seeing_check.answer_in_a_chat`: the background's colour and how many shapes
# there are, or a description, asked first and answered by the model, the answers kept in the chat),
# run Z's weights, taught one question a conversation, lost most kinds (counts 4 of 25, sides 14 of
# 25, descriptions none). Run H1, taught follow-up questions, answers most as it does first: of
# every other foreign picture's questions, counts 21/25 (asked first 23; run AB2 22), the bigger
# shape 10/12 (10; run AB2 12/12), descriptions 11/13 (10; run AB2 11), boxes 6/12 (8; run AB2 6),
# counts of a colour (12/13; run AB2 11/13) and every other kind at the floor (docs/BENCHMARKS.md,
# "A visitor's third question"). Each kind here keeps what it reached, less a question, and is held
# to the floor by a strict xfail test.
CHAT_BELOW_FLOOR = {
    "count": 0.80,
    "bigger": 0.75,
    "describe": 0.76,
    "box": 0.41,
}


COMMITTED = "committed"  # the weights in the repository, which the app serves, when trained again


@pytest.fixture(scope="module")
def seeing() -> ModelCard:
    """The model this code trains: the committed weights while they carry the stamp of this
    training code and data generator (`static/seeing-model/seeing.json`), else trained again
    here (cached between runs on one machine), so a change to the training is tested."""
    from app.demo.models import SEEING_FOLDER, default_demo_dir

    base = load_cards()[BASE_CARD]
    return seeing_card(base, build_seeing_model(default_demo_dir(), base, committed=SEEING_FOLDER))


@pytest.fixture(scope="module")
def committed(seeing: ModelCard) -> str:
    """The key of the committed weights, which the app serves: the trained model's own while they
    are the same (one engine, not one built again at each change of key), else `COMMITTED`."""
    from app.demo.models import SEEING_FOLDER

    same = Path(seeing.reference_engine_args["model"]).resolve() == SEEING_FOLDER.resolve()
    return SEEING_KEY if same else COMMITTED


@pytest.fixture(scope="module")
def manager(loop, seeing: ModelCard, committed: str) -> Iterator[EngineManager]:
    from app.demo.models import SEEING_FOLDER
    from app.engines.vllm_engine import VllmEngineFactory

    cards = {SEEING_KEY: seeing}
    if committed != SEEING_KEY:
        cards[COMMITTED] = seeing_card(load_cards()[BASE_CARD], SEEING_FOLDER).model_copy(
            update={"key": COMMITTED}
        )
    settings = Settings(gpu_count=0, cpu_kv_cache_bytes=64 * 2**20, idle_unload_s=0, max_resident=1)
    manager = EngineManager(cards, settings, VllmEngineFactory(settings))
    yield manager
    loop.run(manager.close())


@pytest.fixture(scope="module")
def decoder() -> Iterator[VideoDecoderPool]:
    pool = VideoDecoderPool(workers=1)
    yield pool
    pool.close()


def answer(
    loop,
    manager: EngineManager,
    decoder: VideoDecoderPool,
    turns: list[tuple[str, list[Path]]],
    key: str = SEEING_KEY,
) -> str:
    """Model `key`'s answer to the last of `turns` (text, files), each file kept and loaded by
    the app's pipeline; earlier turns are answered first, as in a chat."""

    async def chat() -> str:
        session, kept = Session(), []
        try:
            for text, files in turns:
                turn, clip = await make_turn(session, text, [str(f) for f in files], decoder, 8)
                kept.append(turn)
                messages = await engine_messages(kept, None, decoder, 8, {turn.video: clip} if clip else None)
                said = await ask(manager, key, messages)
                turn.reply = Reply(key, "seeing", "", answer=said)
            return kept[-1].answer
        finally:
            session.close()

    return loop.run(chat())


def grounding_card() -> ModelCard:
    """The seeing model's card, for the chat's grounding code to read its boxes with."""
    return seeing_card(load_cards()[BASE_CARD], Path("unused"))


def one_shape(colour: str, shape: str, side: str, size: tuple[int, int] = (200, 150)) -> Image.Image:
    """The tidy drawing (a known background, the reference colours): these tests are about the
    pipeline keeping pixels, so they send pictures whose every pixel is known."""
    return picture(random.Random(1), [Drawn(colour, shape, side)], size)


# The held-out samples: (questions per kind, seed).
SAMPLES = [(PER_KIND, 7), (PER_KIND // 2, 11)]


@pytest.fixture(scope="module")
def held_out_samples(loop, manager: EngineManager) -> list[dict[str, float]]:
    """The share right per kind of the model this code trains, on each of `SAMPLES`."""
    return [loop.run(accuracy(manager, SEEING_KEY, count, seed=seed)) for count, seed in SAMPLES]


@pytest.fixture(scope="module")
def held_out(held_out_samples: list[dict[str, float]]) -> dict[str, float]:
    """The share right per kind of the model this code trains, on 24 questions of seed 7 and 12 of
    seed 11: one seed's 24 can put a kind over the floor that another's 12 leave under it (run S's
    counts: 22/24 and 8/12)."""
    total = sum(count for count, _ in SAMPLES)
    pooled = {
        kind: sum(score[kind] * count for score, (count, _) in zip(held_out_samples, SAMPLES, strict=True))
        / total
        for kind in held_out_samples[0]
    }
    for (count, seed), score in zip(SAMPLES, held_out_samples, strict=True):
        print(f"held-out accuracy ({count}, seed {seed}):", {k: f"{v:.0%}" for k, v in score.items()})
    return pooled


def test_held_out_accuracy_is_above_the_floor_for_every_question_kind(held_out: dict[str, float]):
    assert all(score >= FLOOR for kind, score in held_out.items() if kind not in BELOW_FLOOR), held_out


@pytest.mark.xfail(strict=True, reason="issue 29: not yet at the floor (docs/BENCHMARKS.md)")
@pytest.mark.parametrize("kind", sorted(BELOW_FLOOR))
def test_held_out_accuracy_of_a_kind_below_the_floor_reaches_it(held_out: dict[str, float], kind: str):
    assert held_out[kind] >= FLOOR, held_out


def test_held_out_accuracy_of_the_kinds_below_the_floor_keeps_what_they_reached(held_out: dict[str, float]):
    assert all(held_out[kind] >= lowest for kind, lowest in BELOW_FLOOR.items()), held_out


def test_the_committed_weights_the_app_serves_see_too(
    loop, manager: EngineManager, committed: str, held_out_samples
):
    """Asked as the trained model's second sample is: the same answers while they are the same weights."""
    count, seed = SAMPLES[1]
    if committed == SEEING_KEY:
        scores = held_out_samples[1]
    else:
        scores = loop.run(accuracy(manager, committed, count, seed=seed))
    print("committed weights:", {kind: f"{score:.0%}" for kind, score in scores.items()})
    assert all(score >= FLOOR for kind, score in scores.items() if kind not in BELOW_FLOOR), scores


@pytest.fixture(scope="module")
def foreign(
    loop, manager: EngineManager, decoder: VideoDecoderPool, committed: str
) -> tuple[dict[str, tuple[int, int]], list[str], tuple[int, int]]:
    """The committed weights asked every other picture of the foreign set and the README's
    example, each file sent as a user's: (right, asked) per kind, the wrong answers, and (right,
    asked) of the boxes labelled with the shape asked about."""
    questions = foreign_set(FOREIGN)[::2] + readme_example()
    said = loop.run(answers(manager, committed, decoder, questions))
    scores, labelled = tally(questions, said), labelled_as_asked(questions, said)
    print("foreign set:", {kind: f"{right}/{asked}" for kind, (right, asked) in scores.items()})
    print("boxes labelled as asked: {}/{}".format(*labelled))
    return scores, wrong_answers(questions, said), labelled


def at_the_floor(scores: dict[str, tuple[int, int]], but: dict[str, float]) -> bool:
    """Whether every kind's (right, asked) but those of `but` is at `FLOOR`."""
    return all(right >= FLOOR * asked for kind, (right, asked) in scores.items() if kind not in but)


def test_the_committed_weights_see_pictures_drawn_by_another_hand(foreign):
    """Issue 29: right on its own generator's pictures, wrong on other people's."""
    scores, wrong, _ = foreign
    assert set(scores) == FOREIGN_KINDS | {"readme"}
    assert at_the_floor(scores, but=BELOW_FLOOR_FOREIGN), wrong


@pytest.mark.xfail(strict=True, reason="issue 29: not yet at the floor (docs/BENCHMARKS.md)")
@pytest.mark.parametrize("kind", sorted(BELOW_FLOOR_FOREIGN))
def test_a_kind_below_the_floor_reaches_it_on_pictures_drawn_by_another_hand(foreign, kind: str):
    scores, wrong, _ = foreign
    right, asked = scores[kind]
    assert right >= FLOOR * asked, wrong


def test_the_kinds_below_the_floor_keep_what_they_reached_on_pictures_drawn_by_another_hand(foreign):
    scores, wrong, _ = foreign
    assert all(scores[kind][0] >= lowest * scores[kind][1] for kind, lowest in BELOW_FLOOR_FOREIGN.items()), (
        wrong
    )


@pytest.fixture(scope="module")
def in_a_chat(
    loop, manager: EngineManager, decoder: VideoDecoderPool, committed: str
) -> tuple[dict, list[str]]:
    """The committed weights asked the foreign questions of `foreign` (and the README's example) each
    as a visitor's third question in a chat about its picture: (right, asked) per kind, and the
    wrong answers."""
    questions = foreign_set(FOREIGN)[::2] + readme_example()
    said = loop.run(answers_in_a_chat(manager, committed, decoder, questions))
    scores = tally(questions, said)
    print(
        "foreign set, asked third in a chat:",
        {kind: f"{right}/{asked}" for kind, (right, asked) in scores.items()},
    )
    return scores, wrong_answers(questions, said)


def test_a_visitors_third_question_about_a_picture_is_answered_as_the_first(in_a_chat):
    """Issue 29: a visitor asks several questions about one picture in a chat; each is answered from
    the picture, not from the questions and answers before it."""
    scores, wrong = in_a_chat
    assert set(scores) == FOREIGN_KINDS | {"readme"}
    assert at_the_floor(scores, but=CHAT_BELOW_FLOOR), wrong


@pytest.mark.xfail(strict=True, reason="issue 29: not yet at the floor asked third (docs/BENCHMARKS.md)")
@pytest.mark.parametrize("kind", sorted(CHAT_BELOW_FLOOR))
def test_a_kind_below_the_floor_reaches_it_asked_third_in_a_chat(in_a_chat, kind: str):
    scores, wrong = in_a_chat
    right, asked = scores[kind]
    assert right >= FLOOR * asked, wrong


def test_the_kinds_below_the_floor_keep_what_they_reached_asked_third_in_a_chat(in_a_chat):
    scores, wrong = in_a_chat
    assert all(scores[kind][0] >= lowest * scores[kind][1] for kind, lowest in CHAT_BELOW_FLOOR.items()), (
        wrong
    )


def test_its_boxes_are_labelled_with_the_shape_asked_about(foreign):
    """Wherever it puts a box, it names the shape asked about: the label is the question's words."""
    _, _, (right, asked) = foreign
    assert asked > 0 and right >= FLOOR * asked, (right, asked)


@pytest.mark.parametrize("example", [e for e in SEEING_EXAMPLES if e.boxes], ids=attrgetter("text"))
def test_the_pages_box_examples_get_a_box_labelled_as_asked(loop, manager, decoder, example: Example):
    """The page's own examples that ask for a box (chosen for this model) are answered with one
    box the chat can draw, named as asked: run N's weights called the red circle a red triangle."""
    asked = re.search(rf"({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})", example.text)
    assert asked is not None, example.text
    files = [EXAMPLES / name for name in example.files]
    said = answer(loop, manager, decoder, [(example.text, files)])
    with Image.open(files[0]) as first:
        boxes = image_boxes(grounding_card(), said, first.size)
    assert [box.label for box in boxes] == [asked[0]], said


def test_it_answers_about_one_shape_named_among_several(loop, manager, decoder):
    """The page's picture of a red circle, a yellow square and a black triangle, asked about one of
    them by its kind or its colour, as a visitor would ("What colour is the square?"): run L's
    weights answered a box, a description or a count; lesson three taught it (run S)."""
    asked = {
        "What colour is the square?": "yellow",
        "What colour is the circle?": "red",
        "What shape is the black one?": "triangle",
        "Which shape is yellow?": "square",
    }
    said = {q: answer(loop, manager, decoder, [(q, [EXAMPLES / "three_shapes.png"])]) for q in asked}
    assert said == asked


@pytest.fixture(scope="module")
def rows(
    loop, manager: EngineManager, decoder: VideoDecoderPool, committed: str, tmp_path_factory
) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """The committed weights asked about tidy rows of three shapes, as the page's example picture,
    of any colours and of one colour: (right, asked) per kind ("row count", "row describe",
    "one-colour row count", "one-colour row describe"), and the wrong answers."""
    folder = tmp_path_factory.mktemp("rows")
    questions = rows_of_three(folder, ROWS_ASKED) + one_colour_rows(folder, ROWS_ASKED)
    said = loop.run(answers(manager, committed, decoder, questions))
    scores = tally(questions, said)
    print("tidy rows of three:", {kind: f"{right}/{asked}" for kind, (right, asked) in scores.items()})
    return scores, wrong_answers(questions, said)


def test_it_counts_three_in_tidy_rows_of_three_as_the_pages_example(rows):
    """Runs ZQ and ZF counted the page's three-shape picture as two after a lesson: these rows say
    whether a weights' count of that picture is luck or holds for its kind."""
    scores, wrong = rows
    right, asked = scores["row count"]
    assert asked == ROWS_ASKED and right >= FLOOR * asked, wrong


@pytest.mark.xfail(strict=True, reason="issue 29: not yet at the floor (docs/BENCHMARKS.md)")
@pytest.mark.parametrize("kind", sorted(ONE_COLOUR_ROWS_BELOW_FLOOR))
def test_a_kind_of_tidy_row_of_one_colour_below_the_floor_reaches_it(rows, kind: str):
    scores, wrong = rows
    right, asked = scores[f"one-colour row {kind}"]
    assert right >= FLOOR * asked, wrong


def test_it_describes_tidy_rows_of_three_as_the_pages_example(rows):
    """The page offers "Describe the picture." about such a row. Run AB2 gave the middle shape a
    neighbour's colour or kind in half of them; run H1's lesson four teaches heads to look at each
    shape a description names."""
    scores, wrong = rows
    right, asked = scores["row describe"]
    assert asked == ROWS_ASKED and right >= FLOOR * asked, wrong


def test_it_counts_three_shapes_of_one_colour_in_a_tidy_row(rows):
    """Three red shapes in a row are three shapes. Towers not taught each shape's place from the
    left read such neighbours as one thing, and their models counted the row "two" one time in four
    (run FU3) or nearly always (runs RC and RC2)."""
    scores, wrong = rows
    right, asked = scores["one-colour row count"]
    assert asked == ROWS_ASKED and right >= FLOOR * asked, wrong


def test_its_descriptions_of_tidy_rows_of_one_colour_keep_what_they_reached(rows):
    scores, wrong = rows
    right, asked = scores["one-colour row describe"]
    assert asked == ROWS_ASKED and right >= ONE_COLOUR_ROWS_BELOW_FLOOR["describe"] * asked, wrong


@pytest.fixture(scope="module")
def strangers(
    loop, manager: EngineManager, decoder: VideoDecoderPool, committed: str
) -> dict[str, tuple[int, int]]:
    """The committed weights asked the wordings training never uses: (right, asked) per kind."""
    questions = stranger_questions(FOREIGN)
    said = loop.run(answers(manager, committed, decoder, questions))
    print(
        "stranger wordings:",
        {wording: f"{r}/{n}" for wording, (r, n) in tally(questions, said, by_wording).items()},
    )
    return tally(questions, said)


def test_the_committed_weights_understand_wordings_training_never_uses(strangers):
    """A stranger types their own words: what is asked, not the training's sentences, decides
    the answer ("Which colour?" got the page's colour from the second model, run K)."""
    assert strangers.keys() == STRANGER_WORDINGS.keys()
    assert all(
        strangers[kind][1] == len(texts) * STRANGER_PICTURES for kind, texts in STRANGER_WORDINGS.items()
    )
    assert all(
        right >= FLOOR * asked
        for kind, (right, asked) in strangers.items()
        if kind not in STRANGER_BELOW_FLOOR
    ), strangers


@pytest.mark.xfail(strict=True, reason="issue 29: not yet at the floor (docs/BENCHMARKS.md)")
@pytest.mark.parametrize("kind", sorted(STRANGER_BELOW_FLOOR))
def test_a_kind_below_the_floor_reaches_it_in_wordings_training_never_uses(strangers, kind: str):
    right, asked = strangers[kind]
    assert right >= FLOOR * asked, strangers


def test_the_kinds_below_the_floor_keep_what_they_reached_in_wordings_training_never_uses(strangers):
    assert all(
        strangers[kind][0] >= lowest * strangers[kind][1] for kind, lowest in STRANGER_BELOW_FLOOR.items()
    ), strangers


def readme_table() -> list[tuple[str, str, str, str]]:
    """The README's table of foreign pictures and the demo model's answers: (file, question,
    answer, verdict) per row, the verdict "right" or "wrong: ..."."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    header = "| picture | question | its answer | |"
    assert header in readme, f"the README has no table headed {header!r}"
    lines = readme.split(header, 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]
    rows = [[cell.strip().strip("`") for cell in line.strip().strip("|").split(" | ")] for line in lines]
    assert all(len(row) == 4 for row in rows), f"README table rows of other than 4 cells: {lines}"
    return [(file, question, said, verdict) for file, question, said, verdict in rows]


def same_answer(kind: str, printed: str, said: str) -> bool:
    """The printed answer is the model's: the very words, or for a box the same label and every
    side within a hundredth of the picture (a CPU's rounding may move a digit)."""
    if kind != "box" or printed == said:
        return printed == said
    try:
        ((shown,), (given,)) = json.loads(printed), json.loads(said)
        close = all(abs(a - b) <= 10 for a, b in zip(shown["bbox_2d"], given["bbox_2d"], strict=True))
        return shown["label"] == given["label"] and close
    except (ValueError, TypeError, KeyError):  # not a box in its syntax: not the same answer
        return False


def test_the_readme_shows_what_the_committed_weights_answer(
    loop, manager: EngineManager, decoder, committed: str
):
    """The README's answers are the model's, right or wrong as it says: trained again, the
    model answers otherwise, and the table's rows are written again from what this prints."""
    known = {question.files[0].name: question for question in foreign_set(FOREIGN)}
    rows = readme_table()
    assert {file for file, *_ in rows} <= set(known), "the README's table names a picture not in the set"
    assert len(rows) >= 6 and {known[file].kind for file, *_ in rows} >= {"colour", "shape", "count", "box"}
    shown, answered = [], []
    for file, question, printed, verdict in rows:
        asked = known[file]
        assert question == asked.text, f"{file}: the set asks {asked.text!r}"
        said = loop.run(answers(manager, committed, decoder, [asked]))[0]
        right = right_answer(asked.kind, asked.answer, said)
        shown_as = f"`{said}`" if said.startswith("[") else said
        print(f"| `{file}` | {question} | {shown_as} | {'right' if right else f'wrong: {asked.answer}'} |")
        shown.append((file, True, verdict.startswith("right")))
        answered.append((file, same_answer(asked.kind, printed, said), right))
    assert answered == shown


def pointed(loop, manager, decoder, tmp_path: Path) -> tuple[str, list, tuple[int, ...]]:
    """Its answer to "Where is the blue square?" about a tidy picture of two shapes, the boxes the
    chat's grounding code reads from it (in the picture's pixels), and the square's true box."""
    path = tmp_path / "two.png"
    drawn = picture(random.Random(1), [Drawn("red", "circle"), Drawn("blue", "square")], (300, 150))
    drawn.save(path)
    said = answer(loop, manager, decoder, [("Where is the blue square?", [path])])
    ys, xs = np.nonzero((np.asarray(drawn) == COLOURS["blue"]).all(-1))
    return said, image_boxes(grounding_card(), said, drawn.size), (xs.min(), ys.min(), xs.max(), ys.max())


def test_it_points_with_a_box_the_chat_can_draw(loop, manager, decoder, tmp_path: Path):
    """Asked where a shape is, it answers in its card's grounding syntax (Qwen3-VL's JSON), which
    the chat reads into one box on the picture, labelled with the shape it was asked about."""
    said, boxes, _ = pointed(loop, manager, decoder, tmp_path)
    assert len(boxes) == 1 and boxes[0].label == "blue square", said


@pytest.mark.xfail(strict=True, reason="issue 29: boxes not yet at the floor (docs/BENCHMARKS.md)")
def test_its_box_is_over_the_shape(loop, manager, decoder, tmp_path: Path):
    """Within a tenth of the picture's side of the shape's pixels. Run L's box for the blue square
    was within a tenth (its box for the red circle beside it was not: [160, 100, 800, 800]); run S's
    spanned both shapes ([120, 100, 880, 880]); run T's was within a tenth ([500, 100, 900, 880]);
    run U's spans both again ([100, 100, 860, 860]); run Z's is on the square's side of the
    picture, not within a tenth ([500, 80, 900, 580]); run FU3's and run OV's are within a tenth;
    run AB2's is not ([400, 100, 900, 880]), nor run H1's ([420, 100, 880, 880]). One tidy picture:
    held out, boxes within a tenth are 18 of 36 (docs/BENCHMARKS.md), among several shapes fewer;
    strict, so that it fails when the box comes within a tenth again."""
    said, boxes, truth = pointed(loop, manager, decoder, tmp_path)
    box = boxes[0].ordered()
    found = (box.x1, box.y1, box.x2, box.y2)
    assert all(
        abs(a - b) <= 0.1 * side for a, b, side in zip(found, truth, (300, 150, 300, 150), strict=True)
    ), said


def test_colours_are_not_swapped(loop, manager, decoder, tmp_path: Path):
    """Red and blue swap places if a channel order is wrong anywhere (BGR from OpenCV)."""
    for colour in ("red", "blue"):
        path = tmp_path / f"{colour}.png"
        one_shape(colour, "circle", "left").save(path)
        assert answer(loop, manager, decoder, [("What colour is the shape?", [path])]) == colour


def test_an_exif_rotation_is_applied(loop, manager, decoder, tmp_path: Path):
    """Stored upside down with EXIF orientation 3: seen as taken, the shape is on the left."""
    upright = one_shape("green", "square", "left")
    stored = upright.rotate(180)
    exif = Image.Exif()
    exif[0x0112] = 3
    path = tmp_path / "photo.jpg"
    stored.save(path, quality=95, exif=exif)
    assert answer(loop, manager, decoder, [("Which side of the picture is the shape on?", [path])]) == "left"


@pytest.mark.parametrize("mode", ["RGBA", "P", "I;16"])
def test_png_modes_reach_the_model_as_drawn(loop, manager, decoder, tmp_path: Path, mode: str):
    """Transparency (on white), a palette, and 16-bit grey."""
    drawn = one_shape("black", "triangle", "right")
    if mode == "RGBA":
        pixels = np.asarray(drawn.convert("RGBA")).copy()
        background = (pixels[..., :3] == BACKGROUND).all(axis=-1)
        pixels[background] = (0, 0, 0, 0)  # transparent black: it must not come out black
        image = Image.fromarray(pixels, "RGBA")
    elif mode == "P":
        image = drawn.convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    else:
        grey = np.asarray(drawn.convert("L"), dtype=np.uint16) * 257
        image = Image.fromarray(grey.astype(np.uint16), "I;16")
    path = tmp_path / f"{mode.replace(';', '')}.png"
    image.save(path)
    assert Image.open(path).mode == mode
    assert answer(loop, manager, decoder, [("Which side of the picture is the shape on?", [path])]) == "right"
    assert answer(loop, manager, decoder, [("What shape is it?", [path])]) == "triangle"


def test_two_images_in_one_turn_keep_their_order(loop, manager, decoder, tmp_path: Path):
    first, second = tmp_path / "first.png", tmp_path / "second.png"
    one_shape("yellow", "circle", "left").save(first)
    one_shape("blue", "square", "right").save(second)
    files = [first, second]
    assert (
        answer(loop, manager, decoder, [("What colour is the shape in the first picture?", files)])
        == "yellow"
    )
    assert (
        answer(loop, manager, decoder, [("What colour is the shape in the second picture?", files)]) == "blue"
    )
    reversed_files = [second, first]
    assert (
        answer(loop, manager, decoder, [("What colour is the shape in the first picture?", reversed_files)])
        == "blue"
    )


def test_the_answer_is_about_the_latest_turns_image(loop, manager, decoder, tmp_path: Path):
    """An earlier turn's image stays in the conversation; the new question is about the new one."""
    earlier, latest = tmp_path / "earlier.png", tmp_path / "latest.png"
    one_shape("red", "circle", "left").save(earlier)
    one_shape("green", "triangle", "right").save(latest)
    turns = [("What colour is the shape?", [earlier]), ("What colour is the shape?", [latest])]
    assert answer(loop, manager, decoder, turns) == "green"
    assert answer(loop, manager, decoder, turns[:1]) == "red"


def test_a_follow_up_without_a_picture_is_about_the_earlier_turns_picture(
    loop, manager, decoder, tmp_path: Path
):
    """The second turn sends no file: the first turn's picture must still reach the model."""
    path = tmp_path / "earlier.png"
    one_shape("yellow", "triangle", "right").save(path)
    first = ("What colour is the shape?", [path])
    assert answer(loop, manager, decoder, [first, ("What shape is it?", [])]) == "triangle"
    assert answer(loop, manager, decoder, [first, ("Is the shape on the left or the right?", [])]) == "right"


def write_clip(path: Path, colours: list[str], frames_each: int = 12) -> None:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        for colour in colours:
            frame = np.asarray(one_shape(colour, "square", "left", (160, 120)))
            for _ in range(frames_each):
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_a_clip_is_seen_in_order_from_start_to_end(loop, manager, decoder, tmp_path: Path):
    """Through the decoding worker: frames shuffled, reversed or all the same give wrong answers."""
    path = tmp_path / "clip.mp4"
    write_clip(path, ["red", "blue"])
    assert answer(loop, manager, decoder, [("What colour does the clip start with?", [path])]) == "red"
    assert answer(loop, manager, decoder, [("What colour does the clip end with?", [path])]) == "blue"
