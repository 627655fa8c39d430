"""Faults that real files cause unpredictably, for the decoding worker's tests: a decoder that
crashes, hangs, or refuses a file that the next backend reads. `decode` is a `VideoDecoder`'s
worker function that acts on the clip's file name (crash.mp4, hang.mp4, decord-fails.mp4) and
decodes every other clip as the app does. Importable by the worker process (spawned)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from app.media.loading import SAMPLERS, VideoClip, VideoLimits, decode_video


def refusing(*_: Any) -> Any:
    raise RuntimeError("decord refused the file")


def decode(path: str, num_frames: int | None, fps: float | None, limits: VideoLimits) -> VideoClip:
    name = Path(path).stem
    if name == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if name == "hang":
        time.sleep(3600)
    if name == "decord-fails":
        samplers = {"decord": refusing, "opencv": SAMPLERS["opencv"]}
        return decode_video(path, num_frames, fps, limits, samplers)
    return decode_video(path, num_frames, fps, limits)


def faulty(clip: Path, fault: str) -> Path:
    """A copy of `clip` named for the fault `decode` plays on it."""
    copy = clip.with_name(f"{fault}.mp4")
    copy.write_bytes(clip.read_bytes())
    return copy
