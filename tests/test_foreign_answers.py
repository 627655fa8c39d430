"""The foreign set's answer key (`tests/data/foreign-shapes/answers.json`) agrees with its pixels.

`scripts/make_foreign_eval.py` draws the pictures with OpenCV and writes each answer from the
numbers it drew with; the model's accuracy on this set (`app.demo.seeing_check`) is only as true
as that key, and nothing else reads the pictures back. So a third hand reads them here, with
plain numpy and PIL and no model: the page's colour from its top and bottom rows, the
foreground as the pixels far from it, the shapes as its connected pieces (outlines filled,
specks dropped), and each shape's colour, box, area and kind of outline from its pixels. Each
kind of question then has its answer checked against what was read.
"""

from __future__ import annotations

import ast
import colorsys
import json
import re
from dataclasses import dataclass
from functools import cache
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "tests" / "data" / "foreign-shapes"
ROWS: list[dict[str, str]] = json.loads((FOLDER / "answers.json").read_text())
NUMBERS = ("none", "one", "two", "three")


def script_constant(name: str) -> Any:
    """A literal from the script that drew the set (parsed, not imported: it needs OpenCV)."""
    tree = ast.parse((ROOT / "scripts" / "make_foreign_eval.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return ast.literal_eval(node.value)
    raise LookupError(name)


# The script's shades by name, and its places for a lone shape: (x, y) ranges of the centre.
PALETTE: dict[str, list[tuple[int, int, int]]] = script_constant("PALETTE")
PLACES: dict[str, tuple[tuple[float, float], tuple[float, float]]] = script_constant("PLACES")
LABEL = re.compile(rf"\b({'|'.join(PALETTE)}) (circle|square|triangle)\b")

# A pixel is foreground when a channel is this far from the page: the faintest shape on its
# page (dark green on slate) differs by about 100, paper grain and JPEG noise by far less.
FOREGROUND = 60
# JPEGs over twice this long side are decoded at half size (JPEG's own reduced decoding).
DECODE = 800


@dataclass(frozen=True)
class Piece:
    """One shape read from the pixels: its filled area and box (left, top, right, bottom in
    pixels, right and bottom exclusive), its colour's name and its outline's kind."""

    area: int
    box: tuple[int, int, int, int]
    colour: str
    shape: str

    @property
    def centre(self) -> tuple[float, float]:
        left, top, right, bottom = self.box
        return (left + right) / 2, (top + bottom) / 2


@dataclass(frozen=True)
class Reading:
    """A picture's size, its page's name and its shapes, left to right."""

    width: int
    height: int
    page: str
    pieces: list[Piece]


def colour_name(rgb: np.ndarray) -> str:
    """The palette's name of a colour: black when dark, else the band its hue falls in. The
    script's shades (crimson, navy, sea green, gold...) sit well inside these bands."""
    hue, _, value = colorsys.rgb_to_hsv(*(float(c) / 255 for c in rgb))
    if value < 0.33:
        return "black"
    degrees = hue * 360 - 360 * (hue > 0.9)
    bands = {"red": (-30, 25), "yellow": (35, 75), "green": (85, 170), "blue": (185, 265)}
    return next((n for n, (low, high) in bands.items() if low <= degrees <= high), f"hue {degrees:.0f}")


def page_name(rgb: np.ndarray) -> str:
    """The background's word: the script's slate pages are under 60, its grey ones 140 to 200,
    its white ones (white, cream, the light fades) over 228."""
    light = float(np.mean(rgb))
    return "black" if light < 100 else "grey" if light < 215 else "white"


def shape_name(solid: np.ndarray) -> str:
    """An outline's kind from its filled pixels: the area over the square of the reach (from
    the centroid to the farthest pixel), which turning does not change. In theory a circle's is
    pi, a square's 2 (2.2 outlined thickly, its corners rounded), the script's triangle's 1.2
    (1.55 outlined). Over all 529 shapes of the set: circles 2.56 to 3.13 (the lowest a ring the
    page's edge clips), squares 1.97 to 2.37, triangles 1.24 to 1.84 (the highest small and
    thickly outlined, a dozen pixels across); the kinds that name shapes stay within 1.74,
    1.98 to 2.33 and 2.64."""
    ys, xs = np.nonzero(solid)
    reach = np.sqrt((xs - xs.mean()) ** 2 + (ys - ys.mean()) ** 2).max() + 0.5  # a pixel's half
    ratio = len(xs) / reach**2
    return "triangle" if ratio < 1.9 else "square" if ratio < 2.46 else "circle"


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's runs of True as (row, start, end) arrays, row by row, left to right."""
    padded = np.zeros((mask.shape[0], mask.shape[1] + 2), np.int8)
    padded[:, 1:-1] = mask
    steps = np.diff(padded, axis=1)
    rows, starts = np.nonzero(steps == 1)
    return rows, starts, np.nonzero(steps == -1)[1]


def components(rows: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A component's number (0, 1...) for each run; runs overlapping on next rows are joined
    (4-connected). Union-find over runs: a few thousand per picture, so plain Python is fast."""
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first = np.searchsorted(rows, np.arange(int(rows.max(initial=0)) + 2)).tolist()
    for row in range(len(first) - 2):
        i, i_stop, j, j_stop = first[row], first[row + 1], first[row + 1], first[row + 2]
        while i < i_stop and j < j_stop:
            if starts[i] < ends[j] and starts[j] < ends[i]:
                parent[root(i)] = root(j)
            if ends[i] < ends[j]:
                i += 1
            else:
                j += 1
    return np.unique([root(i) for i in range(len(rows))], return_inverse=True)[1].reshape(-1)


def opened(solid: np.ndarray) -> np.ndarray:
    """`solid` opened by a 3x3 square: JPEG's one- and two-pixel spurs, which would stretch the
    reach, cut off; a shape's body (and a square's corners) kept."""
    height, width = solid.shape
    padded = np.pad(solid, 1)
    eroded = np.ones_like(solid)
    for dy in range(3):
        for dx in range(3):
            eroded &= padded[dy : dy + height, dx : dx + width]
    padded = np.pad(eroded, 1)
    grown = np.zeros_like(solid)
    for dy in range(3):
        for dx in range(3):
            grown |= padded[dy : dy + height, dx : dx + width]
    return grown


def load(path: Path) -> np.ndarray:
    """A picture's RGB pixels (as int16, for differences)."""
    with Image.open(path) as image:
        if image.format == "JPEG" and max(image.size) > 2 * DECODE:
            image.draft("RGB", (image.width // 2, image.height // 2))
        return np.asarray(image.convert("RGB"), np.int16)


@cache
def read(file: str) -> Reading:
    """What a picture of the set shows."""
    return read_pixels(load(FOLDER / file))


def read_pixels(pixels: np.ndarray) -> Reading:
    """What RGB pixels show: the page's name and the shapes on it."""
    height, width, _ = pixels.shape
    # The script keeps shapes off the top and bottom rows and fades a page linearly from top to
    # bottom if at all, so the page is those rows' medians blended (grain and shapes ignored).
    top, bottom = np.median(pixels[:2].reshape(-1, 3), 0), np.median(pixels[-2:].reshape(-1, 3), 0)
    page = top * (1 - np.linspace(0, 1, height)[:, None]) + bottom * np.linspace(0, 1, height)[:, None]
    mask = np.abs(pixels - page[:, None]).max(axis=2) > FOREGROUND
    rows, starts, ends = runs(mask)
    label = components(rows, starts, ends)
    # An outlined shape's inside is page: the page's pieces that do not reach the picture's edge
    # are filled into the shape whose run ends where theirs starts.
    hole_rows, hole_starts, hole_ends = runs(~mask)
    hole_label = components(hole_rows, hole_starts, hole_ends)
    edge = (hole_rows == 0) | (hole_rows == height - 1) | (hole_starts == 0) | (hole_ends == width)
    open_holes = set(hole_label[edge].tolist())
    run_ending = {(r, e): k for r, e, k in zip(rows.tolist(), ends.tolist(), label.tolist(), strict=True)}
    owner = {
        h: run_ending.get((r, s))
        for r, s, h in zip(hole_rows.tolist(), hole_starts.tolist(), hole_label.tolist(), strict=True)
        if h not in open_holes
    }
    hole_owner = np.array([owner.get(h, -1) for h in hole_label.tolist()], np.int64)

    short = min(width, height)
    pieces = []
    for k in range(int(label.max(initial=-1)) + 1):
        own, filled = label == k, hole_owner == k
        left, top_row = int(starts[own].min()), int(rows[own].min())
        right, bottom_row = int(ends[own].max()), int(rows[own].max()) + 1
        solid = np.zeros((bottom_row - top_row, right - left), bool)
        for r, s, e in zip(
            np.concatenate([rows[own], hole_rows[filled]]).tolist(),
            np.concatenate([starts[own], hole_starts[filled]]).tolist(),
            np.concatenate([ends[own], hole_ends[filled]]).tolist(),
            strict=True,
        ):
            solid[r - top_row, s - left : e - left] = True
        solid = opened(solid)
        # Specks (JPEG ringing, grain) are far smaller than the smallest shape drawn.
        if solid.sum() < max(12, 0.0015 * short * short):
            continue
        # The colour: the median of the shape's own pixels farthest from the page (not its
        # anti-aliased or JPEG-blurred edge, which is part page).
        own_rows, own_starts, own_ends = rows[own].tolist(), starts[own].tolist(), ends[own].tolist()
        own_pixels = np.concatenate(
            [pixels[r, s:e] for r, s, e in zip(own_rows, own_starts, own_ends, strict=True)]
        )
        own_page = np.repeat(page[own_rows], np.subtract(own_ends, own_starts), axis=0)
        distance = np.abs(own_pixels - own_page).max(axis=1)
        core = own_pixels[distance >= np.median(distance)]
        colour = colour_name(np.median(core, 0))
        pieces.append(Piece(int(solid.sum()), (left, top_row, right, bottom_row), colour, shape_name(solid)))
    pieces.sort(key=lambda p: p.centre[0])
    return Reading(width, height, page_name((top + bottom) / 2), pieces)


def rows_of(kind: str) -> list[Any]:
    """The set's rows of one kind, each a test case named by its file."""
    return [pytest.param(row, id=row["file"]) for row in ROWS if row["kind"] == kind]


def lone(row: dict[str, str]) -> tuple[Reading, Piece]:
    """The picture of a question about one shape, and that shape."""
    reading = read(row["file"])
    count = len(reading.pieces)
    assert count == 1, f"{row['file']}: {count} shapes read, the question is about one"
    return reading, reading.pieces[0]


def said(row: dict[str, str], read_as: object) -> str:
    """An assertion's message: the file, its key's answer and what its pixels showed."""
    return f"{row['file']}: the key says {row['answer']!r}, the pixels {read_as}"


@pytest.mark.parametrize("row", rows_of("count"))
def test_count(row: dict[str, str]) -> None:
    pieces = read(row["file"]).pieces
    assert len(pieces) == NUMBERS.index(row["answer"]), said(row, pieces)


@pytest.mark.parametrize("row", rows_of("colour"))
def test_colour(row: dict[str, str]) -> None:
    _, piece = lone(row)
    assert piece.colour == row["answer"], said(row, piece)


@pytest.mark.parametrize("row", rows_of("shape"))
def test_shape(row: dict[str, str]) -> None:
    _, piece = lone(row)
    assert piece.shape == row["answer"], said(row, piece)


@pytest.mark.parametrize("row", rows_of("side"))
def test_side(row: dict[str, str]) -> None:
    # The script puts a lone shape's centre in the page's left or right 38%; a little slack for
    # a turned triangle, whose box's centre is not its drawing centre.
    reading, piece = lone(row)
    share = piece.centre[0] / reading.width
    side = "left" if share < 0.45 else "right" if share > 0.55 else "neither side"
    assert side == row["answer"], said(row, f"{piece} at {share:.2f} of the width")


@pytest.mark.parametrize("row", rows_of("where"))
def test_where(row: dict[str, str]) -> None:
    # The script's rule: the centre lies in the place's ranges (PLACES); the nearest place's, here,
    # within 3% of the page (the box's centre is a triangle's drawing centre only nearly).
    reading, piece = lone(row)
    x, y = piece.centre[0] / reading.width, piece.centre[1] / reading.height

    def off(place: str) -> float:
        (x_low, x_high), (y_low, y_high) = PLACES[place]
        return max(x_low - x, x - x_high, y_low - y, y - y_high, 0.0)

    nearest = min(PLACES, key=off)
    assert nearest == row["answer"] and off(nearest) < 0.03, said(row, f"{nearest} at ({x:.2f}, {y:.2f})")


@pytest.mark.parametrize("row", rows_of("bigger"))
def test_bigger(row: dict[str, str]) -> None:
    # The script makes the bigger shape's area at least twice the other's, by its formula; a
    # smaller outlined shape's stroke reaches past that, so the areas read differ by 1.65 or more.
    pieces = read(row["file"]).pieces
    assert len(pieces) == 2, said(row, pieces)
    small, big = sorted(pieces, key=lambda p: p.area)
    assert big.area > 1.3 * small.area, said(row, f"areas too alike: {pieces}")
    assert f"the {big.colour} {big.shape}" == row["answer"], said(row, f"the bigger {big}")


@pytest.mark.parametrize("row", rows_of("colour count"))
def test_colour_count(row: dict[str, str]) -> None:
    asked = re.findall("|".join(PALETTE), row["question"])
    assert len(asked) == 1, f"{row['file']}: no one colour in {row['question']!r}"
    pieces = read(row["file"]).pieces
    assert sum(p.colour == asked[0] for p in pieces) == NUMBERS.index(row["answer"]), said(row, pieces)


@pytest.mark.parametrize("row", rows_of("colour of") + rows_of("shape of"))
def test_a_shape_named_by_its_kind_or_colour(row: dict[str, str]) -> None:
    # The shape asked about is the only one of its kind ("What colour is the square?") or of its
    # colour ("What shape is the red one?"); the answer is its colour or its kind.
    by_kind = row["kind"] == "colour of"
    asked = re.findall("circle|square|triangle" if by_kind else "|".join(PALETTE), row["question"])
    pieces = read(row["file"]).pieces
    named = [p for p in pieces if [p.shape if by_kind else p.colour] == asked]
    assert len(named) == 1, said(row, pieces)
    assert (named[0].colour if by_kind else named[0].shape) == row["answer"], said(row, pieces)


@pytest.mark.parametrize("row", rows_of("background"))
def test_background(row: dict[str, str]) -> None:
    reading = read(row["file"])
    assert reading.page == row["answer"], said(row, reading.page)


@pytest.mark.parametrize("row", rows_of("describe"))
def test_describe(row: dict[str, str]) -> None:
    # "A red square on the left, a ... in the middle and a ... on the right.": the shapes left to
    # right, each in its own third (or half) of the page, the one shape of a picture in the middle.
    reading = read(row["file"])
    named = LABEL.findall(row["answer"])
    pieces = [(p.colour, p.shape) for p in reading.pieces]
    assert pieces == named, said(row, reading.pieces)
    places = re.findall(r"\b(left|middle|right)\b", row["answer"])
    words = {1: ["middle"], 2: ["left", "right"], 3: ["left", "middle", "right"]}[len(named)]
    assert places == words, f"{row['file']}: places {places} for {len(named)} shapes"
    slots = [int(p.centre[0] / reading.width * len(named)) for p in reading.pieces]
    assert slots == list(range(len(named))), said(row, f"shapes in slots {slots} of {len(named)}")


@pytest.mark.parametrize("row", rows_of("box"))
def test_box(row: dict[str, str]) -> None:
    # The answer's box is on a 0..1000 scale of the page (Qwen's): the drawn edges plus half an
    # outline's stroke. Pixels are whole and anti-aliasing and JPEG blur add one or two, so the
    # pixels' box agrees within 3 pixels on each edge (the set's worst is 2.4).
    (answer,) = json.loads(row["answer"])
    reading = read(row["file"])
    named = [p for p in reading.pieces if f"{p.colour} {p.shape}" == answer["label"]]
    assert len(named) == 1, said(row, reading.pieces)
    sides = (reading.width, reading.height) * 2
    key = [v * side / 1000 for v, side in zip(answer["bbox_2d"], sides, strict=True)]
    errors = [round(a - b, 1) for a, b in zip(named[0].box, key, strict=True)]
    assert max(map(abs, errors)) <= 3, said(row, f"{named[0]}, off by {errors} pixels")


def test_reader_on_a_drawing_of_its_own() -> None:
    """The reader itself, on shapes PIL draws (another hand again) and a rough JPEG keeps: an
    outlined square, a filled circle and a turned triangle on a grey page fading downwards."""
    page = np.linspace(150, 205, 240)[:, None, None] * np.ones((240, 360, 3))
    image = Image.fromarray(page.astype(np.uint8))
    pen = ImageDraw.Draw(image)
    pen.rectangle((30, 70, 110, 150), outline=(0, 0, 205), width=9)
    pen.ellipse((140, 30, 200, 90), fill=(255, 215, 0))
    pen.polygon([(290, 120), (340, 200), (235, 190)], fill=(34, 139, 34))
    jpeg = BytesIO()
    image.save(jpeg, "JPEG", quality=45)
    reading = read_pixels(np.asarray(Image.open(jpeg).convert("RGB"), np.int16))
    assert reading.page == "grey"
    read_as = [(p.colour, p.shape) for p in reading.pieces]
    assert read_as == [("blue", "square"), ("yellow", "circle"), ("green", "triangle")], reading.pieces
    square = reading.pieces[0]
    assert all(abs(a - b) <= 2 for a, b in zip(square.box, (30, 70, 111, 151), strict=True)), square


def test_colour_names_cover_the_palette() -> None:
    """Each of the script's shades is named as the script names it."""
    for name, shades in PALETTE.items():
        for shade in shades:
            assert colour_name(np.array(shade)) == name, (name, shade)
