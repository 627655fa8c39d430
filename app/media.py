"""Turning uploaded files into what the models take, safely.

Images are opened with Pillow from an allow-list of formats, their size checked from the header
before any pixel is decoded, EXIF orientation applied, converted to RGB and downscaled to a cap.
Every refusal is a `MediaError` whose message a user can act on: never a traceback, a path or a
memory address.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
HASH_KEY = "content_hash"


class MediaError(ValueError):
    """A file the app refuses; the message is meant for the user."""


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 30 * 1024 * 1024
    # Checked from the header, before decoding: a decompression bomb is refused unread.
    max_pixels: int = 40_000_000
    # Longest side after loading; larger images are downscaled (vLLM's processors resize again).
    max_side: int = 2048


def load_image(path: str | Path, limits: ImageLimits | None = None) -> Image.Image:
    """An RGB image ready for a model, with its content hash in `image.info["content_hash"]`."""
    limits = limits or ImageLimits()
    size = _file_size(path)
    if size > limits.max_bytes:
        raise MediaError(
            f"This image file is {size / 2**20:.0f} MB; the limit is {limits.max_bytes / 2**20:.0f} MB."
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path, formats=IMAGE_FORMATS) as opened:
                _check_pixels(opened.size, limits)
                opened.seek(0)  # the first frame of an animation
                opened.load()
                image = _upright(opened)
                image = to_rgb(image)
    except MediaError:
        raise
    except UnidentifiedImageError:
        raise MediaError(
            "This file is not an image the app can read: send a JPEG, PNG, WebP, GIF or BMP."
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        # Pillow refuses far-oversized headers inside open(), before our own check can run.
        declared = re.search(r"\((\d+) pixels\)", str(error))
        size = f" ({int(declared.group(1)) / 1e6:.0f} megapixels)" if declared else ""
        raise MediaError(
            f"This image is too large to open safely{size}; the limit is "
            f"{limits.max_pixels / 1e6:.0f} megapixels."
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError):
        raise MediaError("This image file is damaged or incomplete: it could not be decoded.") from None
    image = downscale(image, limits.max_side)
    image.info[HASH_KEY] = content_hash(image)
    return image


def _file_size(path: str | Path) -> int:
    try:
        size = os.path.getsize(path)
    except OSError:
        raise MediaError("The uploaded file could not be read.") from None
    if size == 0:
        raise MediaError("The uploaded file is empty.")
    return size


def _check_pixels(size: tuple[int, int], limits: ImageLimits) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise MediaError("This image has no pixels.")
    if width * height > limits.max_pixels:
        raise MediaError(
            f"This image is {width} x {height} pixels ({width * height / 1e6:.0f} megapixels); "
            f"the limit is {limits.max_pixels / 1e6:.0f} megapixels."
        )


def _upright(image: Image.Image) -> Image.Image:
    """Applies the EXIF orientation; a broken EXIF block leaves the image as stored."""
    try:
        return ImageOps.exif_transpose(image)
    except Exception:  # any EXIF parsing failure means "no usable orientation"
        return image.copy()


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB whatever the mode: CMYK, 16-bit and float greys, palettes, transparency."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or values.max(initial=0) > 255 else 255.0
        grey = np.clip(values / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(grey).convert("RGB")
    if (image.mode == "P" and "transparency" in image.info) or image.mode in (
        "RGBA",
        "LA",
        "PA",
        "RGBa",
        "La",
    ):
        rgba = image.convert("RGBA")
        # Transparent areas become white, as most viewers show them on a page.
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def downscale(image: Image.Image, max_side: int) -> Image.Image:
    width, height = image.size
    longest = max(width, height)
    if longest <= max_side:
        return image
    scale = max_side / longest
    new_size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return image.resize(new_size, Image.Resampling.LANCZOS)


def content_hash(image: Image.Image) -> str:
    """Identifies the pixels a model sees, so a repeated image hits vLLM's caches."""
    digest = hashlib.sha256(f"{image.mode}:{image.size}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()
