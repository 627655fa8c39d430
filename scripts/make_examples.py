"""Writes the UI's example inputs into `static/examples/`: drawn here, so the project owns them.

    .venv/bin/python scripts/make_examples.py

The files are committed; run this only to change them. They are dedicated to the public domain
(CC0 1.0), as `static/README.md` says.
"""

from __future__ import annotations

import random
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.demo.shapes import Drawn, clip, picture  # noqa: E402

EXAMPLES = ROOT / "static" / "examples"


def shapes(path: Path) -> None:
    """A red circle, a blue square and a green triangle on a light background."""
    image = Image.new("RGB", (480, 320), (245, 242, 235))
    draw = ImageDraw.Draw(image)
    draw.ellipse((40, 90, 180, 230), fill=(215, 40, 40))
    draw.rectangle((190, 90, 320, 220), fill=(40, 80, 200))
    draw.polygon([(330, 230), (400, 90), (460, 230)], fill=(40, 160, 70))
    image.save(path, optimize=True)


def bar_chart(path: Path) -> None:
    """Four labelled bars, for reading values and comparing them."""
    image = Image.new("RGB", (480, 320), "white")
    draw = ImageDraw.Draw(image)
    draw.line((50, 280, 450, 280), fill="black", width=2)
    draw.line((50, 280, 50, 30), fill="black", width=2)
    for i, (label, value) in enumerate([("Mon", 120), ("Tue", 200), ("Wed", 90), ("Thu", 240)]):
        left = 80 + i * 95
        draw.rectangle((left, 280 - value, left + 60, 279), fill=(70 + 40 * i, 120, 200 - 30 * i))
        draw.text((left + 18, 288), label, fill="black")
        draw.text((left + 18, 262 - value), str(value), fill="black")
    draw.text((170, 8), "Visitors per day", fill="black")
    image.save(path, optimize=True)


def bouncing_ball(path: Path, seconds: int = 4, fps: int = 12) -> None:
    """A ball bouncing left to right across a floor: motion a model can describe."""
    width, height = 320, 240
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "28", "g": str(fps)}
        stream.codec_context.time_base = Fraction(1, fps)
        for i in range(seconds * fps):
            image = Image.new("RGB", (width, height), (200, 225, 245))
            draw = ImageDraw.Draw(image)
            draw.rectangle((0, 200, width, height), fill=(120, 90, 60))
            x = 20 + (width - 60) * i / (seconds * fps - 1)
            y = 170 - abs(np.sin(i / fps * np.pi * 1.5)) * 120
            draw.ellipse((x, y, x + 30, y + 30), fill=(230, 120, 20))
            frame = av.VideoFrame.from_ndarray(np.asarray(image), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def seeing_examples(folder: Path) -> None:
    """Pictures and a clip the seeing demo model (`app.demo.seeing_model`) answers about: drawn as it
    was trained to see (`app.demo.shapes`), at sizes it never saw."""
    rng = random.Random(5)  # noqa: S311 (drawing, seeded to be reproducible)
    picture(rng, [Drawn("blue", "triangle", "right")], (240, 160)).save(folder / "one_shape.png")
    three = [Drawn(c, s, "left") for c, s in [("red", "circle"), ("yellow", "square"), ("black", "triangle")]]
    picture(rng, three, (300, 120)).save(folder / "three_shapes.png")
    picture(rng, [Drawn("green", "square", "left")], (200, 200)).save(folder / "green_square.png")
    frames = clip(rng, "yellow", "red")
    with av.open(str(folder / "colour_change.mp4"), mode="w") as container:
        stream = container.add_stream("libx264", rate=2)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def main() -> None:
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    shapes(EXAMPLES / "shapes.png")
    bar_chart(EXAMPLES / "bar_chart.png")
    bouncing_ball(EXAMPLES / "bouncing_ball.mp4")
    seeing_examples(EXAMPLES)


if __name__ == "__main__":
    main()
