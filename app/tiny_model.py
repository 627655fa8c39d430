"""Tiny random-weight Qwen2-VL models, built locally in about a second with nothing downloaded.

They let the real vLLM engine run anywhere: the tests, the benchmarks, and the app's demo on a
machine with no GPU and no weights. Random weights print nonsense; everything around the model
(prompt, media, streaming, lifecycle) is real. Two variants of different sizes exist so that
swapping engines can be exercised.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from app.cards import QWEN_PATCH_PIXELS, ModelCard, VisualTokens

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TRAINING_TEXT = [
    "A photo of a cat sitting on a red chair next to the window.",
    "What is in this image? Describe the video in detail, frame by frame.",
    "The quick brown fox jumps over the lazy dog. 0123456789 !?.,;:'\"()[]{}",
    "Vision language models answer questions about pictures and clips.",
    "Bonjour, ¿qué tal? Grüße aus München. Ça va très bien, merci.",
]


@dataclass(frozen=True)
class TinyVariant:
    """Sizes of one tiny model; head size stays >= 32, the smallest vLLM's CPU attention takes."""

    name: str
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    vision_embed_dim: int
    vision_depth: int


VARIANTS = {
    "tiny-a": TinyVariant(
        "tiny-a", hidden_size=128, layers=2, heads=4, kv_heads=2, vision_embed_dim=64, vision_depth=2
    ),
    "tiny-b": TinyVariant(
        "tiny-b", hidden_size=192, layers=3, heads=6, kv_heads=2, vision_embed_dim=96, vision_depth=2
    ),
}

MAX_MODEL_LEN = 4096
MIN_PIXELS, MAX_PIXELS = QWEN_PATCH_PIXELS * 4, QWEN_PATCH_PIXELS * 64


def use_local_vllm_environment(scratch: Path, environ: MutableMapping[str, str] = os.environ) -> None:
    """What the tests and benchmarks run vLLM under on these machines; call before importing it.

    Offline, no usage stats, one engine process per engine instead of two (half the start-up
    time and memory), and vLLM's sockets and caches in `scratch` instead of `/tmp` and home.
    `VLLM_CPU_KVCACHE_SPACE` is removed because it overrides each engine's own KV cache size.
    """
    environ.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_RPC_BASE_PATH=str(scratch),
        VLLM_CACHE_ROOT=str(scratch / "cache"),
        TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"),
    )
    environ.pop("VLLM_CPU_KVCACHE_SPACE", None)


def build_tiny_vlm(folder: Path, variant: str = "tiny-a", seed: int = 0) -> Path:
    """Writes tokenizer, processor, config and random weights into `folder` (once) and returns it."""
    sizes = VARIANTS[variant]
    folder = Path(folder)
    marker = folder / "tiny-vlm.json"
    if marker.exists() and json.loads(marker.read_text()) == {"variant": variant, "seed": seed}:
        return folder
    # Imported here: the UI process lists the catalog without loading torch or transformers.
    import torch
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    from app.twins import mrope_section, train_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(
        SPECIAL_TOKENS,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        max_length=MAX_MODEL_LEN,
        text=TRAINING_TEXT,
    )
    token_id = tokenizer.convert_tokens_to_ids
    pixels = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        video_processor=Qwen2VLVideoProcessor(**pixels),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    head_dim = sizes.hidden_size // sizes.heads
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": sizes.hidden_size,
            "intermediate_size": sizes.hidden_size * 2,
            "num_hidden_layers": sizes.layers,
            "num_attention_heads": sizes.heads,
            "num_key_value_heads": sizes.kv_heads,
            "max_position_embeddings": MAX_MODEL_LEN,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": mrope_section(head_dim),
            },
            "bos_token_id": token_id("<|endoftext|>"),
            "eos_token_id": token_id("<|im_end|>"),
            "pad_token_id": token_id("<|endoftext|>"),
        },
        vision_config={
            "depth": sizes.vision_depth,
            "embed_dim": sizes.vision_embed_dim,
            "hidden_size": sizes.hidden_size,
            "num_heads": 4,
            "mlp_ratio": 2,
        },
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
        tie_word_embeddings=False,
        architectures=["Qwen2VLForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    marker.write_text(json.dumps({"variant": variant, "seed": seed}))
    return folder


def tiny_card(key: str, folder: Path, variant: str = "tiny-a") -> ModelCard:
    """A card for a tiny model in `folder`: Qwen2-VL's prompt format, several images or a video."""
    folder_text = str(folder)
    return ModelCard(
        key=key,
        display_name=f"Tiny random Qwen2-VL ({variant}, random weights: for trying the interface)",
        family="Demo",
        hf_repo=folder_text,
        architecture="Qwen2VLForConditionalGeneration",
        modalities=["image", "video"],
        multi_image=True,
        reference="built locally by app.tiny_model (random weights)",
        reference_engine_args={
            "model": folder_text,
            "max_model_len": MAX_MODEL_LEN,
            "max_num_seqs": 16,
            "limit_mm_per_prompt": {"image": 4, "video": 1},
        },
        video_metadata=True,
        visual_tokens=VisualTokens(
            pixels_per_token=QWEN_PATCH_PIXELS,
            min_pixels=MIN_PIXELS,
            max_pixels=MAX_PIXELS,
            frames_per_token=2,
        ),
        adapter="format",
        prompt={
            "user": "<|im_start|>user\n{media}{text}<|im_end|>\n",
            "assistant": "<|im_start|>assistant\n{text}<|im_end|>\n",
            "generation": "<|im_start|>assistant\n",
            "system": "<|im_start|>system\n{text}<|im_end|>\n",
            "default_system": "You are a helpful assistant.",
            "image": "<|vision_start|><|image_pad|><|vision_end|>",
            "video": "<|vision_start|><|video_pad|><|vision_end|>",
        },
        hardware="Runs anywhere, CPU included: a few MB.",
        runs_on_cpu=True,
        notes="Random weights: the answers are nonsense. It exists to try the app without a GPU.",
    )
