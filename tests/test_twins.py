"""Tiny twins of real catalog cards on the real vLLM engine (CPU), through the app's path.

Each twin is the real card pointed at a local folder of the same architecture with random
weights (`load_format="dummy"`), so the test proves that vLLM's own processor accepts the card's
prompt with the media the app sends. Random weights print nonsense: the assertions are on token
counts, never on text.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from app.catalog.cards import ModelCard, load_cards
from app.demo.twins import TWIN_BUILDERS, build_twin, twin_cases, twin_settings, why_no_twin
from app.engines.base import EngineError, SamplingSettings, StreamEnd
from app.engines.manager import EngineManager
from app.engines.memory import kv_dtype_bytes, kv_layout
from app.engines.vllm_engine import VllmEngineFactory

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CARDS = load_cards()
FIXED = SamplingSettings(temperature=0.0, max_tokens=4, ignore_eos=True)

# The real models' classes (their config.json and processor_config.json), written out here so a
# twin cannot drift from them: architecture, config model_type, processor, image processor.
REAL = {
    "llava": ("LlavaForConditionalGeneration", "llava", "LlavaProcessor", "CLIPImageProcessor"),
    "llava-next": (
        "LlavaNextForConditionalGeneration",
        "llava_next",
        "LlavaNextProcessor",
        "LlavaNextImageProcessor",
    ),
    "llava-onevision": (
        "LlavaOnevisionForConditionalGeneration",
        "llava_onevision",
        "LlavaOnevisionProcessor",
        "LlavaOnevisionImageProcessor",
    ),
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", "qwen2_vl", "Qwen2VLProcessor", "Qwen2VLImageProcessor"),
    "qwen2_5_vl": (
        "Qwen2_5_VLForConditionalGeneration",
        "qwen2_5_vl",
        "Qwen2_5_VLProcessor",
        "Qwen2VLImageProcessor",
    ),
    "paligemma": (
        "PaliGemmaForConditionalGeneration",
        "paligemma",
        "PaliGemmaProcessor",
        "SiglipImageProcessor",
    ),
    "paligemma2": (
        "PaliGemmaForConditionalGeneration",
        "paligemma",
        "PaliGemmaProcessor",
        "SiglipImageProcessor",
    ),
    "gemma3": ("Gemma3ForConditionalGeneration", "gemma3", "Gemma3Processor", "Gemma3ImageProcessor"),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", "qwen3_vl", "Qwen3VLProcessor", "Qwen2VLImageProcessor"),
    "pixtral_hf": ("LlavaForConditionalGeneration", "llava", "PixtralProcessor", "PixtralImageProcessor"),
    "llava-next-video": (
        "LlavaNextVideoForConditionalGeneration",
        "llava_next_video",
        "LlavaNextVideoProcessor",
        "LlavaNextImageProcessor",
    ),
    "blip-2": ("Blip2ForConditionalGeneration", "blip-2", "Blip2Processor", "BlipImageProcessor"),
    "glm4_1v": ("Glm4vForConditionalGeneration", "glm4v", "Glm4vProcessor", "Glm4vImageProcessor"),
    "smolvlm": ("SmolVLMForConditionalGeneration", "smolvlm", "SmolVLMProcessor", "SmolVLMImageProcessor"),
    "idefics3": (
        "Idefics3ForConditionalGeneration",
        "idefics3",
        "Idefics3Processor",
        "Idefics3ImageProcessor",
    ),
}
# The other groups' classes, one module per group of app.demo.twins (tests/twin_facts_*.py).
for _facts in sorted(Path(__file__).parent.glob("twin_facts_*.py")):
    REAL.update(importlib.import_module(_facts.stem).REAL)

# TWINS=key,key runs only those twins (a developer's loop over one architecture).
_chosen = {key for key in os.environ.get("TWINS", "").split(",") if key}
TWINS = sorted(key for key in TWIN_BUILDERS if not _chosen or key in _chosen)

# Real defects the twins found, left for their fix (strict: a fix makes these tests pass loudly).
# Videos the real engine refused until their defect was fixed (empty: none left); a key here
# turns the case into a strict expected failure, so a fix shows up as a test to update.
VIDEO_DEFECTS: dict[str, str] = {}


# Twins served in float32: on CPUs without bfloat16 instructions (these machines) PyTorch's
# bfloat16 convolutions run some 50 times slower than float32's (Gemma 3n's MobileNet-V5 tower:
# 95 s a 256-pixel picture, 1.7 s in float32, one thread), and the dtype is not what a twin checks.
FLOAT32 = {"gemma3n", "deepseek_ocr"}


def served_card(key: str) -> ModelCard:
    """The card a twin is served with: the catalog's, in float32 where `FLOAT32` says."""
    card = CARDS[key]
    if key in FLOAT32:
        card = card.model_copy(
            update={"reference_engine_args": {**card.reference_engine_args, "dtype": "float32"}}
        )
    return card


def picture(seed: int, size: int = 96) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def ask(text: str, *images: Image.Image, video: Any = None) -> list[dict[str, Any]]:
    parts = [{"type": "image", "image": image} for image in images]
    if video is not None:
        parts.append({"type": "video", "video": video})
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


async def answer(manager: EngineManager, key: str, messages: list[dict[str, Any]]) -> StreamEnd:
    end = None
    async for event in manager.stream(key, messages, FIXED):
        if isinstance(event, StreamEnd):
            end = event
    assert end is not None
    return end


@pytest.fixture(scope="session")
def twin_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("twins")
    return {key: build_twin(CARDS[key], root) for key in TWINS}


def test_every_twin_is_of_a_real_card_and_the_registries_do_not_overlap():
    assert set(TWIN_BUILDERS) <= set(CARDS)
    assert set(why_no_twin) <= set(CARDS)
    assert not set(TWIN_BUILDERS) & set(why_no_twin)
    assert set(REAL) == set(TWIN_BUILDERS)


@pytest.mark.parametrize("key", TWINS)
def test_twin_has_the_real_models_architecture_and_processor(key: str, twin_folders: dict[str, Path]):
    """The twin's classes are the real model's. A processor of None: vLLM carries the model's
    processor itself (remote-code models), so the folder holds only config and tokenizer."""
    from transformers import AutoProcessor, AutoTokenizer
    from vllm.transformers_utils.config import get_config

    architecture, model_type, processor_class, image_processor_class = REAL[key]
    assert CARDS[key].architecture == architecture
    remote_code = CARDS[key].needs_remote_code
    # As vLLM reads it: vLLM registers config classes transformers lacks (DeepSeek-VL2, Ovis).
    config = get_config(str(twin_folders[key]), trust_remote_code=remote_code)
    assert config.architectures == [architecture]
    # As config.json names it (vLLM renames some, e.g. DeepSeek-OCR's deepseek_vl_v2).
    assert json.loads((twin_folders[key] / "config.json").read_text())["model_type"] == model_type
    if processor_class is None:
        assert AutoTokenizer.from_pretrained(twin_folders[key], trust_remote_code=remote_code)
    else:
        processor = AutoProcessor.from_pretrained(twin_folders[key], trust_remote_code=remote_code)
        assert type(processor).__name__ == processor_class
        assert type(processor.image_processor).__name__ == image_processor_class
    text = config.get_text_config()
    assert text.hidden_size // text.num_attention_heads >= 32 or getattr(text, "head_dim", 0) >= 32


@pytest.mark.parametrize("key", TWINS)
def test_twin_has_a_chat_template_where_the_card_renders_through_one(key: str, twin_folders: dict[str, Path]):
    from transformers import AutoProcessor, AutoTokenizer

    card = CARDS[key]
    uses_template = card.adapter == "chat_template" or getattr(
        card.prompt_spec, "several_images_via_chat_template", False
    )
    if not uses_template:
        pytest.skip(f"{key}'s prompt is written by the card's format")
    load = AutoProcessor if card.chat_template_owner == "processor" else AutoTokenizer
    assert load.from_pretrained(twin_folders[key], trust_remote_code=card.needs_remote_code).chat_template


def test_a_twin_is_built_once(twin_folders: dict[str, Path]):
    folder = twin_folders[TWINS[0]]
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert build_twin(CARDS[TWINS[0]], folder.parent) == folder
    assert (folder / "config.json").stat().st_mtime_ns == stamp


def test_vllm_finds_every_twins_model_info_in_the_cache_the_suite_fills_once(vllm_model_infos, monkeypatch):
    """Each build would otherwise inspect its model class in a process of its own (about 8 s):
    a vLLM that caches them differently shows here, not as a suite minutes slower."""
    from vllm.model_executor.models import registry

    def inspect_in_a_new_process(inspect):
        raise AssertionError("not in the cache: vLLM would start a process to inspect it")

    monkeypatch.setattr(registry, "_run_in_subprocess", inspect_in_a_new_process)
    gathered = (vllm_model_infos / "inspected").stat().st_mtime
    for key in TWINS:
        model = registry.ModelRegistry.models[CARDS[key].architecture]
        assert model.inspect_model_cls().supports_multimodal, key
        # Written by the one inspection, not since by a build that found it missing or stale.
        entry = vllm_model_infos / "modelinfos" / model._get_cache_filename()
        assert entry.stat().st_mtime <= gathered, key


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from clips import write_video

    return write_video(tmp_path_factory.mktemp("clip") / "clip.mp4", seconds=2.0, fps=10, size=(64, 48))


def test_every_catalog_card_has_a_twin_or_a_reason():
    from vllm import ModelRegistry

    assert set(TWIN_BUILDERS) | set(why_no_twin) == set(CARDS)
    archs = set(ModelRegistry.get_supported_archs())
    supported = {key for key, card in CARDS.items() if card.architecture in archs}
    assert set(TWIN_BUILDERS) <= supported
    # 36 of the 50 supported cards; the other 14 need their repository's code or FP8 kernels this
    # CPU lacks (their reasons, docs/CATALOG.md). Fewer is a regression.
    assert len(TWIN_BUILDERS) >= 36, f"{len(TWIN_BUILDERS)} of {len(supported)} supported cards have twins"
    for key in supported - set(TWIN_BUILDERS):
        assert why_no_twin[key], key


def test_cards_without_a_twin_are_the_ones_vllm_cannot_run():
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for key, reason in why_no_twin.items():
        if "model registry has no" in reason:
            assert CARDS[key].architecture not in supported, key
            assert CARDS[key].architecture in reason


@pytest.fixture(scope="module", params=TWINS)
def twin(request, loop, twin_folders) -> Iterator[tuple[str, EngineManager, dict[str, int]]]:
    """One engine per twin, shared by its cases and shut down before the next twin's."""
    key = request.param
    # The scheduler sizes a twin as its real model, by the name (Gemma 3n E2B: 21.7 GiB in float32);
    # the twin is a few MB, and on CPU the budget decides nothing else.
    budget = {"memory_budget": "64GiB"} if key in FLOAT32 else {}
    settings = twin_settings({key: twin_folders[key]}, **budget)
    manager = EngineManager(
        {key: served_card(key)}, settings, VllmEngineFactory(settings), progress_interval_s=0.2
    )
    prompt_tokens: dict[str, int] = {}
    started = time.monotonic()
    yield key, manager, prompt_tokens
    loop.run(manager.close())
    print(f"{key}: {time.monotonic() - started:.1f} s")


def baseline(loop, twin) -> int:
    """The prompt's length with one image (asked once per twin)."""
    key, manager, prompt_tokens = twin
    if "one image" not in prompt_tokens:
        one = loop.run(answer(manager, key, ask("What is in this image?", picture(1))))
        prompt_tokens["one image"] = one.prompt_tokens
    return prompt_tokens["one image"]


def test_twin_answers_one_image(loop, twin):
    key, manager, prompt_tokens = twin
    if "image" not in twin_cases(CARDS[key]):
        pytest.skip(f"{key} takes no images")
    end = loop.run(answer(manager, key, ask("What is in this image?", picture(1))))
    assert end.completion_tokens == 4
    assert end.prompt_tokens > 0
    prompt_tokens["one image"] = end.prompt_tokens


def test_twin_kv_cache_is_what_the_estimators_arithmetic_says(loop, twin, twin_folders):
    """The scheduler reserves KV memory by the arithmetic of `app.engines.memory` on the model's
    config.json (layers that keep a cache, KV heads, head size, latent attention); vLLM sizes the
    cache by its own. Given the same bytes, vLLM's cache must hold exactly the tokens a layer's
    bytes per token say (to its block size), or the reserve would be short (vLLM refuses the
    build) or wasted."""
    key, manager, _ = twin
    if "image" in twin_cases(CARDS[key]):
        baseline(loop, twin)
    else:
        loop.run(answer(manager, key, ask("Hello")))
    engine = manager.engines()[key][0]
    tokens, block = engine.kv_cache_tokens, engine.kv_cache_block_size
    config = json.loads((twin_folders[key] / "config.json").read_text())
    layout = kv_layout(config)
    assert layout is not None, f"{key}: the estimator cannot read its config"
    # vLLM 0.32 groups the layers of each kind (full attention, each window size) and a block of
    # its pool holds one block of each layer of a group; the twins have two layers, so a group is
    # the whole model where the kinds are one, and one layer where they are two. (The window,
    # padding and rounding arithmetic of `kv_bytes_per_sequence` is not exercised here.)
    group = len(layout.windows) if len(set(layout.windows)) == 1 else 1
    kv_bytes = twin_settings({key: twin_folders[key]}).cpu_kv_cache_bytes
    per_layer = layout.per_layer * kv_dtype_bytes(served_card(key)) // 2  # per_layer: at 2 bytes
    expected = kv_bytes // (per_layer * group * block) * block
    assert tokens == expected, (key, tokens, layout.per_layer, group, block)


def test_twin_answers_several_images_where_the_card_takes_them(loop, twin):
    key, manager, _ = twin
    if "several images" not in twin_cases(CARDS[key]):
        pytest.skip(f"{key} takes one image per prompt")
    one = baseline(loop, twin)
    two = loop.run(answer(manager, key, ask("What is in this image?", picture(1), picture(2))))
    assert two.completion_tokens == 4
    assert two.prompt_tokens > one


def test_twin_answers_a_video_where_the_card_takes_one(request, loop, twin, clip):
    key, manager, _ = twin
    card = CARDS[key]
    if "video" not in twin_cases(card):
        pytest.skip(f"{key} takes no video")
    if key in VIDEO_DEFECTS:
        request.applymarker(pytest.mark.xfail(raises=EngineError, strict=True, reason=VIDEO_DEFECTS[key]))
    from app.media.loading import load_video

    video = load_video(clip, num_frames=card.video_frames)
    text_only = loop.run(answer(manager, key, ask("What happens?")))
    with_video = loop.run(answer(manager, key, ask("What happens?", video=video)))
    assert with_video.completion_tokens == 4
    assert with_video.prompt_tokens > text_only.prompt_tokens


def first_question(card: ModelCard, clip: Path) -> list[dict[str, Any]]:
    """A first user turn with one image, or one video for a card that takes no images."""
    if "image" in card.modalities:
        return ask("What is in this image?", picture(1))
    from app.media.loading import load_video

    return ask("What happens?", video=load_video(clip, num_frames=card.video_frames))


def test_twin_replays_a_multi_turn_chat_with_media(loop, twin, clip):
    """Media in two turns, an earlier answer replayed: three pictures over two turns (two, then
    one) where the card takes three a prompt, two where it takes two."""
    key, manager, _ = twin
    card = CARDS[key]
    images = card.media_limits.get("image", 0)
    second = [picture(3 if images >= 3 else 2)] if images >= 2 else []
    if images >= 3:
        first = ask("What is in these images?", picture(1), picture(2))
    else:
        first = first_question(card, clip)
    messages = [*first, {"role": "assistant", "content": "A cat on a red chair."}, *ask("And now?", *second)]
    alone = loop.run(answer(manager, key, first))
    end = loop.run(answer(manager, key, messages))
    assert end.completion_tokens == 4
    if card.multi_turn:
        assert end.prompt_tokens > alone.prompt_tokens


def test_twin_answers_a_video_after_a_picture_in_one_chat(request, loop, twin, clip):
    """A chat that mixes them: a picture, its answer, then a clip, in one prompt."""
    key, manager, _ = twin
    card = CARDS[key]
    if "a picture, then a video" not in twin_cases(card):
        pytest.skip(f"{key} does not take both pictures and videos")
    if key in VIDEO_DEFECTS:
        request.applymarker(pytest.mark.xfail(raises=EngineError, strict=True, reason=VIDEO_DEFECTS[key]))
    from app.media.loading import load_video

    video = load_video(clip, num_frames=card.video_frames)
    first = ask("What is in this image?", picture(1))
    messages = [*first, {"role": "assistant", "content": "A cat."}, *ask("And in this clip?", video=video)]
    end = loop.run(answer(manager, key, messages))
    assert end.completion_tokens == 4
    assert end.prompt_tokens > loop.run(answer(manager, key, first)).prompt_tokens


def test_twin_takes_a_system_prompt_where_the_format_has_one(loop, twin, clip):
    key, manager, _ = twin
    if "system prompt" not in twin_cases(CARDS[key]):
        pytest.skip(f"{key}'s prompt format has no system prompt")
    messages = [{"role": "system", "content": "Answer in one word."}, *first_question(CARDS[key], clip)]
    end = loop.run(answer(manager, key, messages))
    assert end.completion_tokens == 4
