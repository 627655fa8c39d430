"""Video files made by the tests (nothing downloaded), shared by the media and engine tests."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np


def write_video(
    path: Path,
    seconds: float = 2.0,
    fps: int = 10,
    size: tuple[int, int] = (64, 48),
    pts_ms: list[int] | None = None,
    keyframe_every: int = 1,
) -> Path:
    """An H.264 clip whose frame i is flat grey at level 10 * i, so sampled frames identify
    themselves. With `pts_ms`, frames get those timestamps (a variable frame rate)."""
    from fractions import Fraction

    count = len(pts_ms) if pts_ms else round(seconds * fps)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {
            "crf": "1",
            "g": str(keyframe_every),
            "keyint_min": str(keyframe_every),
            "sc_threshold": "0",
            "bf": "0",
        }
        if pts_ms:
            stream.codec_context.time_base = Fraction(1, 1000)
        for i in range(count):
            level = (10 * i) % 250
            frame = av.VideoFrame.from_ndarray(
                np.full((size[1], size[0], 3), level, np.uint8), format="rgb24"
            )
            if pts_ms:
                frame.pts, frame.time_base = pts_ms[i], Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
