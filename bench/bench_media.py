"""Media benchmark: 16 frames from a 60 s 1280x720 H.264 clip through the decoding worker,
against decoding every frame with PyAV, in the same run; 16 frames of a 60 s 4K clip, with the
frames sized in the worker against sent at full size; and loading a 12-megapixel JPEG.

    .venv/bin/python bench/bench_media.py

Targets: the 16-frame sample in under 0.5 s, the worker's overhead included; 16 frames of the
4K clip move less than 50 MB from the worker.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.media.loading import VideoDecoder, VideoLimits, load_image


def make_clip(
    path: Path, seconds: int = 60, fps: int = 30, size: tuple[int, int] = (1280, 720), noise: bool = False
) -> None:
    """Smooth gradients with light grain, panning (like camera footage); or, with `noise`,
    pure random pixels: the worst case for an H.264 decoder."""
    rng = np.random.default_rng(0)
    if noise:
        base = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    else:
        x = np.linspace(0, 4 * np.pi, size[0])[None, :, None]
        y = np.linspace(0, 2 * np.pi, size[1])[:, None, None]
        phase = np.array([0, 2, 4])[None, None, :]
        smooth = 127 + 100 * np.sin(x + phase) * np.cos(y)
        grain = rng.normal(0, 6, (size[1], size[0], 3))
        base = np.clip(smooth + grain, 0, 255).astype(np.uint8)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "g": str(fps * 2)}
        for i in range(seconds * fps):
            frame = np.roll(base, shift=4 * i, axis=1)  # motion, so frames differ
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def decode_all_with_pyav(path: Path) -> int:
    with av.open(str(path)) as container:
        return sum(1 for frame in container.decode(video=0) if frame.to_ndarray(format="rgb24") is not None)


def timed(function: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return times


def measure_4k(clip: Path) -> None:
    """The same 16 frames, sized in the worker (the app's limits) and at full size (no size
    limit), side by side: time and bytes through the pipe."""
    for label, limits in (
        ("sized in the worker", VideoLimits()),
        ("full size", VideoLimits(frame_max_side=10**6)),
    ):
        decoder = VideoDecoder(limits)
        try:
            clip_frames = decoder.decode(clip, num_frames=16).frames
            warm = statistics.median(timed(lambda d=decoder: d.decode(clip, num_frames=16), repeats=5))
        finally:
            decoder.close()
        height, width = clip_frames.shape[1:3]
        print(
            f"  16 frames, {label}: {width}x{height}, {clip_frames.nbytes / 1e6:.0f} MB through the pipe, "
            f"warm median of 5: {warm:.3f} s"
        )


def measure(clip: Path) -> tuple[float, float, float]:
    decoder = VideoDecoder()
    try:
        cold = timed(lambda: decoder.decode(clip, num_frames=16), repeats=1)[0]
        warm = statistics.median(timed(lambda: decoder.decode(clip, num_frames=16), repeats=5))
    finally:
        decoder.close()
    every = timed(lambda: decode_all_with_pyav(clip), repeats=1)[0]
    return cold, warm, every


def main() -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as folder:
        for label, noise in (("camera-like", False), ("random noise", True)):
            clip = Path(folder) / f"{label}.mp4"
            start = time.perf_counter()
            make_clip(clip, noise=noise)
            size_mb = clip.stat().st_size / 1e6
            print(
                f"\n{label} clip: 60 s 1280x720 30 fps H.264, {size_mb:.0f} MB, "
                f"made in {time.perf_counter() - start:.0f} s"
            )
            cold, warm, every = measure(clip)
            print(f"  16 frames through the worker, first call (starts the worker): {cold:.3f} s")
            print(f"  16 frames through the worker, warm, median of 5: {warm:.3f} s (target < 0.5 s)")
            print(
                f"  every frame (1800) with PyAV in the same run: {every:.3f} s "
                f"({every / warm:.1f}x the sample)"
            )

        clip = Path(folder) / "4k.mp4"
        start = time.perf_counter()
        make_clip(clip, size=(3840, 2160))
        print(
            f"\ncamera-like clip: 60 s 3840x2160 30 fps H.264, {clip.stat().st_size / 1e6:.0f} MB, "
            f"made in {time.perf_counter() - start:.0f} s"
        )
        measure_4k(clip)
        clip.unlink()

        photo = Path(folder) / "photo.jpg"
        rng = np.random.default_rng(1)
        Image.fromarray(rng.integers(0, 255, (3000, 4000, 3), dtype=np.uint8)).save(photo, quality=90)
        image = statistics.median(timed(lambda: load_image(photo), repeats=5))
        print(f"\n12 MP JPEG (4000x3000): load, EXIF, RGB, downscale to 2048 px, median of 5: {image:.3f} s")


if __name__ == "__main__":
    main()
