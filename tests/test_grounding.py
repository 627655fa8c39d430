"""Grounding boxes: each family's answer format parsed (whole, malformed, and cut off mid-stream),
mapped from the model's frame to the picture, and drawn where the picture's objects are. The
answers are written from each family's documentation; the pictures are made here with their
objects at known places."""

from __future__ import annotations

import itertools
from pathlib import Path

import gradio as gr
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from app.catalog.cards import load_cards
from app.domain.conversation import Session, Turn
from app.domain.replies import Reply
from app.media.grounding import (
    PARSERS,
    Box,
    draw_answer_boxes,
    image_boxes,
    parse_boxes,
    smart_resize,
)
from app.views.chat import conversation

CARDS = load_cards()


# --- parsing each family's format ------------------------------------------------------------

DOCUMENTED = {
    "qwen_json": (
        'Here are the objects:\n```json\n[\n\t{"bbox_2d": [135, 114, 1016, 672], "label": "cat"},\n'
        '\t{"bbox_2d": [10, 20, 30, 40], "label": "remote control"}\n]\n```',
        [Box(135, 114, 1016, 672, "cat"), Box(10, 20, 30, 40, "remote control")],
    ),
    "qwen2_tokens": (
        "<|object_ref_start|>the dog<|object_ref_end|><|box_start|>(120,340),(560,780)<|box_end|> and "
        "<|object_ref_start|>a ball<|object_ref_end|><|box_start|>(600,700),(650,760)<|box_end|>",
        [Box(120, 340, 560, 780, "the dog"), Box(600, 700, 650, 760, "a ball")],
    ),
    "loc_tokens": (
        "<loc0256><loc0128><loc0768><loc0512> cat ; <loc0000><loc0600><loc1023><loc1000> dog",
        [Box(128, 256, 512, 768, "cat"), Box(600, 0, 1000, 1023, "dog")],
    ),
    "ref_box": (
        "<ref>the red car</ref><box>[[100, 200, 400, 600], [500, 210, 700, 580]]</box>",
        [Box(100, 200, 400, 600, "the red car"), Box(500, 210, 700, 580, "the red car")],
    ),
    "glm_box": (
        "The cup is at <|begin_of_box|>[412, 230, 588, 471]<|end_of_box|>.",
        [Box(412, 230, 588, 471, "")],
    ),
    "ref_det": (
        "<|ref|>giraffe<|/ref|><|det|>[[12, 40, 480, 990]]<|/det|>",
        [Box(12, 40, 480, 990, "giraffe")],
    ),
}


@pytest.mark.parametrize("syntax", sorted(DOCUMENTED))
def test_each_documented_format_gives_its_boxes_and_labels(syntax: str):
    answer, boxes = DOCUMENTED[syntax]
    assert parse_boxes(answer, syntax) == boxes


# vLLM drops special tokens from the text it returns: the coordinates they wrap must still count.
STRIPPED = {
    "qwen2_tokens": ("the dog(120,340),(560,780)", [Box(120, 340, 560, 780, "")]),
    "ref_box": ("the red car[[100, 200, 400, 600]]", [Box(100, 200, 400, 600, "")]),
    "glm_box": ("The cup is at [412, 230, 588, 471].", [Box(412, 230, 588, 471, "")]),
    "ref_det": ("giraffe[[12, 40, 480, 990]]", [Box(12, 40, 480, 990, "")]),
}


@pytest.mark.parametrize("syntax", sorted(STRIPPED))
def test_boxes_survive_special_tokens_left_out_of_the_text(syntax: str):
    answer, boxes = STRIPPED[syntax]
    assert parse_boxes(answer, syntax) == boxes


@pytest.mark.parametrize(
    ("syntax", "answer", "count"),
    [
        # Single quotes and a trailing comma: near-JSON that models write.
        ("qwen_json", "[{'bbox_2d': [1, 2, 3, 4], 'label': 'a',}]", 1),
        # Corners written bottom-right first come back ordered.
        ("qwen_json", '[{"bbox_2d": [30, 40, 10, 20], "label": "b"}]', 1),
        ("qwen_json", '[{"bbox_2d": [1, 2, 3], "label": "three numbers"}]', 0),
        ("qwen_json", '[{"point_2d": [1, 2], "label": "a point, no box"}]', 0),
        ("qwen_json", "There is no cat in this picture.", 0),
        ("loc_tokens", "<loc0100><loc0200><loc0300> only three", 0),
        ("ref_box", "<ref>x</ref><box>[[1, 2, 3]]</box>", 0),
        ("qwen2_tokens", "(1,2),(3)", 0),
    ],
)
def test_malformed_boxes_are_read_where_whole_and_skipped_where_not(syntax: str, answer: str, count: int):
    boxes = parse_boxes(answer, syntax)
    assert len(boxes) == count
    for box in boxes:
        assert box.x1 <= box.x2 and box.y1 <= box.y2


@pytest.mark.parametrize("syntax", sorted(DOCUMENTED))
def test_an_answer_still_streaming_gives_only_the_boxes_it_has_finished(syntax: str):
    answer, boxes = DOCUMENTED[syntax]
    seen: list[list[Box]] = []
    for end in range(len(answer) + 1):
        partial = parse_boxes(answer[:end], syntax)
        # Never coordinates that the whole answer does not have (no half-read number), boxes in
        # the final order, and a label still being written is the start of its final label.
        assert len(partial) <= len(boxes), answer[:end]
        for got, final in zip(partial, boxes, strict=False):
            assert (got.x1, got.y1, got.x2, got.y2) == (final.x1, final.y1, final.x2, final.y2), answer[:end]
            assert final.label.startswith(got.label), answer[:end]
        seen.append(partial)
    assert seen[-1] == boxes
    assert all(len(a) <= len(b) for a, b in itertools.pairwise(seen))


def write(syntax: str, box: Box) -> str:
    """`box` (in its frame, whole numbers) as a model of that family writes it."""
    x1, y1, x2, y2 = (round(v) for v in (box.x1, box.y1, box.x2, box.y2))
    return {
        "qwen_json": f'```json\n[{{"bbox_2d": [{x1}, {y1}, {x2}, {y2}], "label": "{box.label}"}}]\n```',
        "qwen2_tokens": (
            f"<|object_ref_start|>{box.label}<|object_ref_end|>"
            f"<|box_start|>({x1},{y1}),({x2},{y2})<|box_end|>"
        ),
        "loc_tokens": f"<loc{y1:04d}><loc{x1:04d}><loc{y2:04d}><loc{x2:04d}> {box.label}",
        "ref_box": f"<ref>{box.label}</ref><box>[[{x1}, {y1}, {x2}, {y2}]]</box>",
        "glm_box": f"<|begin_of_box|>[{x1}, {y1}, {x2}, {y2}]<|end_of_box|>",
        "ref_det": f"<|ref|>{box.label}<|/ref|><|det|>[[{x1}, {y1}, {x2}, {y2}]]<|/det|>",
    }[syntax]


@given(
    syntax=st.sampled_from(sorted(PARSERS)),
    corners=st.lists(st.integers(0, 999), min_size=4, max_size=4),
    label=st.from_regex(r"[a-z][a-z ]{0,15}[a-z]", fullmatch=True),
    prose=st.sampled_from(["", "Found it: ", "Sure.\n\n"]),
)
def test_any_box_written_in_any_format_is_read_back(syntax, corners, label, prose):
    x1, y1, x2, y2 = corners
    box = Box(x1, y1, x2, y2, label)
    (read,) = parse_boxes(prose + write(syntax, box), syntax)
    assert (read.x1, read.y1, read.x2, read.y2) == (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))
    if syntax != "glm_box":  # GLM writes no label
        assert read.label == " ".join(label.split())  # runs of spaces shown as one


def test_every_grounding_card_names_a_parser_and_a_frame_that_fits_it():
    grounding = {key: card.grounding for key, card in CARDS.items() if card.grounding is not None}
    # The families whose documentation gives a box syntax.
    assert {
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "paligemma",
        "internvl_chat",
        "glm4_5v",
        "deepseek_vl_v2",
    } <= set(grounding)
    for spec in grounding.values():
        assert spec.syntax in PARSERS
        assert (spec.frame == "loc_bins") == (spec.syntax == "loc_tokens")


def test_qwen_resize_matches_transformers():
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as reference

    for width, height in [(640, 480), (500, 300), (4000, 3000), (20, 900), (1023, 767), (56, 56)]:
        for min_pixels, max_pixels in [(784, 1003520), (3136, 12845056)]:
            mine = smart_resize(width, height, 28, min_pixels, max_pixels)
            theirs = reference(height, width, factor=28, min_pixels=min_pixels, max_pixels=max_pixels)
            assert mine == (theirs[1], theirs[0])


# --- drawn where the objects are ---------------------------------------------------------------

OBJECT = (120, 60, 300, 180)  # a green rectangle's corners in the picture's pixels


def picture(tmp_path: Path, size: tuple[int, int] = (640, 360)) -> Path:
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).rectangle(OBJECT, fill=(0, 160, 0))
    path = tmp_path / "scene.png"
    image.save(path)
    return path


def in_frame(card_key: str, size: tuple[int, int]) -> Box:
    """OBJECT in the model's frame for `card_key`, as its answer would give it."""
    card = CARDS[card_key]
    assert card.grounding is not None
    width, height = size
    x1, y1, x2, y2 = OBJECT
    frame = card.grounding.frame
    if frame == "pixels":
        kwargs = card.engine_args["mm_processor_kwargs"]
        fw, fh = smart_resize(width, height, 28, kwargs["min_pixels"], kwargs["max_pixels"])
    else:
        fw = fh = {"thousandths": 1000, "thousandths_999": 999, "loc_bins": 1024}[frame]
    return Box(x1 * fw / width, y1 * fh / height, x2 * fw / width, y2 * fh / height, "the green box")


@pytest.mark.parametrize(
    "key", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "paligemma", "internvl_chat", "glm4_5v", "deepseek_ocr"]
)
def test_boxes_land_on_the_object_in_the_picture_the_user_sent(key: str, tmp_path: Path):
    # 1000 x 700 is not a multiple of 28, so Qwen2.5-VL's resized frame differs from the picture.
    size = (1000, 700)
    scene = picture(tmp_path, size)
    card = CARDS[key]
    answer = "Found it. " + write(card.grounding.syntax, in_frame(key, size))
    (box,) = image_boxes(card, answer, size)
    # Within the rounding of the model's frame (a bin of 1024, a thousandth, a resized pixel).
    for got, want in zip((box.x1, box.y1, box.x2, box.y2), OBJECT, strict=True):
        assert abs(got - want) <= 2.5, (key, box)
    out = tmp_path / "drawn.png"
    assert draw_answer_boxes(card, answer, scene, out) == 1
    drawn = Image.open(out).convert("RGB")
    assert drawn.size == size
    # The outline runs along the object's edges and nowhere else: mid-points of the four edges
    # changed colour, the object's inside and the picture's far corner did not.
    x1, y1, x2, y2 = OBJECT
    for x, y in [((x1 + x2) // 2, y2), (x1, (y1 + y2) // 2), (x2, (y1 + y2) // 2)]:
        # The outline is drawn inside the box, which the frame's rounding moves by a pixel or two.
        near = {drawn.getpixel((x + dx, y + dy)) for dx in range(-3, 4) for dy in range(-3, 4)}
        assert near - {(255, 255, 255), (0, 160, 0)}, (key, (x, y))
    assert drawn.getpixel(((x1 + x2) // 2, (y1 + y2) // 2)) == (0, 160, 0)
    assert drawn.getpixel((size[0] - 5, size[1] - 5)) == (255, 255, 255)


def test_a_box_outside_the_picture_is_clamped_to_it(tmp_path: Path):
    card = CARDS["qwen3_vl"]
    (box,) = image_boxes(card, '[{"bbox_2d": [-50, 900, 1200, 1400], "label": "x"}]', (400, 200))
    assert (box.x1, box.y1, box.x2, box.y2) == (0, 180, 400, 200)


def test_a_card_that_does_not_ground_draws_nothing(tmp_path: Path):
    card = CARDS["llava"]
    out = tmp_path / "drawn.png"
    assert draw_answer_boxes(card, DOCUMENTED["qwen_json"][0], picture(tmp_path), out) == 0
    assert not out.exists()


def test_the_chat_shows_the_drawn_picture_under_the_answer_and_keeps_the_raw_text(tmp_path: Path):
    card = CARDS["qwen3_vl"]
    scene = picture(tmp_path)
    answer = write("qwen_json", in_frame("qwen3_vl", (640, 360)))
    drawn = tmp_path / "drawn.png"
    count = draw_answer_boxes(card, answer, scene, drawn)
    reply = Reply.of(card, answer=answer, state="done", boxes_drawn=drawn, box_count=count)
    messages = conversation(Session(turns=[Turn("Where is the green box?", images=[scene], reply=reply)]))
    contents = [m["content"] for m in messages if m["role"] == "assistant"]
    assert answer in contents  # the raw answer stays
    (image,) = [c for c in contents if isinstance(c, gr.Image)]
    assert image.label == "The 1 box this answer names, drawn on the picture"


def test_a_comparison_shows_each_columns_boxes_and_its_export_names_no_server_file(tmp_path: Path):
    from app.domain.compare import Comparison, to_json
    from app.engines.base import SamplingSettings
    from app.views.compare import columns_view

    card = CARDS["qwen3_vl"]
    scene = picture(tmp_path)
    answer = write("qwen_json", in_frame("qwen3_vl", (640, 360)))
    drawn = tmp_path / "drawn.png"
    count = draw_answer_boxes(card, answer, scene, drawn)
    grounded = Reply.of(card, answer=answer, state="done", boxes_drawn=drawn, box_count=count)
    plain = Reply.of(CARDS["llava"], answer="A green box.", state="done")
    comparison = Comparison("Where?", ["scene.png"], "", SamplingSettings(), [grounded, plain])
    images = [u for u in columns_view(comparison) if isinstance(u, gr.Image)]
    assert [image.visible for image in images[:2]] == [True, False]
    assert images[0].label == "The 1 box this answer names"
    exported = to_json(comparison)
    assert str(tmp_path) not in exported and "boxes_drawn" not in exported
