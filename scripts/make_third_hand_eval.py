"""Writes a third evaluation set of the seeing demo model into `tests/data/third-hand-shapes/`:
pictures drawn by a third hand, to choose between training runs without tuning them to the
foreign set (issue 29).

    .venv/bin/python scripts/make_third_hand_eval.py

It shares nothing with the training generator (`app.demo.shapes`: PIL's polygons) or the foreign
set (`scripts/make_foreign_eval.py`: OpenCV): every shape is rendered from its signed distance
field with numpy, pixel by pixel, with its own palette (shades from common design palettes), its
own pages (pastel tints, ruled paper, a soft vignette), squares with rounded corners, triangles
pointing up or down, turns to 20 degrees, and its own seed. Five kinds are asked, worded as the
foreign set's are, in the foreign set's `answers.json` format. The files are committed; run this
only to change them (then the figures in docs/BENCHMARKS.md are out of date).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "tests" / "data" / "third-hand-shapes"
SEED = 3_2026_11_30
KINDS = {"colour": 30, "shape": 30, "count": 30, "where": 20, "describe": 30}

# Shades from design palettes (Tableau, Material, Flat UI) that each name covers without doubt.
PALETTE: dict[str, list[tuple[int, int, int]]] = {
    "red": [(214, 39, 40), (244, 67, 54), (231, 76, 60), (192, 57, 43), (200, 16, 46)],
    "green": [(44, 160, 44), (76, 175, 80), (39, 174, 96), (46, 125, 50), (0, 128, 0)],
    "blue": [(31, 119, 180), (33, 150, 243), (41, 128, 185), (21, 101, 192), (13, 71, 161)],
    "yellow": [(255, 235, 59), (241, 196, 15), (255, 213, 0), (253, 216, 53), (250, 225, 40)],
    "black": [(0, 0, 0), (33, 33, 33), (38, 38, 38), (20, 24, 28)],
}
SHAPES = ("circle", "square", "triangle")
NUMBERS = {1: "one", 2: "two", 3: "three"}
WORDING = {
    "colour": ["What colour is it?", "what color is this", "Which colour?"],
    "shape": ["Which shape is that?", "What shape is this", "What is the shape?"],
    "count": ["How many things are in the picture?", "how many shapes are there", "How many shapes?"],
    "where": ["Where is the shape?", "where is it", "Where in the picture is it?"],
    "describe": ["Describe the picture.", "describe this image", "What is in the picture?"],
}
PHRASES = {"left": "on the left", "right": "on the right", "middle": "in the middle"}
PHRASES_ALONE = {**PHRASES, "top": "at the top", "bottom": "at the bottom"}
# Where a lone shape's centre is, in shares of the page (x range, y range), by place word.
PLACES = {
    "left": ((0.14, 0.28), (0.4, 0.6)),
    "right": ((0.72, 0.86), (0.4, 0.6)),
    "top": ((0.4, 0.6), (0.14, 0.28)),
    "bottom": ((0.4, 0.6), (0.72, 0.86)),
    "middle": ((0.47, 0.53), (0.47, 0.53)),
}


def page(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A light page: white, a pastel tint, ruled paper or a soft vignette; (height, width, 3)."""
    kind = rng.choice(["white", "tint", "ruled", "vignette"])
    canvas = np.full((height, width, 3), 255.0)
    if kind == "tint":
        canvas[:] = rng.choice([(232, 244, 253), (253, 237, 236), (245, 240, 225), (236, 246, 236)])
    elif kind == "ruled":
        canvas[:] = (250, 250, 246)
        gap = max(6, height // int(rng.integers(10, 20)))
        canvas[gap // 2 :: gap] = (205, 222, 240)
    elif kind == "vignette":
        ys, xs = np.mgrid[0:height, 0:width]
        far = np.hypot((xs - width / 2) / width, (ys - height / 2) / height) / 0.71
        canvas -= (far**2 * 40)[..., None]
    return canvas


def distance(
    shape: str, xs: np.ndarray, ys: np.ndarray, radius: float, turn: float, down: bool
) -> np.ndarray:
    """Signed distance to the shape's edge, positive inside; the shape centred at the origin."""
    c, s = math.cos(turn), math.sin(turn)
    u, v = xs * c + ys * s, -xs * s + ys * c
    if shape == "circle":
        return radius - np.hypot(u, v)
    if shape == "square":
        half, corner = radius * 0.85, radius * 0.85 * 0.12
        qx, qy = np.abs(u) - (half - corner), np.abs(v) - (half - corner)
        outside = np.hypot(np.maximum(qx, 0), np.maximum(qy, 0)) + np.minimum(np.maximum(qx, qy), 0)
        return corner - outside
    if down:
        v = -v
    corners = [(0.0, -radius), (radius * 0.87, radius * 0.5), (-radius * 0.87, radius * 0.5)]
    sides = []
    for (ax, ay), (bx, by) in zip(corners, corners[1:] + corners[:1], strict=True):
        length = math.hypot(bx - ax, by - ay)
        # Inside is to the right of each edge, going round clockwise on screen.
        sides.append(((bx - ax) * (v - ay) - (by - ay) * (u - ax)) / length)
    return np.minimum(np.minimum(sides[0], sides[1]), sides[2])


def paint(
    canvas: np.ndarray,
    rng: np.random.Generator,
    shape: str,
    x: float,
    y: float,
    radius: float,
    rgb: tuple[int, int, int],
) -> None:
    """One shape, filled or outlined, with smooth or hard edges, turned up to 20 degrees."""
    height, width = canvas.shape[:2]
    reach = int(radius * 1.3) + 4
    top, bottom = max(0, int(y) - reach), min(height, int(y) + reach)
    left, right = max(0, int(x) - reach), min(width, int(x) + reach)
    ys, xs = np.mgrid[top:bottom, left:right].astype(np.float64)
    turn = math.radians(rng.uniform(-20, 20)) if shape != "circle" else 0.0
    d = distance(shape, xs - x, ys - y, radius, turn, down=rng.random() < 0.25)
    if rng.random() < 0.3:
        stroke = max(2.0, radius * rng.uniform(0.12, 0.3))
        d = stroke / 2 - np.abs(d - stroke / 2)  # a band just inside the edge
    alpha = np.clip(d + 0.5, 0, 1) if rng.random() < 0.6 else (d >= 0).astype(np.float64)
    region = canvas[top:bottom, left:right]
    canvas[top:bottom, left:right] = region * (1 - alpha[..., None]) + np.array(rgb) * alpha[..., None]


def spots(
    rng: np.random.Generator, count: int, width: int, height: int, row: bool
) -> list[tuple[float, float, float]]:
    """(x, y, radius) for `count` shapes well apart; with `row`, left to right across the middle."""
    short = min(width, height)
    for _ in range(500):
        radius = [short * rng.uniform(0.1, {1: 0.35, 2: 0.2, 3: 0.15}[count]) for _ in range(count)]
        if row:
            # Clearly left, (middle,) right: as `shapes.description` would say them.
            slots = {2: [(0.18, 0.35), (0.65, 0.82)], 3: [(0.13, 0.25), (0.45, 0.55), (0.75, 0.87)]}[count]
            found = [
                (width * rng.uniform(*slot), height * rng.uniform(0.4, 0.6), r)
                for slot, r in zip(slots, radius, strict=True)
            ]
        else:
            found = [
                (rng.uniform(r * 1.2, width - r * 1.2), rng.uniform(r * 1.2, height - r * 1.2), r)
                for r in radius
            ]
        inside = all(
            r * 1.2 <= x <= width - r * 1.2 and r * 1.2 <= y <= height - r * 1.2 for x, y, r in found
        )
        apart = all(
            math.hypot(a[0] - b[0], a[1] - b[1]) > (a[2] + b[2]) * 1.5
            for i, a in enumerate(found)
            for b in found[i + 1 :]
        )
        if inside and apart:
            return found
    raise RuntimeError("no room")


def main() -> None:
    rng = np.random.default_rng(SEED)
    FOLDER.mkdir(parents=True, exist_ok=True)
    rows, number = [], 0
    for kind, how_many in KINDS.items():
        for _ in range(how_many):
            number += 1
            count = int(rng.integers(1, 4)) if kind in ("count", "describe") else 1
            row = kind == "describe" and count > 1
            long = int(rng.integers(96, 1400))
            short = max(64, int(long / rng.uniform(1.6 if row else 1.0, 2.5)))
            width, height = (long, short) if row or rng.random() < 0.6 else (short, long)
            canvas = page(rng, width, height)
            colours = list(rng.choice(list(PALETTE), count, replace=False))
            kinds = [str(rng.choice(SHAPES)) for _ in range(count)]
            if kind == "where" or (kind == "describe" and count == 1):
                where = str(rng.choice(list(PLACES)))
                (x0, x1), (y0, y1) = PLACES[where]
                radius = min(width, height) * rng.uniform(0.08, 0.13)
                found = [(width * rng.uniform(x0, x1), height * rng.uniform(y0, y1), radius)]
            else:
                found = spots(rng, count, width, height, row=row)
            for (x, y, radius), colour, shape in zip(found, colours, kinds, strict=True):
                shades = PALETTE[colour]
                paint(canvas, rng, shape, x, y, radius, shades[int(rng.integers(len(shades)))])
            if kind == "colour":
                answer = colours[0]
            elif kind == "shape":
                answer = kinds[0]
            elif kind == "count":
                answer = NUMBERS[count]
            elif kind == "where":
                answer = where
            else:
                words = {1: [where], 2: ["left", "right"], 3: ["left", "middle", "right"]}[count]
                phrases = [PHRASES_ALONE[w] for w in words]
                parts = [f"a {c} {s} {p}" for c, s, p in zip(colours, kinds, phrases, strict=True)]
                sentence = parts[0] if count == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
                answer = sentence[0].upper() + sentence[1:] + "."
            image = Image.fromarray(np.clip(canvas, 0, 255).round().astype(np.uint8), "RGB")
            name = f"{number:03d}-{kind}"
            if rng.random() < 0.35:
                name += ".jpg"
                image.save(FOLDER / name, "JPEG", quality=int(rng.integers(50, 96)))
            else:
                name += ".png"
                image.save(FOLDER / name)
            question = str(rng.choice(WORDING[kind]))
            rows.append({"file": name, "kind": kind, "question": question, "answer": answer})
    (FOLDER / "answers.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{len(rows)} pictures in {FOLDER.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
