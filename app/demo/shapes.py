"""Pictures and clips of coloured shapes, with questions and their answers: what the seeing demo
model is trained on (`app.demo.seeing_model`), what the tests ask it, and the demo's examples.

The pictures vary the way people's drawings do (issue 29: a model trained on one tidy layout
failed on pictures drawn by other code): shapes from 15% to 90% of the picture's shorter side,
anywhere, never overlapping; pictures of any aspect ratio to 3:1; white, off-white, grey, dark,
gradient and noisy backgrounds; shades around each colour name (`SHADES`); filled and outlined
shapes, smooth and hard edges, small tilts, and JPEG at quality 40 to 95. The questions are
asked in several wordings, British and American, with and without a question mark.

Each picture comes with its scene (`Scene`: every shape's colour, kind and box, the background's
name, and which shape covers each pixel), from which the answers are read and the vision lesson's
per-place labels are made. Everything comes from a seeded `random.Random`, so a seed gives the
same data on any machine. No torch here: PIL and numpy only.
"""

from __future__ import annotations

import colorsys
import io
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from PIL import Image, ImageDraw

# The reference shade of each colour name (the tidy pictures' colours, `tidy_picture`).
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (235, 200, 20),
    "black": (20, 20, 20),
}
# What each name covers, as (hue in degrees, saturation, lightness) ranges in HLS: the shades a
# person would still call by that name (crimson and firebrick are red, navy and royal blue are
# blue, gold is yellow, forest and lime are green). Hues wrap around 360 (red's 345 to 372 is 345
# to 12). Black is any hue, unsaturated and dark.
SHADES: dict[str, tuple[tuple[float, float], tuple[float, float], tuple[float, float]]] = {
    "red": ((345.0, 372.0), (0.70, 1.0), (0.30, 0.55)),
    "green": ((90.0, 155.0), (0.40, 1.0), (0.20, 0.55)),
    "blue": ((200.0, 245.0), (0.50, 1.0), (0.20, 0.60)),
    "yellow": ((45.0, 62.0), (0.70, 1.0), (0.46, 0.62)),
    "black": ((0.0, 360.0), (0.0, 0.25), (0.0, 0.16)),
}
# On a dark background no shade darker than this (a navy shape on a black page is unseen), and
# no black shape at all.
DARK_FLOOR = 0.25
SHAPES = ("circle", "square", "triangle")
SIDES = ("left", "right")
PLACES = ("left", "right", "top", "bottom", "middle")
COUNTS = {0: "none", 1: "one", 2: "two", 3: "three"}
BACKGROUND = (245, 245, 240)  # the tidy pictures' background
# Background kinds, how often, and the word a person uses for each one's colour.
BACKDROPS = {"white": 0.2, "off-white": 0.2, "grey": 0.15, "dark": 0.15, "gradient": 0.15, "noise": 0.15}
BACKDROP_WORDS = {
    "white": "white",
    "off-white": "white",
    "grey": "grey",
    "dark": "black",
    "gradient": "white",
}
BACKGROUND_WORDS = ("white", "grey", "black")
# The pages the background question picks from for each answer: those whose word is fixed.
BACKDROPS_OF_WORD = {
    word: tuple(k for k, w in BACKDROP_WORDS.items() if w == word) for word in BACKGROUND_WORDS
}
# The share of the picture's shorter side a shape takes, by how many shapes there are: one shape
# from small to nearly all of it; two or three up to what fits apart in a wide picture (`place`
# makes them smaller until they fit).
SIZE_SHARE = {1: (0.15, 0.9), 2: (0.15, 0.7), 3: (0.15, 0.6)}
# A lone shape's centre is at least this share of the picture from the middle for "left",
# "right", "top" or "bottom" to be its place (and well within it for "middle"); for "which
# side", at least `SIDE_MARGIN` of the width.
PLACE_MARGIN, SIDE_MARGIN = 0.2, 0.08
# Generated at moderate sizes (the processor resizes every picture to at most 224x224 pixels,
# so a 2,000-pixel picture looks like a 300-pixel one to the model), any aspect ratio to 3:1.
LONG_SIDE, MAX_ASPECT = (64, 360), 3.0
JPEG_SHARE, JPEG_QUALITY = 0.35, (40, 95)
# A third of the count questions' pictures have all their shapes in one colour: drawn each on its
# own, three shapes share one colour 1 time in 25, and the models counted colours (runs RC, RC2).
ONE_COLOUR_COUNT_SHARE = 1 / 3
FILLED_SHARE, SMOOTH_SHARE, TILT_DEGREES = 0.7, 0.6, 15.0
OUTSIDE = (
    "I can only answer about the shapes in your picture: their colour, kind, place, size and "
    "number, the background, and the colours of a clip."
)


@dataclass(frozen=True)
class Drawn:
    """One shape to draw: its colour name and kind (and, in a tidy picture, its side)."""

    colour: str
    shape: str
    side: str = "left"


@dataclass(frozen=True)
class Placed:
    """Where and how big one shape is drawn: centre, size (pixels), tilt (degrees), stretch."""

    x: float
    y: float
    size: float
    tilt: float
    stretch: float
    apex: float  # a triangle's top vertex, as a share of its width from the middle


@dataclass
class Scene:
    """A drawn picture and what is in it: each shape, where it is (its box in pixels: left,
    top, right, bottom), the background's word, `owner` (height, width: 0 for background,
    i + 1 where shape i covers the pixel, outlined shapes counted as filled) and the kind of
    background drawn (one of `BACKDROPS`)."""

    image: Image.Image
    shapes: list[Drawn]
    boxes: list[tuple[float, float, float, float]]
    background: str
    owner: np.ndarray
    backdrop: str = "white"

    def centre(self, index: int) -> tuple[float, float]:
        """Shape `index`'s centre as shares of the picture's width and height."""
        left, top, right, bottom = self.boxes[index]
        return (left + right) / 2 / self.image.width, (top + bottom) / 2 / self.image.height

    def area(self, index: int) -> int:
        return int((self.owner == index + 1).sum())


def place_of(x: float, y: float) -> str | None:
    """The word for a lone shape centred at (x, y) (shares of the picture), None if between two."""
    dx, dy = x - 0.5, y - 0.5
    if max(abs(dx), abs(dy)) < PLACE_MARGIN * 0.4:
        return "middle"
    if abs(dx) > PLACE_MARGIN and abs(dx) > 1.6 * abs(dy):
        return "left" if dx < 0 else "right"
    if abs(dy) > PLACE_MARGIN and abs(dy) > 1.6 * abs(dx):
        return "top" if dy < 0 else "bottom"
    return None


def side_of(x: float) -> str | None:
    """ "left" or "right" for a lone shape centred at share x of the width, None near the middle."""
    if abs(x - 0.5) < SIDE_MARGIN:
        return None
    return "left" if x < 0.5 else "right"


def shade(rng: random.Random, colour: str, floor: float = 0.0) -> tuple[int, int, int]:
    """A random shade of `colour` within `SHADES`, no lighter-limit below `floor` (coloured names)."""
    (hue_low, hue_high), (sat_low, sat_high), (light_low, light_high) = SHADES[colour]
    if colour != "black":
        light_low = min(max(light_low, floor), light_high)
    hue = rng.uniform(hue_low, hue_high) % 360 / 360
    red, green, blue = colorsys.hls_to_rgb(
        hue, rng.uniform(light_low, light_high), rng.uniform(sat_low, sat_high)
    )
    return round(red * 255), round(green * 255), round(blue * 255)


def random_size(rng: random.Random) -> tuple[int, int]:
    """A picture's (width, height): any aspect ratio to `MAX_ASPECT`, long side in `LONG_SIDE`."""
    long = rng.randint(*LONG_SIDE)
    short = max(48, round(long / math.exp(rng.uniform(0, math.log(MAX_ASPECT)))))
    return (long, short) if rng.random() < 0.5 else (short, long)


def backdrop(rng: random.Random, width: int, height: int, kind: str) -> np.ndarray:
    """A background of `kind` (one of `BACKDROPS`) as a (height, width, 3) float array."""

    def light(low: float, high: float, saturation: float) -> np.ndarray:
        rgb = colorsys.hls_to_rgb(rng.random(), rng.uniform(low, high), rng.uniform(0, saturation))
        return np.array(rgb) * 255

    if kind == "white":
        base = np.full(3, 255.0)
    elif kind == "off-white":
        base = light(0.9, 0.98, 0.5)
    elif kind == "grey":
        base = light(0.5, 0.8, 0.06)
    elif kind == "dark":
        base = light(0.03, 0.2, 0.4)
    else:
        base = light(0.88, 0.99, 0.4)
    pixels = np.broadcast_to(base, (height, width, 3)).astype(np.float32)
    if kind == "gradient":
        angle = rng.uniform(0, 2 * math.pi)
        ys, xs = np.mgrid[0:height, 0:width]
        along = (xs * math.cos(angle) + ys * math.sin(angle)) / max(width, height)
        along = (along - along.min()) / max(float(along.max() - along.min()), 1e-6)
        pixels = pixels + along[..., None] * (light(0.85, 0.97, 0.4) - base)
    elif kind == "noise":
        noise = np.random.default_rng(rng.getrandbits(32)).normal(0, rng.uniform(2, 12), (height, width, 3))
        pixels = pixels + noise
    return pixels


def place(
    rng: random.Random,
    count: int,
    width: int,
    height: int,
    where: str | None = None,
    sizes: list[float] | None = None,
    spacing: float = 0.5,
) -> list[Placed]:
    """Places for `count` shapes, each fully in the picture (a shape too big to fit is made
    smaller), a lone shape's centre at `where` if given (one of `PLACES`, or a side's "left side"
    or "right side", where only the width counts). `sizes` as shares of the shorter side, else
    drawn from `SIZE_SHARE`. Centres are `spacing` times the two sizes apart: at 0.5 shapes may
    come close (people draw them a few pixels apart); `scene` checks their pixels never touch."""
    short = min(width, height)
    low, high = SIZE_SHARE[min(count, 3)]
    shares = sizes or [rng.uniform(low, high) for _ in range(count)]
    for _ in range(60):
        places: list[Placed] = []
        for share in shares:
            tilt = 0.0 if rng.random() < 0.4 else rng.uniform(-TILT_DEGREES, TILT_DEGREES)
            stretch, apex = rng.uniform(0.85, 1.15), rng.uniform(-0.3, 0.3)
            # How far it reaches from its centre across and down (a tilted square's corner
            # reaches 0.71 of its size), made smaller where it would not fit.
            reach_x, reach_y = (0.72 * max(1.0, stretch), 0.72) if tilt else (0.5 * stretch, 0.5)
            size = min(share * short, width / (2 * reach_x + 0.02), height / (2 * reach_y + 0.02))
            half_x, half_y = size * reach_x, size * reach_y
            found = None
            for _ in range(40):
                x, y = rng.uniform(half_x, width - half_x), rng.uniform(half_y, height - half_y)
                if where is not None and where != (
                    f"{side_of(x / width)} side"
                    if where.endswith(" side")
                    else place_of(x / width, y / height)
                ):
                    continue
                if all(
                    math.hypot(x - p.x, y - p.y) > spacing * (size + p.size) + 0.01 * short for p in places
                ):
                    found = Placed(x, y, size, tilt, stretch, apex)
                    break
            if found is None:
                break
            places.append(found)
        if len(places) == count:
            return places
        shares = [share * 0.9 for share in shares]
    raise ValueError(f"no room for {count} shapes in {width}x{height}")


def outline(shape: str, placed: Placed, scale: float) -> list[tuple[float, float]]:
    """The shape's polygon (a circle as 48 points), tilted and stretched, `scale` times larger."""
    half_width, half_height = placed.size * placed.stretch / 2, placed.size / 2
    if shape == "circle":
        points = [
            (half_width * math.cos(t), half_height * math.sin(t))
            for t in (2 * math.pi * i / 48 for i in range(48))
        ]
    elif shape == "square":
        points = [
            (-half_width, -half_height),
            (half_width, -half_height),
            (half_width, half_height),
            (-half_width, half_height),
        ]
    else:
        points = [
            (placed.apex * half_width * 2, -half_height),
            (half_width, half_height),
            (-half_width, half_height),
        ]
    cos, sin = math.cos(math.radians(placed.tilt)), math.sin(math.radians(placed.tilt))
    return [
        ((placed.x + px * cos - py * sin) * scale, (placed.y + px * sin + py * cos) * scale)
        for px, py in points
    ]


def scene(
    rng: random.Random,
    shapes: list[Drawn],
    size: tuple[int, int] | None = None,
    where: str | None = None,
    sizes: list[float] | None = None,
    backdrop_kind: str | None = None,
) -> Scene:
    """A varied picture of `shapes` and what is in it (see the module's docstring)."""
    width, height = size or random_size(rng)
    dark_allowed = all(d.colour != "black" for d in shapes)
    kinds = [k for k in BACKDROPS if dark_allowed or k != "dark"]
    kind = backdrop_kind or rng.choices(kinds, [BACKDROPS[k] for k in kinds])[0]
    background = backdrop(rng, width, height, kind)
    word = BACKDROP_WORDS.get(kind) or ("white" if float(background.mean()) > 200 else "grey")
    filled, smooth = rng.random() < FILLED_SHARE, rng.random() < SMOOTH_SHARE
    stroke = rng.uniform(0.08, 0.2)  # of the shape's size, and at least 2% of the picture
    jpeg = rng.randint(*JPEG_QUALITY) if rng.random() < JPEG_SHARE else None
    shades = [shade(rng, d.colour, DARK_FLOOR if kind == "dark" else 0.0) for d in shapes]
    scale = 3 if smooth else 1  # smooth edges: drawn three times larger, then averaged down
    for attempt in range(30):
        # Close first (by their inscribed circles), further apart after each try that touched.
        places = place(rng, len(shapes), width, height, where, sizes, spacing=0.5 + 0.03 * attempt)
        lines = [max(2.0, stroke * p.size, 0.02 * min(width, height)) for p in places]
        # Each shape's pixels (its outline's stroke too), which no other shape's may touch.
        footprints = [
            footprint(d.shape, p, 0 if filled else w, width, height)
            for d, p, w in zip(shapes, places, lines, strict=True)
        ]
        apart = [
            np.asarray(footprint(d.shape, p, (0 if filled else w) + 4, width, height))
            for d, p, w in zip(shapes, places, lines, strict=True)
        ]
        if len(shapes) < 2 or int(np.sum([a > 0 for a in apart], axis=0).max()) < 2:
            break
    else:
        raise ValueError(f"no room for {len(shapes)} shapes apart in {width}x{height}")
    pixels = np.array(background, dtype=np.float32)  # a copy: broadcast backgrounds are read-only
    owner = np.zeros((height, width), dtype=np.uint8)
    boxes = []
    for index, (drawn, placed, rgb, line, covered) in enumerate(
        zip(shapes, places, shades, lines, footprints, strict=True)
    ):
        ys, xs = np.nonzero(np.asarray(covered))
        owner[ys, xs] = index + 1
        boxes.append((float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)))
        # Drawn in the shape's own box only (a whole picture three times larger was most of a
        # training step's time).
        reach = placed.size * 0.75 + line
        left, top = max(0, int(placed.x - reach)), max(0, int(placed.y - reach))
        right, bottom = min(width, math.ceil(placed.x + reach)), min(height, math.ceil(placed.y + reach))
        mask = Image.new("L", ((right - left) * scale, (bottom - top) * scale), 0)
        points = [(x - left * scale, y - top * scale) for x, y in outline(drawn.shape, placed, scale)]
        if filled:
            ImageDraw.Draw(mask).polygon(points, fill=255)
        else:
            ImageDraw.Draw(mask).line(
                [*points, points[0], points[1]], fill=255, width=round(line * scale), joint="curve"
            )
        if scale > 1:
            mask = mask.resize((right - left, bottom - top), Image.Resampling.BOX)
        alpha = np.asarray(mask, dtype=np.float32)[..., None] / 255
        region = pixels[top:bottom, left:right]
        pixels[top:bottom, left:right] = region * (1 - alpha) + np.array(rgb, dtype=np.float32) * alpha
    image = Image.fromarray(np.clip(pixels, 0, 255).round().astype(np.uint8), "RGB")
    if jpeg is not None:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=jpeg)
        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    return Scene(image, list(shapes), boxes, word, owner, kind)


def footprint(shape: str, placed: Placed, line: float, width: int, height: int) -> Image.Image:
    """The pixels a shape covers (filled, plus a stroke of `line` pixels around its edge)."""
    mask = Image.new("L", (width, height), 0)
    points = outline(shape, placed, 1)
    ImageDraw.Draw(mask).polygon(points, fill=1)
    if line > 0:
        ImageDraw.Draw(mask).line([*points, points[0], points[1]], fill=1, width=round(line), joint="curve")
    return mask


def picture(rng: random.Random, shapes: list[Drawn], size: tuple[int, int] = (240, 160)) -> Image.Image:
    """The tidy picture of `shapes` (`tidy_picture`); `rng` is unused, kept for the callers' shape."""
    del rng
    return tidy_picture(shapes, *size)


def tidy_picture(shapes: list[Drawn], width: int, height: int) -> Image.Image:
    """The first version's pictures: each shape filled at 0.7 of its half (a lone shape, on its
    side) or third, centred, on `BACKGROUND` in the reference colours (what the pipeline tests
    send, where the exact pixels matter)."""
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


# The questions, by kind, as people ask them. `{colour}` and `{shape}` are filled in from the
# picture; `wording` then spells colour "color" half the time and drops the question mark or the
# capital now and then.
QUESTIONS: dict[str, list[str]] = {
    "colour": [
        "What colour is the shape?",
        "What is the colour of the shape?",
        "What colour is it?",
        "What colour is this?",
        "Which colour is the shape?",
        "What colour is the object?",
        "What colour do you see?",
        "What colour?",
        "Which colour?",
        "Colour?",
        "What is its colour?",
        "Tell me the colour.",
    ],
    "shape": [
        "What shape is it?",
        "What kind of shape is in the picture?",
        "Which shape is that?",
        "What shape is this?",
        "What is the shape?",
        "What shape do you see?",
        "Is it a circle, a square or a triangle?",
        "What shape?",
        "Which shape?",
        "Name the shape.",
        "What kind of shape is it?",
    ],
    "side": [
        "Which side of the picture is the shape on?",
        "Is the shape on the left or the right?",
        "Is it on the left or the right?",
        "Which side is it on?",
        "On which side is the shape?",
        "Left or right?",
        "Which side?",
    ],
    "where": [
        "Where is the shape?",
        "Where is it?",
        "Where in the picture is the shape?",
        "Which part of the picture is the shape in?",
        "Where is the object?",
        "Where?",
        "Where is it located?",
    ],
    "count": [
        "How many shapes are there?",
        "How many shapes do you see?",
        "How many things are in the picture?",
        "How many objects are there?",
        "How many shapes are in the image?",
        "Count the shapes.",
        "How many?",
        "How many shapes?",
        "Count them.",
    ],
    "colour count": [
        "How many {colour} shapes are there?",
        "How many {colour} things do you see?",
        "How many {colour} shapes are in the picture?",
        "Count the {colour} shapes.",
        "How many are {colour}?",
        "How many {colour} ones?",
    ],
    "bigger": [
        "Which shape is bigger?",
        "Which one is larger?",
        "Which is the bigger shape?",
        "Which shape is the largest?",
        "Which is bigger?",
        "Which one is bigger?",
    ],
    "background": [
        "What colour is the background?",
        "What is the background colour?",
        "What colour is the page?",
        "Which colour is the background?",
        "Background colour?",
        "What colour is the backdrop?",
        "What colour is behind the shapes?",
    ],
    "describe": [
        "Describe the picture.",
        "Describe this image.",
        "What is in the picture?",
        "What do you see?",
        "What shapes do you see, and what colour is each?",
        "Describe it.",
        "What's in the image?",
    ],
    "box": [
        "Where is the {colour} {shape}?",
        "Point to the {colour} {shape}.",
        "Find the {colour} {shape}.",
        "Locate the {colour} {shape} and output its bbox coordinates in JSON format.",
        "Where's the {colour} {shape}?",
        "Show me the {colour} {shape}.",
    ],
    "first": [
        "What colour is the shape in the first picture?",
        "What colour is the first picture's shape?",
        "In the first image, what colour is the shape?",
    ],
    "second": [
        "What colour is the shape in the second picture?",
        "What colour is the second picture's shape?",
        "In the second image, what colour is the shape?",
    ],
    "start": [
        "What colour does the clip start with?",
        "What colour is the shape at the start of the video?",
        "What colour does it begin with?",
        "Which colour comes first?",
    ],
    "end": [
        "What colour does the clip end with?",
        "What colour is the shape at the end of the video?",
        "What colour does it finish with?",
        "Which colour comes last?",
    ],
    "moved": [
        "Which way does the shape move?",
        "Which way does it go?",
        "Does the shape move to the left or to the right?",
        "How does the shape move?",
        "Which direction does it move?",
    ],
    "outside": [
        "What is the capital of France?",
        "Tell me a joke.",
        "Who are you?",
        "Write a poem about the sea.",
        "What is two plus two?",
        "What breed is this dog?",
        "Translate hello into French.",
        "What time is it?",
        "Can you read the text in this picture?",
        "Who is in this photo?",
        "How old is this picture?",
        "Summarise this document.",
    ],
    # One shape named among one to three: by its kind, for its colour; by its colour, for its
    # kind. The named shape shares its kind or colour with no other, and among two or three the
    # model must read its tokens, not all. Last, so that the kinds before them keep their order
    # (the first model's answers lesson and held-out questions draw by that order).
    "colour of": [
        "What colour is the {shape}?",
        "Which colour is the {shape}?",
        "What is the colour of the {shape}?",
        "What colour is the {shape} in the picture?",
        "Tell me the colour of the {shape}.",
        "The {shape} is what colour?",
    ],
    "shape of": [
        "What shape is the {colour} one?",
        "Which shape is {colour}?",
        "What is the {colour} shape?",
        "What shape is the {colour} thing?",
        "What kind of shape is the {colour} one?",
        "Name the {colour} shape.",
    ],
}
KINDS = tuple(QUESTIONS)
NAMED_KINDS = ("colour of", "shape of")
# More ways people ask, taught in the first model's third lesson only (`seeing_model.teach_named`),
# so that lessons one and two draw as before: asked "Number of shapes?", run S answered with its
# sentence of what it can answer; its count questions all began "How many" or "Count".
LATER_QUESTIONS: dict[str, list[str]] = {
    "count": [
        "What is the number of shapes in the picture?",
        "Give me the number of shapes.",
        "How many shapes can you see?",
        "Tell me how many shapes there are.",
        "What's the shape count?",
        "How many figures are there?",
        "Shape count?",
    ],
    "bigger": [
        "Which of the two is bigger?",
        "Which shape is larger?",
        "What is the biggest shape?",
        "Which shape takes up more space?",
    ],
}
CLIP_FRAMES = 8
BOX_STEP = 20  # box coordinates in thousandths of the picture, rounded to this
PLACE_PHRASES = {
    "left": "on the left",
    "right": "on the right",
    "top": "at the top",
    "bottom": "at the bottom",
    "middle": "in the middle",
}


@dataclass
class Example:
    """A conversation's question about its media, and the answer. `images` go in its turn;
    `earlier` is an earlier turn's (images, question, answer), if any (a follow-up's turn has no
    images: it asks about the earlier turn's). `scene` is the last picture's."""

    kind: str
    question: str
    answer: str
    images: list[Image.Image] = field(default_factory=list)
    clip: np.ndarray | None = None  # (frames, height, width, 3) uint8
    earlier: tuple[list[Image.Image], str, str] | None = None
    scene: Scene | None = None
    # Later questions about the same picture in the same conversation, each (kind, question,
    # answer), asked after this one's answer (`follow_ups`): `question` and `answer` stay the
    # first's.
    follow_ups: list[tuple[str, str, str]] = field(default_factory=list)


def wording(rng: random.Random, question: str) -> str:
    """`question` as someone might type it: "color" half the time, sometimes without the
    question mark or the capital."""
    if rng.random() < 0.5:
        question = question.replace("colour", "color")
    if rng.random() < 0.25:
        question = question.rstrip("?.")
    if rng.random() < 0.2:
        question = question[0].lower() + question[1:]
    return question


def ask(rng: random.Random, kind: str, **names: str) -> str:
    return wording(rng, rng.choice(QUESTIONS[kind]).format(**names))


def random_shapes(rng: random.Random, count: int, distinct: bool = False) -> list[Drawn]:
    """`count` random shapes; `distinct`: no two alike in both colour and kind."""
    while True:
        drawn = [Drawn(rng.choice(list(COLOURS)), rng.choice(SHAPES)) for _ in range(count)]
        if not distinct or all_different(drawn):
            return drawn


def in_one_colour(drawn: list[Drawn]) -> list[Drawn]:
    """`drawn`, every shape in the first one's colour."""
    return [replace(shape, colour=drawn[0].colour) for shape in drawn]


def all_different(drawn: list[Drawn]) -> bool:
    """Whether no two of `drawn` are alike in both colour and kind."""
    return len({(d.colour, d.shape) for d in drawn}) == len(drawn)


def colour_to_count(rng: random.Random, likely: list[str]) -> str:
    """The colour a count of a colour asks about: mostly one of `likely` (those in the picture),
    now and then any, so that "none" is an answer too."""
    return rng.choice(likely) if rng.random() < 0.85 else rng.choice(list(COLOURS))


def lone(rng: random.Random, where: str | None = None) -> Scene:
    """A picture of one random shape, at `where` (one of `PLACES`) if given."""
    return scene(rng, random_shapes(rng, 1), where=where)


def box_answer(found: Scene, index: int) -> str:
    """Shape `index`'s box in the Qwen3-VL grounding syntax: relative coordinates, 0 to 1000."""
    left, top, right, bottom = found.boxes[index]
    width, height = found.image.size

    def thousandths(value: float, side: int) -> int:
        return min(1000, max(0, round(value / side * 1000 / BOX_STEP) * BOX_STEP))

    numbers = [
        thousandths(left, width),
        thousandths(top, height),
        thousandths(right, width),
        thousandths(bottom, height),
    ]
    drawn = found.shapes[index]
    return f'[{{"bbox_2d": [{", ".join(map(str, numbers))}], "label": "{drawn.colour} {drawn.shape}"}}]'


def box_question(rng: random.Random, found: Scene) -> tuple[str, str]:
    """A box question about one of the picture's shapes, drawn at random, and its answer."""
    index = rng.randrange(len(found.shapes))
    named = found.shapes[index]
    return ask(rng, "box", colour=named.colour, shape=named.shape), box_answer(found, index)


# The share of the bigger question's pictures whose two shapes' sizes are within 1.3 times of each
# other. Drawn only 1.5 to 2.8 times apart, the first model named the wider shape: on the foreign
# set it named a triangle as wide as a square, which has half the square's area, the bigger one
# (docs/SEEING_MODEL_RUNS.md, runs AB, AB2 and AB7).
CLOSE_SIZES_SHARE = 1 / 2


def clearly_bigger(found: Scene) -> Drawn | None:
    """The bigger of the picture's two shapes where its area (a triangle's is half a square's of
    its size) is 1.6 times the other's; None where it is not, or the picture has not two."""
    if len(found.shapes) != 2:
        return None
    areas = [found.area(0), found.area(1)]
    return found.shapes[int(areas[1] > areas[0])] if max(areas) >= 1.6 * min(areas) else None


def description(found: Scene) -> str | None:
    """ "A red circle on the left and a blue square on the right.": the shapes from left to right
    (or top to bottom, where they are one above another), each with its place; None where the
    places are not clear enough to say."""
    count = len(found.shapes)
    centres = [found.centre(i) for i in range(count)]
    if count == 1:
        where = place_of(*centres[0])
        phrases = [PLACE_PHRASES[where]] if where else None
        order = [0]
    else:
        by_x = sorted(range(count), key=lambda i: centres[i][0])
        by_y = sorted(range(count), key=lambda i: centres[i][1])
        x_gaps = [centres[b][0] - centres[a][0] for a, b in itertools.pairwise(by_x)]
        y_gaps = [centres[b][1] - centres[a][1] for a, b in itertools.pairwise(by_y)]
        words = {
            2: (["left", "right"], ["top", "bottom"]),
            3: (["left", "middle", "right"], ["top", "middle", "bottom"]),
        }
        across, down = words[count]
        xs, ys = [centres[i][0] for i in by_x], [centres[i][1] for i in by_y]
        # The words must hold for the picture too, not only among the shapes: the left one left
        # of the middle, the right one right of it, a middle one near it, none at the very top.
        if min(x_gaps) > 0.2 and xs[0] < 0.45 and xs[-1] > 0.55 and all(abs(y - 0.5) < 0.3 for y in ys):
            if count == 2 or abs(xs[1] - 0.5) < 0.15:
                order, phrases = by_x, [PLACE_PHRASES[w] for w in across]
            else:
                return None
        elif min(y_gaps) > 0.2 and max(x_gaps) < 0.1 and ys[0] < 0.45 and ys[-1] > 0.55:
            if (count == 2 or abs(ys[1] - 0.5) < 0.15) and all(abs(x - 0.5) < 0.3 for x in xs):
                order, phrases = by_y, [PLACE_PHRASES[w] for w in down]
            else:
                return None
        else:
            return None
    if phrases is None:
        return None
    parts = [
        f"a {found.shapes[i].colour} {found.shapes[i].shape} {p}" for i, p in zip(order, phrases, strict=True)
    ]
    sentence = parts[0] if count == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return sentence[0].upper() + sentence[1:] + "."


def clip(
    rng: random.Random, start: str, end: str, frames: int = CLIP_FRAMES, moving: str | None = None
) -> np.ndarray:
    """A clip of one shape, `start`-coloured in its first half and `end`-coloured after, the same
    drawing in every frame but for the colour; `moving` ("left to right" or "right to left"):
    the shape crosses the picture that way instead, one colour throughout."""
    width, height = rng.choice([(160, 120), (128, 128), (192, 108), (120, 160), (224, 126)])
    shape, seed, backdrop_kind = (
        rng.choice(SHAPES),
        rng.getrandbits(32),
        rng.choice(["white", "off-white", "grey"]),
    )
    share = rng.uniform(0.2, 0.45)
    images = []
    for index in range(frames):
        colour = start if index < frames // 2 else end
        same = random.Random(seed)  # noqa: S311 (drawing, seeded to be reproducible)
        if moving is None:
            drawn = scene(
                same, [Drawn(colour, shape)], (width, height), sizes=[share], backdrop_kind=backdrop_kind
            )
        else:
            drawn = moving_frame(
                same, Drawn(start, shape), (width, height), share, index / (frames - 1), moving
            )
        images.append(np.asarray(drawn.image))
    return np.stack(images)


def moving_frame(
    rng: random.Random, drawn: Drawn, size: tuple[int, int], share: float, progress: float, moving: str
) -> Scene:
    """A frame of a shape crossing the picture: at `progress` (0 to 1) of its way, `moving` as said."""
    width, height = size
    half = share * min(width, height) * 0.72
    travel = progress if moving == "left to right" else 1 - progress
    x = half + (width - 2 * half) * travel
    placed = Placed(x, height / 2, share * min(width, height), 0.0, 1.0, 0.0)
    background = backdrop(rng, width, height, "white")
    mask = Image.new("L", (width, height), 0)
    ImageDraw.Draw(mask).polygon(outline(drawn.shape, placed, 1), fill=255)
    alpha = np.asarray(mask, dtype=np.float32)[..., None] / 255
    pixels = background * (1 - alpha) + np.array(shade(rng, drawn.colour), dtype=np.float32) * alpha
    image = Image.fromarray(np.clip(pixels, 0, 255).round().astype(np.uint8), "RGB")
    return Scene(image, [drawn], [], "white", np.asarray(mask) // 255)


def about(rng: random.Random, kind: str) -> tuple[Scene, dict[str, str]]:
    """A picture of one shape for a question of `kind` (colour, shape, side or where), and the
    answers it has: a side question's shape is on a side, a where question's at a place;
    a colour or shape question's anywhere."""
    where = {"side": f"{rng.choice(SIDES)} side", "where": rng.choice(PLACES)}.get(kind, "")
    found = lone(rng, where or None)
    answers = lone_answers(found)
    # Where it was put (its centre as drawn; a tilted triangle's box is a little off it).
    if kind == "side":
        answers["side"] = where.removesuffix(" side")
    elif kind == "where":
        answers["where"] = where
    return found, answers


def lone_answers(found: Scene) -> dict[str, str]:
    """A picture of one shape's answers to a colour, shape, side and where question; side and
    where only where its centre is clearly at one."""
    drawn = found.shapes[0]
    answers = {"colour": drawn.colour, "shape": drawn.shape}
    x, y = found.centre(0)
    for name, value in (("side", side_of(x)), ("where", place_of(x, y))):
        if value is not None:
            answers[name] = value
    return answers


def example(rng: random.Random, kind: str | None = None) -> Example:
    """A random question of `kind` (any kind if None) with its media and answer."""
    kind = kind or rng.choice(KINDS)
    colours = list(COLOURS)
    if kind in ("colour", "shape", "side", "where"):
        found, answers = about(rng, kind)
        result = Example(kind, ask(rng, kind), answers[kind], [found.image], scene=found)
        turns = rng.random()
        if turns < 0.2:
            # An earlier turn about another picture: the answer must be about the latest one.
            other, other_answers = about(rng, kind)
            result.earlier = ([other.image], ask(rng, kind), other_answers[kind])
        elif turns < 0.4:
            # A follow-up with no picture: the answer is about the earlier turn's picture, which
            # must still be in the conversation.
            first_kind = rng.choice([k for k in ("colour", "shape", "side", "where") if k in answers])
            result.earlier = (result.images, ask(rng, first_kind), answers[first_kind])
            result.images = []
        return result
    if kind == "count":
        drawn = random_shapes(rng, rng.randint(1, 3))
        if rng.random() < ONE_COLOUR_COUNT_SHARE:
            drawn = in_one_colour(drawn)
        found = scene(rng, drawn)
        return Example(kind, ask(rng, kind), COUNTS[len(found.shapes)], [found.image], scene=found)
    if kind == "colour count":
        palette = rng.sample(colours, rng.randint(1, 3))
        drawn = [Drawn(rng.choice(palette), rng.choice(SHAPES)) for _ in range(rng.randint(1, 3))]
        asked = colour_to_count(rng, palette)
        found = scene(rng, drawn)
        answer = COUNTS[sum(d.colour == asked for d in drawn)]
        return Example(kind, ask(rng, kind, colour=asked), answer, [found.image], scene=found)
    if kind == "bigger":
        while True:
            # Clearly bigger: its area (a triangle's is half a square's of its size) 1.6 times the
            # other's. `CLOSE_SIZES_SHARE` of the pictures have sizes close, where only a triangle
            # beside a square or circle is clearly the smaller: the bigger is then the one with more
            # area, not the wider one.
            small = rng.uniform(0.15, 0.3)
            times = rng.uniform(0.85, 1.3) if rng.random() < CLOSE_SIZES_SHARE else rng.uniform(1.5, 2.8)
            drawn = random_shapes(rng, 2, distinct=True)
            found = scene(rng, drawn, sizes=[small, min(0.6, small * times)])
            bigger = clearly_bigger(found)
            if bigger is not None:
                answer = f"the {bigger.colour} {bigger.shape}"
                return Example(kind, ask(rng, kind), answer, [found.image], scene=found)
    if kind == "background":
        # White and grey pages as often as each other, and black ones where no shape is black:
        # among all pages grey is one in six, and run J answered "white" to most grey pages.
        # Noisy pages are left out (not in `BACKDROP_WORDS`): their word depends on how light
        # the page came out.
        drawn = random_shapes(rng, rng.randint(1, 3))
        words = ["white", "grey"] + ["black"] * all(d.colour != "black" for d in drawn)
        found = scene(rng, drawn, backdrop_kind=rng.choice(BACKDROPS_OF_WORD[rng.choice(words)]))
        return Example(kind, ask(rng, kind), found.background, [found.image], scene=found)
    if kind == "describe":
        while True:
            found = scene(rng, random_shapes(rng, rng.randint(1, 3)))
            sentence = description(found)
            if sentence is not None:
                return Example(kind, ask(rng, kind), sentence, [found.image], scene=found)
    if kind == "box":
        found = scene(rng, random_shapes(rng, rng.randint(1, 3), distinct=True))
        return Example(kind, *box_question(rng, found), [found.image], scene=found)
    if kind in NAMED_KINDS:
        # Named by what no other shape in the picture shares: its kind for its colour, its colour
        # for its kind.
        count = rng.choice([1, 2, 2, 3, 3])
        if kind == "colour of":
            drawn = [Drawn(rng.choice(colours), k) for k in rng.sample(SHAPES, count)]
        else:
            drawn = [Drawn(c, rng.choice(SHAPES)) for c in rng.sample(colours, count)]
        found = scene(rng, drawn)
        named = drawn[rng.randrange(count)]
        if kind == "colour of":
            return Example(kind, ask(rng, kind, shape=named.shape), named.colour, [found.image], scene=found)
        return Example(kind, ask(rng, kind, colour=named.colour), named.shape, [found.image], scene=found)
    if kind in ("first", "second"):
        first, second = rng.sample(colours, 2)
        images = [scene(rng, [Drawn(c, rng.choice(SHAPES))]).image for c in (first, second)]
        return Example(kind, ask(rng, kind), first if kind == "first" else second, images)
    if kind in ("start", "end"):
        start, end = rng.sample(colours, 2)
        return Example(kind, ask(rng, kind), start if kind == "start" else end, clip=clip(rng, start, end))
    if kind == "moved":
        way = rng.choice(["left to right", "right to left"])
        colour = rng.choice(colours)
        return Example(kind, ask(rng, kind), way, clip=clip(rng, colour, colour, moving=way))
    # A question outside its world, with a picture or without.
    images = [lone(rng).image] if rng.random() < 0.7 else []
    return Example(kind, ask(rng, kind), OUTSIDE, images)


def follow_ups(
    rng: random.Random, item: Example, count: int, kinds: tuple[str, ...]
) -> list[tuple[str, str, str]]:
    """Up to `count` more questions about `item`'s picture, each (kind, question, answer), of kinds
    among `kinds` other than `item`'s and each other's, and only where the picture has one clear
    answer: a shape's colour, kind, side and place where it is alone, the bigger of two clearly
    different in size (named by colour and kind, as the bigger question's answer is: where the two
    are alike, that names both, still true of the bigger), a box where no two shapes are alike,
    the background's colour where the page's word is fixed, the colour or kind of a shape named by
    the other where the name is its alone. Visitors ask several questions about the picture they
    sent."""
    found = item.scene
    if found is None:
        return []
    drawn = found.shapes
    answers: dict[str, Callable[[], tuple[str, str]]] = {
        "count": lambda: (ask(rng, "count"), COUNTS[len(drawn)]),
    }

    def colour_count() -> tuple[str, str]:
        asked = colour_to_count(rng, [d.colour for d in drawn])
        return ask(rng, "colour count", colour=asked), COUNTS[sum(d.colour == asked for d in drawn)]

    answers["colour count"] = colour_count
    if len(drawn) == 1:
        for lone_kind, truth in lone_answers(found).items():
            answers[lone_kind] = lambda lone_kind=lone_kind, truth=truth: (ask(rng, lone_kind), truth)
    bigger = clearly_bigger(found)
    if bigger is not None:
        answers["bigger"] = lambda: (ask(rng, "bigger"), f"the {bigger.colour} {bigger.shape}")
    if found.backdrop in BACKDROP_WORDS:
        answers["background"] = lambda: (ask(rng, "background"), found.background)
    sentence = description(found)
    if sentence is not None:
        answers["describe"] = lambda: (ask(rng, "describe"), sentence)
    if all_different(drawn):
        answers["box"] = lambda: box_question(rng, found)
    alone_by_kind = [d for d in drawn if sum(o.shape == d.shape for o in drawn) == 1]
    alone_by_colour = [d for d in drawn if sum(o.colour == d.colour for o in drawn) == 1]
    if alone_by_kind:

        def colour_of() -> tuple[str, str]:
            named = rng.choice(alone_by_kind)
            return ask(rng, "colour of", shape=named.shape), named.colour

        answers["colour of"] = colour_of
    if alone_by_colour:

        def shape_of() -> tuple[str, str]:
            named = rng.choice(alone_by_colour)
            return ask(rng, "shape of", colour=named.colour), named.shape

        answers["shape of"] = shape_of
    open_kinds = [kind for kind in kinds if kind in answers and kind != item.kind]
    chosen = rng.sample(open_kinds, min(count, len(open_kinds)))
    return [(kind, *answers[kind]()) for kind in chosen]
