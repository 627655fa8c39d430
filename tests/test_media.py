"""The media pipeline on real files written by the tests: good ones load right, bad ones are
refused with a message a user can act on, never a traceback or a path."""

from __future__ import annotations

import io
import os
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.media.loading import HASH_KEY, ImageLimits, MediaError, load_image


def save(image: Image.Image, path: Path, **params) -> Path:
    image.save(path, **params)
    return path


def gradient(width: int, height: int) -> Image.Image:
    x = np.linspace(0, 255, width, dtype=np.uint8)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height, dtype=np.uint8)[:, None].repeat(width, 1)
    return Image.fromarray(np.stack([x, y, 255 - x], axis=-1))


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def assert_clean_refusal(error: pytest.ExceptionInfo, path: Path) -> None:
    message = str(error.value)
    assert message and str(path) not in message and path.name not in message
    assert "Traceback" not in message and not re.search(r"0x[0-9a-f]{6,}", message)


# --- good images ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF", "BMP"])
def test_allowed_formats_load_as_rgb(tmp_path: Path, fmt: str):
    path = save(gradient(64, 48), tmp_path / f"pic.{fmt.lower()}", format=fmt)
    image = load_image(path)
    assert image.mode == "RGB" and image.size == (64, 48)


def test_exif_orientation_is_applied(tmp_path: Path):
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, shown rotated 90 degrees clockwise
    path = save(gradient(40, 20), tmp_path / "rotated.jpg", exif=exif.tobytes())
    assert load_image(path).size == (20, 40)


def test_broken_exif_orientation_leaves_the_image_as_stored(tmp_path: Path):
    exif = Image.Exif()
    exif[0x0112] = 42  # not an orientation
    path = save(gradient(40, 20), tmp_path / "odd.jpg", exif=exif.tobytes())
    assert load_image(path).size == (40, 20)
    garbage = tmp_path / "garbage-exif.jpg"
    data = (tmp_path / "odd.jpg").read_bytes()
    garbage.write_bytes(data.replace(b"Exif\x00\x00", b"Exif\x00\x00\xff\xff\xff\xff", 1))
    assert load_image(garbage).size == (40, 20)


def test_cmyk_sixteen_bit_palette_and_transparency_become_rgb(tmp_path: Path):
    cmyk = load_image(save(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), tmp_path / "cmyk.jpg"))
    assert cmyk.mode == "RGB" and cmyk.getpixel((4, 4))[0] > 200 and cmyk.getpixel((4, 4))[1] < 60

    deep = Image.fromarray(np.full((8, 8), 65535 // 2, dtype=np.uint16))
    sixteen = load_image(save(deep, tmp_path / "deep.png"))
    assert sixteen.mode == "RGB" and 120 <= sixteen.getpixel((0, 0))[0] <= 135

    palette = gradient(16, 16).convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    assert load_image(save(palette, tmp_path / "palette.png")).mode == "RGB"

    clear = Image.new("RGBA", (8, 8), (255, 0, 0, 0))
    clear.putpixel((0, 0), (255, 0, 0, 255))
    rgba = load_image(save(clear, tmp_path / "rgba.png"))
    assert rgba.getpixel((0, 0)) == (255, 0, 0) and rgba.getpixel((5, 5)) == (255, 255, 255)


def test_animated_gif_gives_its_first_frame(tmp_path: Path):
    frames = [Image.new("RGB", (16, 16), (i * 2, 0, 0)) for i in range(120)]
    frames[0] = Image.new("RGB", (16, 16), (0, 200, 0))
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=20, loop=0)
    image = load_image(path)
    red, green, _ = image.getpixel((8, 8))
    assert image.size == (16, 16) and green > 150 and red < 50


@pytest.mark.parametrize("size", [(1, 1), (1, 4000), (4000, 1)])
def test_extreme_shapes_load_with_their_shape(tmp_path: Path, size: tuple[int, int]):
    image = load_image(save(Image.new("RGB", size, "white"), tmp_path / "thin.png"))
    expected = tuple(max(1, round(side * min(1, 2048 / max(size)))) for side in size)
    assert image.size == expected


def test_large_images_are_downscaled_to_the_cap(tmp_path: Path):
    path = save(gradient(3000, 1000), tmp_path / "wide.jpg", quality=90)
    assert load_image(path).size == (2048, 683)
    assert load_image(path, ImageLimits(max_side=300)).size == (300, 100)


def test_content_hash_identifies_the_pixels(tmp_path: Path):
    a = load_image(save(gradient(32, 32), tmp_path / "a.png"))
    again = load_image(save(gradient(32, 32), tmp_path / "same-pixels.bmp", format="BMP"))
    other = gradient(32, 32)
    other.putpixel((0, 0), (1, 2, 3))
    b = load_image(save(other, tmp_path / "b.png"))
    assert a.info[HASH_KEY] == again.info[HASH_KEY] != b.info[HASH_KEY]
    assert re.fullmatch(r"[0-9a-f]{64}", a.info[HASH_KEY])


# --- refusals --------------------------------------------------------------------------------

SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>'


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jpg", b"", "empty"),
        ("notes.jpg", b"just some text, honestly\n" * 10, "not an image"),
        ("page.jpg", b"<!doctype html><html><body>hi</body></html>", "not an image"),
        ("drawing.jpg", SVG, "not an image"),
    ],
)
def test_non_images_are_refused(tmp_path: Path, name: str, content: bytes, message: str):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(MediaError, match=message) as error:
        load_image(path)
    assert_clean_refusal(error, path)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_images_are_refused(tmp_path: Path, fmt: str):
    buffer = io.BytesIO()
    gradient(256, 256).save(buffer, format=fmt)
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    with pytest.raises(MediaError, match="damaged or incomplete") as error:
        load_image(path)
    assert_clean_refusal(error, path)


def test_a_small_png_declaring_fifty_thousand_squared_pixels_is_refused_unread(tmp_path: Path):
    header = struct.pack(">IIBBBBB", 50_000, 50_000, 8, 2, 0, 0, 0)
    row_data = zlib.compress(b"\x00" * 1000)
    path = tmp_path / "bomb.png"
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", row_data)
        + png_chunk(b"IEND", b"")
    )
    assert path.stat().st_size < 2000
    with pytest.raises(MediaError, match=r"2500 megapixels.*limit is 40 megapixels") as error:
        load_image(path)
    assert_clean_refusal(error, path)


def test_an_image_just_over_the_pixel_cap_is_refused(tmp_path: Path):
    limits = ImageLimits(max_pixels=10_000)
    assert load_image(save(gradient(100, 100), tmp_path / "at.png"), limits).size == (100, 100)
    with pytest.raises(MediaError, match="101 x 100 pixels"):
        load_image(save(gradient(101, 100), tmp_path / "over.png"), limits)


def test_files_over_the_size_limit_are_refused_before_opening(tmp_path: Path):
    path = save(gradient(200, 200), tmp_path / "big.bmp", format="BMP")
    with pytest.raises(MediaError, match="the limit is 0 MB"):
        load_image(path, ImageLimits(max_bytes=1000))


def psd_bytes(width: int, height: int) -> bytes:
    header = b"8BPS" + struct.pack(">H6xHIIHH", 1, 3, height, width, 8, 3)
    sections = struct.pack(">III", 0, 0, 0)
    return header + sections + struct.pack(">H", 0) + b"\x80" * (3 * width * height)


def test_tiff_and_psd_are_refused(tmp_path: Path):
    tiff = save(gradient(16, 16), tmp_path / "scan.tiff", format="TIFF")
    psd = tmp_path / "layers.psd"
    psd.write_bytes(psd_bytes(16, 16))
    assert Image.open(psd).format == "PSD"  # a real PSD that Pillow could read
    for path in (tiff, psd):
        with pytest.raises(MediaError, match="JPEG, PNG, WebP, GIF or BMP") as error:
            load_image(path)
        assert_clean_refusal(error, path)


def test_a_missing_file_is_refused_without_its_path(tmp_path: Path):
    path = tmp_path / "gone.png"
    with pytest.raises(MediaError, match="could not be read") as error:
        load_image(path)
    assert_clean_refusal(error, path)


# --- video -----------------------------------------------------------------------------------

import av  # noqa: E402 - the video half of the tests
import video_faults  # noqa: E402
from clips import write_video  # noqa: E402
from video_faults import faulty  # noqa: E402

from app.media.loading import (  # noqa: E402
    VideoDecoder,
    VideoDecoderPool,
    VideoLimits,
    frame_indices,
    load_video,
    snap_to_keyframes,
)


def write_audio_only(path: Path) -> Path:
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("aac", rate=16000)
        samples = np.zeros((1, 1024), np.float32)
        for i in range(20):
            frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def decoder():
    worker = VideoDecoder(VideoLimits(timeout_s=20))
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def faulty_decoder():
    """A worker that plays the faults of `video_faults` on clips named for them."""
    worker = VideoDecoder(VideoLimits(timeout_s=20), decode=video_faults.decode)
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return write_video(tmp_path_factory.mktemp("video") / "clip.mp4")


def frame_levels(frames: np.ndarray) -> list[int]:
    return [round(float(f.mean()) / 10) for f in frames]


def test_uniform_sampling_gives_the_asked_frames_with_metadata(decoder, clip):
    frames, metadata, timestamps = decoder.decode(clip, num_frames=5)
    assert frames.shape == (5, 48, 64, 3) and frames.dtype == np.uint8
    assert metadata["total_num_frames"] == 20 and metadata["fps"] == pytest.approx(10)
    assert metadata["duration"] == pytest.approx(2.0)
    assert metadata["frames_indices"] == [0, 5, 10, 14, 19]
    assert frame_levels(frames) == metadata["frames_indices"]
    assert metadata["video_backend"] == "decord" and metadata["codec"] == "h264"
    assert timestamps == pytest.approx([i / 10 for i in metadata["frames_indices"]], abs=0.01)


def test_sampling_at_a_target_rate(decoder, clip):
    frames, metadata, timestamps = decoder.decode(clip, fps=2)
    assert metadata["frames_indices"] == [2, 7, 12, 17]
    assert timestamps == pytest.approx([0.2, 0.7, 1.2, 1.7], abs=0.01)
    assert frame_levels(frames) == [2, 7, 12, 17]


def test_frame_counts_are_capped():
    limits = VideoLimits(max_frames=8)
    assert len(frame_indices(1000, 30, 100, None, limits)) == 8
    assert len(frame_indices(1000, 30, None, 30, limits)) == 8  # 33 s at 30 fps, capped: uniform
    assert frame_indices(1, 30, 16, None, limits) == [0]


def test_samples_move_to_nearby_keyframes_and_report_the_frames_taken(decoder, tmp_path):
    # 6 s at 10 fps, a keyframe every 10 frames: uniform picks 0, 15, 30, 44, 59; 15 and 44 are
    # 5 frames from a keyframe, within half the 15-frame gap between samples.
    path = write_video(tmp_path / "gop.mp4", seconds=6.0, fps=10, keyframe_every=10)
    frames, metadata, timestamps = decoder.decode(path, num_frames=5)
    assert metadata["frames_indices"] == [0, 10, 30, 40, 59] or metadata["frames_indices"] == [
        0,
        20,
        30,
        50,
        59,
    ]
    assert frame_levels(frames) == [(10 * i) % 250 // 10 for i in metadata["frames_indices"]]
    assert timestamps == pytest.approx([i / 10 for i in metadata["frames_indices"]], abs=0.01)


def test_keyframe_snapping_keeps_one_sample_per_stretch():
    assert snap_to_keyframes([0, 15, 30, 44, 59], [0, 10, 20, 30, 40, 50]) == [0, 10, 30, 40, 59]
    # Keyframes too far away (over half a gap) leave the exact indices.
    assert snap_to_keyframes([0, 5, 10, 14, 19], [0, 60]) == [0, 5, 10, 14, 19]
    # Two samples never collapse onto one keyframe.
    assert snap_to_keyframes([0, 5, 10, 14, 19], [0, 12]) == [0, 5, 12, 14, 19]
    assert snap_to_keyframes([7], [0]) == [7]


def test_a_pool_decodes_two_videos_at_once_while_one_worker_hangs(clip):
    import threading

    pool = VideoDecoderPool(workers=2, limits=VideoLimits(timeout_s=10), decode=video_faults.decode)
    refusals: list[str] = []

    def hang() -> None:
        with pytest.raises(MediaError) as error:
            pool.decode(faulty(clip, "hang"))
        refusals.append(str(error.value))

    hung = threading.Thread(target=hang)
    try:
        hung.start()
        while all(decoder.worker_pid is None for decoder in pool.decoders):
            threading.Event().wait(0.01)
        frames, _, _ = pool.decode(clip, num_frames=4)  # served by the other worker meanwhile
        assert frames.shape[0] == 4 and hung.is_alive()
    finally:
        hung.join()
        pool.close()
    assert "took over 10 s" in refusals[0]


def test_load_video_is_the_public_entry_point(clip):
    frames, metadata, timestamps = load_video(clip, num_frames=3)
    assert frames.shape[0] == 3 == len(timestamps) == len(metadata["frames_indices"])


def test_single_frame_video(decoder, tmp_path):
    frames, metadata, _ = decoder.decode(write_video(tmp_path / "one.mp4", seconds=0.1), num_frames=16)
    assert frames.shape == (1, 48, 64, 3) and metadata["total_num_frames"] == 1


def test_variable_frame_rate_keeps_the_real_timestamps(decoder, tmp_path):
    pts = [0, 40, 80, 480, 520, 1200, 1240, 1280]
    frames, metadata, timestamps = decoder.decode(write_video(tmp_path / "vfr.mp4", pts_ms=pts), num_frames=8)
    assert metadata["frames_indices"] == list(range(8)) and frame_levels(frames) == list(range(8))
    assert timestamps == pytest.approx([p / 1000 for p in pts], abs=0.002)


def test_opencv_takes_over_when_decord_cannot_open_a_file(faulty_decoder, clip):
    frames, metadata, _ = faulty_decoder.decode(faulty(clip, "decord-fails"), num_frames=5)
    assert metadata["video_backend"] == "opencv"
    assert frames.shape == (5, 48, 64, 3) and frame_levels(frames) == [0, 5, 10, 14, 19]


def strip_box(data: bytes, box: bytes) -> bytes:
    """The MP4 without one top-level box (its index, `moov`)."""
    offset = 0
    while offset < len(data):
        size = struct.unpack(">I", data[offset : offset + 4])[0]
        if data[offset + 4 : offset + 8] == box:
            return data[:offset] + data[offset + size :]
        offset += size
    raise AssertionError(f"no {box!r} box")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p, clip: p.write_bytes(b""), "empty"),
        (lambda p, clip: p.write_bytes(b"plain text, not a video\n" * 20), "not a video"),
        (lambda p, clip: p.write_bytes(b"<!doctype html><html><body>video</body></html>"), "not a video"),
        (lambda p, clip: p.write_bytes(SVG), "not a video"),
        (
            lambda p, clip: p.write_bytes(clip.read_bytes()[: clip.stat().st_size // 2]),
            "damaged or incomplete",
        ),
        (lambda p, clip: p.write_bytes(strip_box(clip.read_bytes(), b"moov")), "damaged or incomplete"),
        (lambda p, clip: write_audio_only(p), "no video track"),
    ],
    ids=["zero-bytes", "text", "html", "svg", "truncated", "no-index", "audio-only"],
)
def test_bad_video_files_are_refused_clearly(decoder, clip, tmp_path, make, message):
    path = tmp_path / "upload.mp4"
    make(path, clip)
    with pytest.raises(MediaError, match=message) as error:
        decoder.decode(path)
    assert_clean_refusal(error, path)
    assert decoder.decode(clip, num_frames=2).frames.shape[0] == 2  # the worker still serves


def test_videos_over_the_limits_are_refused_with_the_numbers(clip):
    short = VideoDecoder(VideoLimits(max_duration_s=1))
    small = VideoDecoder(VideoLimits(max_side=32))
    with pytest.raises(MediaError, match="This video file is 0 MB; the limit is 0 MB"):
        VideoDecoder(VideoLimits(max_bytes=100)).decode(clip)  # refused before any worker starts
    try:
        with pytest.raises(MediaError, match="This video is 2 s long; the limit is 1 s"):
            short.decode(clip)
        with pytest.raises(MediaError, match="64 x 48 pixels; the limit is 32 pixels"):
            small.decode(clip)
    finally:
        short.close()
        small.close()


def test_a_crashing_worker_is_replaced_and_the_next_decode_works(faulty_decoder, clip):
    faulty_decoder.decode(clip, num_frames=1)
    before = faulty_decoder.worker_pid
    crashing = faulty(clip, "crash")
    with pytest.raises(MediaError, match="decoder failed on this file") as error:
        faulty_decoder.decode(crashing)
    assert_clean_refusal(error, crashing)
    frames, _, _ = faulty_decoder.decode(clip, num_frames=2)
    assert frames.shape[0] == 2 and faulty_decoder.worker_pid not in (None, before)


def test_a_hanging_worker_is_killed_and_replaced(clip):
    decoder = VideoDecoder(VideoLimits(timeout_s=2), decode=video_faults.decode)
    try:
        decoder.decode(clip, num_frames=1)
        hung = decoder.worker_pid
        with pytest.raises(MediaError, match="took over 2 s and was stopped"):
            decoder.decode(faulty(clip, "hang"))
        with pytest.raises(ProcessLookupError):
            os.kill(hung, 0)
        assert decoder.decode(clip, num_frames=2).frames.shape[0] == 2
    finally:
        decoder.close()


def test_the_shipped_examples_load_through_the_pipeline():
    examples = Path(__file__).resolve().parent.parent / "static" / "examples"
    for name in ("shapes.png", "bar_chart.png"):
        assert load_image(examples / name).size == (480, 320)
    frames, metadata, timestamps = load_video(examples / "bouncing_ball.mp4")
    assert frames.shape == (16, 240, 320, 3) and metadata["total_num_frames"] == 48
    assert timestamps[-1] == pytest.approx(47 / 12, abs=0.01)
    assert sum(f.stat().st_size for f in examples.iterdir()) < 200_000


def test_frames_leave_the_worker_no_larger_than_any_processor_uses(decoder, tmp_path):
    """16 frames of a 4K clip were about 400 MB through the pipe at full size, then resized again
    by the model's processor: they now leave the worker at most `frame_max_side` long (aspect
    kept, levels kept), under 50 MB in all."""
    clip = write_video(tmp_path / "4k.mp4", seconds=1.6, fps=10, size=(3840, 2160), keyframe_every=10)
    frames, metadata, _ = decoder.decode(clip, num_frames=16)
    limit = VideoLimits().frame_max_side
    assert frames.shape == (16, round(2160 * limit / 3840), limit, 3), frames.shape
    assert frames.nbytes < 50 * 10**6
    assert metadata["frames_resized_from"] == [2160, 3840]
    assert (metadata["width"], metadata["height"]) == (3840, 2160)  # the clip's own, as probed
    assert frame_levels(frames) == list(range(16))  # each frame is still the one sampled
    # Small clips pass untouched.
    small, small_metadata, _ = decoder.decode(write_video(tmp_path / "small.mp4"), num_frames=4)
    assert small.shape[1:3] == (48, 64) and small_metadata["frames_resized_from"] is None


@pytest.mark.parametrize("size", [(3840, 2160), (1280, 720), (2000, 64), (1600, 1200), (4000, 30)])
def test_frames_sized_in_the_worker_alias_fine_detail_no_more_than_area_averaging(size: tuple[int, int]):
    """One-pixel stripes (a fence, text, a striped shirt) made smaller: averaged towards grey as
    area averaging in one step does, not turned into false bands as a plain bilinear step does
    (at 2000 -> 1120 px, bilinear leaves them nearly full contrast; area averaging a tenth)."""
    import cv2

    from app.media.loading import fit_frames

    width, height = size
    stripes = np.zeros((2, height, width, 3), dtype=np.uint8)
    stripes[:, :, ::2] = 255
    fitted = fit_frames(stripes, VideoLimits().frame_max_side)
    assert max(fitted.shape[1:3]) == min(max(size), VideoLimits().frame_max_side)
    area = cv2.resize(stripes[0], fitted.shape[2:0:-1], interpolation=cv2.INTER_AREA)
    assert abs(float(fitted.mean()) - 127.5) < 3
    # (a margin for the mild last step, where no method keeps one-pixel detail apart)
    assert float(fitted.std()) <= float(area.std()) + 10, (fitted.std(), area.std())
