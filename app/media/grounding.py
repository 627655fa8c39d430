"""Grounding boxes in answers: parsed from each model family's own box syntax, mapped from the
model's coordinate frame to the picture the user sent, and drawn on it.

A card that grounds declares `grounding: {syntax, frame}` (`app.catalog.cards.Grounding`). The syntaxes
are those the model families document:

- `qwen_json` (Qwen2.5-VL, Qwen3-VL): a JSON list of objects with `"bbox_2d": [x1, y1, x2, y2]`
  and a `"label"`, usually in a ```json fence.
- `qwen2_tokens` (Qwen2-VL): `<|object_ref_start|>label<|object_ref_end|><|box_start|>(x1,y1),
  (x2,y2)<|box_end|>`.
- `loc_tokens` (PaliGemma): four `<locNNNN>` tokens (y1, x1, y2, x2) then the label; several
  detections are separated by ` ; `.
- `ref_box` (InternVL): `<ref>label</ref><box>[[x1, y1, x2, y2], ...]</box>`.
- `glm_box` (GLM-4.1V, GLM-4.5V): `<|begin_of_box|>[x1, y1, x2, y2]<|end_of_box|>`.
- `ref_det` (DeepSeek-VL2, DeepSeek-OCR): `<|ref|>label<|/ref|><|det|>[[x1, y1, x2, y2]]<|/det|>`.

vLLM leaves special tokens out of the text it returns, so markers that are special tokens
(`<|box_start|>`, `<|det|>`...) may be missing: each parser also reads the bare coordinates they
surround. The frames: `pixels` (absolute pixels of the image the processor resized, Qwen2.5-VL),
`thousandths` (0 to 1000 of the width and height), `thousandths_999` (0 to 999, DeepSeek) and
`loc_bins` (1024 bins, PaliGemma).

Output still streaming is parsed as far as it goes: a box whose coordinates are not all there yet
is left out, never guessed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from app.catalog.cards import ModelCard
from app.media.loading import load_image

NUMBER = r"-?\d+(?:\.\d+)?"
QUAD = rf"\[\s*({NUMBER})\s*,\s*({NUMBER})\s*,\s*({NUMBER})\s*,\s*({NUMBER})\s*\]"
# Colours that stay visible on photographs and on white documents alike.
COLOURS = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#008080", "#f032e6", "#9a6324"]


@dataclass(frozen=True)
class Box:
    """A box as the model wrote it: corners in the model's frame, and its label (maybe empty)."""

    x1: float
    y1: float
    x2: float
    y2: float
    label: str = ""

    def ordered(self) -> Box:
        """Corners as top-left then bottom-right, whatever order the model wrote them in."""
        return Box(
            min(self.x1, self.x2),
            min(self.y1, self.y2),
            max(self.x1, self.x2),
            max(self.y1, self.y2),
            self.label,
        )


def _quads(text: str) -> list[tuple[float, ...]]:
    return [tuple(float(v) for v in match.groups()) for match in re.finditer(QUAD, text)]


def _label(text: str) -> str:
    return " ".join(text.split()).strip(" :,;.")[:80]


def parse_qwen_json(text: str) -> list[Box]:
    """Every complete `{... "bbox_2d": [...] ...}` object, in order. Objects are read one by one,
    so a list cut off mid-object (still streaming, or at the token limit) keeps the whole ones."""
    boxes = []
    for match in re.finditer(r"\{[^{}]*\}", text):
        chunk = match.group(0)
        if "bbox_2d" not in chunk:
            continue
        try:
            item = json.loads(chunk)
            x1, y1, x2, y2 = (float(v) for v in item["bbox_2d"])
            label = str(item.get("label", ""))
        except (ValueError, KeyError, TypeError):
            # Models write near-JSON (single quotes, trailing commas): read the fields directly.
            quad = re.search(rf'["\']bbox_2d["\']\s*:\s*{QUAD}', chunk)
            if quad is None:
                continue
            x1, y1, x2, y2 = (float(v) for v in quad.groups())
            named = re.search(r'["\']label["\']\s*:\s*["\']([^"\']*)["\']', chunk)
            label = named.group(1) if named else ""
        boxes.append(Box(x1, y1, x2, y2, _label(label)))
    return boxes


def parse_qwen2_tokens(text: str) -> list[Box]:
    pattern = re.compile(
        r"(?:<\|object_ref_start\|>(?P<label>.*?)<\|object_ref_end\|>)?\s*(?:<\|box_start\|>)?"
        rf"\(\s*({NUMBER})\s*,\s*({NUMBER})\s*\)\s*,\s*\(\s*({NUMBER})\s*,\s*({NUMBER})\s*\)",
        re.DOTALL,
    )
    boxes = []
    for match in pattern.finditer(text):
        x1, y1, x2, y2 = (float(v) for v in match.groups()[1:])
        boxes.append(Box(x1, y1, x2, y2, _label(match.group("label") or "")))
    return boxes


def parse_loc_tokens(text: str) -> list[Box]:
    """PaliGemma: `<loc y1><loc x1><loc y2><loc x2> label`, detections separated by ` ; `."""
    boxes = []
    pattern = re.compile(r"<loc(\d{4})><loc(\d{4})><loc(\d{4})><loc(\d{4})>([^;<]*)")
    for match in pattern.finditer(text):
        y1, x1, y2, x2 = (float(v) for v in match.groups()[:4])
        boxes.append(Box(x1, y1, x2, y2, _label(match.group(5))))
    return boxes


def _labelled_lists(text: str, box: tuple[str, str], ref: tuple[str, str] | None = None) -> list[Box]:
    """`ref[0] label ref[1] box[0] [[quad], [quad]...] box[1]`, every marker optional (vLLM
    drops special tokens); without the reference markers a box has no label."""
    open_box, close_box = (re.escape(marker) for marker in box)
    labelled = ""
    if ref is not None:
        open_ref, close_ref = (re.escape(marker) for marker in ref)
        labelled = rf"(?:{open_ref}(?P<label>[^\[\]]*?){close_ref})?"
    group = re.compile(
        rf"{labelled}\s*(?:{open_box})?\s*"
        rf"(?P<quads>\[\s*{QUAD}(?:\s*,\s*{QUAD})*\s*\]|{QUAD})\s*(?:{close_box})?",
        re.DOTALL,
    )
    boxes = []
    for match in group.finditer(text):
        label = _label(match.groupdict().get("label") or "")
        for x1, y1, x2, y2 in _quads(match.group("quads")):
            boxes.append(Box(x1, y1, x2, y2, label))
    return boxes


def parse_ref_box(text: str) -> list[Box]:
    return _labelled_lists(text, ("<box>", "</box>"), ("<ref>", "</ref>"))


def parse_glm_box(text: str) -> list[Box]:
    return _labelled_lists(text, ("<|begin_of_box|>", "<|end_of_box|>"))


def parse_ref_det(text: str) -> list[Box]:
    return _labelled_lists(text, ("<|det|>", "<|/det|>"), ("<|ref|>", "<|/ref|>"))


PARSERS: dict[str, Callable[[str], list[Box]]] = {
    "qwen_json": parse_qwen_json,
    "qwen2_tokens": parse_qwen2_tokens,
    "loc_tokens": parse_loc_tokens,
    "ref_box": parse_ref_box,
    "glm_box": parse_glm_box,
    "ref_det": parse_ref_det,
}


def parse_boxes(text: str, syntax: str) -> list[Box]:
    """The boxes an answer names, in the order it names them (corners ordered)."""
    return [box.ordered() for box in PARSERS[syntax](text)]


# --- frames ---------------------------------------------------------------------------------


def smart_resize(width: int, height: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The size Qwen's image processors resize an image to (sides multiples of `factor`, area
    within the bounds, aspect kept): the frame of Qwen2.5-VL's absolute coordinates. The same
    rule as `transformers.models.qwen2_vl.image_processing_qwen2_vl.smart_resize`, kept here
    because the UI imports no torch (transformers' image processors do)."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def frame_size(frame: str, resized: tuple[int, int] | None = None) -> tuple[float, float]:
    """The width and height a box's coordinates count in (`resized`: the processor's size of
    the image, for the `pixels` frame)."""
    if frame == "pixels":
        if resized is None:
            raise ValueError("the pixels frame needs the processor's resized size")
        return float(resized[0]), float(resized[1])
    return {"thousandths": (1000.0, 1000.0), "thousandths_999": (999.0, 999.0), "loc_bins": (1024.0, 1024.0)}[
        frame
    ]


def to_image(box: Box, frame: tuple[float, float], image_size: tuple[int, int]) -> Box:
    """The box in the picture's own pixels, clamped to it."""
    width, height = image_size
    sx, sy = width / frame[0], height / frame[1]

    def clamp(value: float, top: int) -> float:
        return min(max(value, 0.0), float(top))

    return Box(
        clamp(box.x1 * sx, width),
        clamp(box.y1 * sy, height),
        clamp(box.x2 * sx, width),
        clamp(box.y2 * sy, height),
        box.label,
    )


def draw_boxes(image: Image.Image, boxes: Sequence[Box]) -> Image.Image:
    """A copy of `image` with each box (in its pixels) outlined and labelled."""
    drawn = image.convert("RGB")
    draw = ImageDraw.Draw(drawn)
    line = max(2, round(max(drawn.size) / 250))
    font = ImageFont.load_default(size=max(12, round(max(drawn.size) / 40)))
    for index, box in enumerate(boxes):
        colour = COLOURS[index % len(COLOURS)]
        draw.rectangle((box.x1, box.y1, box.x2, box.y2), outline=colour, width=line)
        if box.label:
            left, top, right, bottom = draw.textbbox((0, 0), box.label, font=font)
            tw, th = right - left, bottom - top
            # Above the box where there is room, else inside its top edge.
            ty = box.y1 - th - 2 * line if box.y1 - th - 2 * line >= 0 else box.y1
            draw.rectangle((box.x1, ty, box.x1 + tw + 2 * line, ty + th + 2 * line), fill=colour)
            draw.text((box.x1 + line - left, ty + line - top), box.label, fill="white", font=font)
    return drawn


# --- an answer's boxes on the picture it is about ------------------------------------------

# Qwen2.5-VL's image processor's own bounds, where a card's mm_processor_kwargs give none.
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 28 * 28 * 16384


def image_boxes(card: ModelCard, answer: str, image_size: tuple[int, int]) -> list[Box]:
    """The boxes of `answer` in the pixels of a picture of `image_size` (as the model saw it),
    or none where the card does not ground."""
    grounding = card.grounding
    if grounding is None:
        return []
    boxes = parse_boxes(answer, grounding.syntax)
    if not boxes:
        return []
    resized = None
    if grounding.frame == "pixels" and grounding.resize_factor is not None:
        kwargs = card.engine_args.get("mm_processor_kwargs") or {}
        resized = smart_resize(
            *image_size,
            grounding.resize_factor,
            int(kwargs.get("min_pixels", QWEN_MIN_PIXELS)),
            int(kwargs.get("max_pixels", QWEN_MAX_PIXELS)),
        )
    frame = frame_size(grounding.frame, resized)
    return [to_image(box, frame, image_size) for box in boxes]


def draw_answer_boxes(card: ModelCard, answer: str, picture: Path, out: Path) -> int:
    """Draws `answer`'s boxes on `picture` (loaded as the model got it: upright, RGB, downscaled
    like every image sent) into `out` as PNG. Returns how many boxes; none writes nothing."""
    image = load_image(picture)
    boxes = image_boxes(card, answer, image.size)
    if boxes:
        draw_boxes(image, boxes).save(out, format="PNG")
    return len(boxes)
