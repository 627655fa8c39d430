"""Pictures and clips of coloured shapes, with questions and their answers: what the seeing demo
model is trained on (`app.demo.seeing_model`), what the tests ask it, and the demo's examples.

Everything comes from a seeded `random.Random`, so a seed gives the same data on any machine.
No torch here: PIL and numpy only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (235, 200, 20),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle")
SIDES = ("left", "right")
COUNTS = {1: "one", 2: "two", 3: "three"}
BACKGROUND = (245, 245, 240)
# The questions, by kind; each kind's answer is one word.
QUESTIONS: dict[str, list[str]] = {
    "colour": ["What colour is the shape?", "What is the colour of the shape?"],
    "shape": ["What shape is it?", "What kind of shape is in the picture?"],
    "side": ["Which side of the picture is the shape on?", "Is the shape on the left or the right?"],
    "count": ["How many shapes are there?", "How many shapes do you see?"],
    "first": ["What colour is the shape in the first picture?"],
    "second": ["What colour is the shape in the second picture?"],
    "start": ["What colour does the clip start with?"],
    "end": ["What colour does the clip end with?"],
}
KINDS = tuple(QUESTIONS)
CLIP_FRAMES = 8


@dataclass(frozen=True)
class Drawn:
    """One shape as drawn: what the questions ask about."""

    colour: str
    shape: str
    side: str


@dataclass
class Example:
    """A conversation's last question about its media, and the one-word answer. `images` go in
    the last turn; `earlier` is an earlier turn's (images, question, answer), if any (a
    follow-up's last turn has no images: it asks about the earlier turn's)."""

    kind: str
    question: str
    answer: str
    images: list[Image.Image] = field(default_factory=list)
    clip: np.ndarray | None = None  # (frames, height, width, 3) uint8
    earlier: tuple[list[Image.Image], str, str] | None = None


def picture(
    rng: random.Random, shapes: list[Drawn] | None = None, size: tuple[int, int] | None = None
) -> Image.Image:
    """A picture of 1 to 3 shapes (or `shapes`) side by side, each in its half or third."""
    width, height = size or (rng.randint(96, 320), rng.randint(96, 320))
    if shapes is None:
        shapes = [Drawn(rng.choice(list(COLOURS)), rng.choice(SHAPES), rng.choice(SIDES))]
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    slots = len(shapes)
    for index, drawn in enumerate(shapes):
        if slots == 1:
            left = 0 if drawn.side == "left" else width // 2
            slot_width = width // 2
        else:
            slot_width = width // slots
            left = index * slot_width
        # Centred in its slot at a fixed share of it: a model this small learns from few
        # examples what is where, not shapes at any place and size (it has no convolutions).
        side = int(min(slot_width, height) * 0.7)
        x = left + (slot_width - side) // 2
        y = (height - side) // 2
        box = (x, y, x + side, y + side)
        fill = COLOURS[drawn.colour]
        if drawn.shape == "circle":
            draw.ellipse(box, fill=fill)
        elif drawn.shape == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(x + side / 2, y), (x, y + side), (x + side, y + side)], fill=fill)
    return image


def clip(rng: random.Random, start: str, end: str, frames: int = CLIP_FRAMES) -> np.ndarray:
    """A clip whose shape is `start`-coloured in its first half and `end`-coloured after."""
    width, height = rng.choice([(160, 120), (128, 128), (192, 108)])
    shape, side = rng.choice(SHAPES), rng.choice(SIDES)
    images = []
    for index in range(frames):
        colour = start if index < frames // 2 else end
        images.append(np.asarray(picture(rng, [Drawn(colour, shape, side)], (width, height))))
    return np.stack(images)


# What a picture's labels are for the vision tower's lesson (`app.demo.seeing_model`): each
# question about one picture, with its possible answers in a fixed order.
LABELS: dict[str, tuple[str, ...]] = {
    "colour": tuple(COLOURS),
    "shape": SHAPES,
    "side": SIDES,
    "count": tuple(COUNTS.values()),
}


def labelled_picture(rng: random.Random) -> tuple[Image.Image, dict[str, str | None]]:
    """A picture of one shape (half the time) or of one to three, with the answer to each of
    `LABELS`' questions (None where a question has no answer: the colour of three shapes)."""
    count = 1 if rng.random() < 0.5 else rng.randint(1, 3)
    drawn = [Drawn(rng.choice(list(COLOURS)), rng.choice(SHAPES), rng.choice(SIDES)) for _ in range(count)]
    one = drawn[0] if count == 1 else None
    labels = {
        "colour": one and one.colour,
        "shape": one and one.shape,
        "side": one and one.side,
        "count": COUNTS[count],
    }
    return picture(rng, drawn), labels


def example(rng: random.Random, kind: str | None = None) -> Example:
    """A random question of `kind` (any kind if None) with its media and answer."""
    kind = kind or rng.choice(KINDS)
    question = rng.choice(QUESTIONS[kind])
    colours = list(COLOURS)
    if kind in ("colour", "shape", "side"):
        drawn = Drawn(rng.choice(colours), rng.choice(SHAPES), rng.choice(SIDES))
        answer = {"colour": drawn.colour, "shape": drawn.shape, "side": drawn.side}[kind]
        result = Example(kind, question, answer, [picture(rng, [drawn])])
        turns = rng.random()
        if turns < 0.2:
            # An earlier turn about another picture: the answer must be about the latest one.
            other = Drawn(rng.choice(colours), rng.choice(SHAPES), rng.choice(SIDES))
            earlier_answer = {"colour": other.colour, "shape": other.shape, "side": other.side}[kind]
            result.earlier = ([picture(rng, [other])], question, earlier_answer)
        elif turns < 0.4:
            # A follow-up with no picture: the answer is about the earlier turn's picture, which
            # must still be in the conversation.
            first_kind = rng.choice(["colour", "shape", "side"])
            first_answer = {"colour": drawn.colour, "shape": drawn.shape, "side": drawn.side}[first_kind]
            result.earlier = (result.images, rng.choice(QUESTIONS[first_kind]), first_answer)
            result.images = []
        return result
    if kind == "count":
        count = rng.randint(1, 3)
        shapes = [Drawn(rng.choice(colours), rng.choice(SHAPES), rng.choice(SIDES)) for _ in range(count)]
        return Example(kind, question, COUNTS[count], [picture(rng, shapes)])
    if kind in ("first", "second"):
        first, second = rng.sample(colours, 2)
        images = [picture(rng, [Drawn(c, rng.choice(SHAPES), rng.choice(SIDES))]) for c in (first, second)]
        return Example(kind, question, first if kind == "first" else second, images)
    start, end = rng.sample(colours, 2)
    return Example(kind, question, start if kind == "start" else end, clip=clip(rng, start, end))
