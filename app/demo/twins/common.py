"""Pieces the twin builders share: a tokenizer trainer, a tiny text config, tiny vision towers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard

# Writes a card's twin (config, tokenizer, processor) into an empty folder.
Builder = Callable[[ModelCard, Path], None]

TRAINING_TEXT = [
    "A photo of a cat sitting on a red chair next to the window.",
    "What is in this image? Describe the video in detail, frame by frame.",
    "The quick brown fox jumps over the lazy dog. 0123456789 !?.,;:'\"()[]{}",
    "Vision language models answer questions about pictures and clips.",
    "USER: ASSISTANT: User: Assistant: system user assistant model caption en answer en ocr",
]

# Text model sizes shared by the twins: head size 32, the smallest vLLM's CPU attention takes.
HIDDEN, HEADS, KV_HEADS, LAYERS = 128, 4, 2, 2
HEAD_DIM = HIDDEN // HEADS
MAX_POSITIONS = 32768

# The processors' chat templates, as the real models ship them (chat_template.json), for cards
# that render several images through the processor's template.
LLAVA_1_5_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\n' + content['text'] }}{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\n' + content['text'] }}{% endgeneration %}{% endfor %}"
    "{% endif %}{{'<|im_end|>'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen2-VL's and Qwen2.5-VL's chat template, as the real models ship it: what a vLLM
# OpenAI-compatible server renders for them (the app's remote path), and `add_vision_id`.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2.5-VL's windowed vision tower at twin size (depth 2, one full-attention block); the
# Qwen2.5-Omni thinker has the same.
QWEN2_5_VL_VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "out_hidden_size": HIDDEN,
    "fullatt_block_indexes": [1],
    "window_size": 112,
}

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


# --- shared pieces -------------------------------------------------------------------------


def train_tokenizer(
    special_tokens: list[str],
    *,
    eos: str,
    pad: str | None = None,
    bos: str | None = None,
    unk: str | None = None,
    chat_template: str | None = None,
    max_length: int = MAX_POSITIONS,
    extra_special_tokens: dict[str, str] | None = None,
    text: list[str] | None = None,
) -> Any:
    """A byte-level BPE tokenizer trained on a few lines (`text`, else the twins'), with the
    model's special tokens; the tiny demo models and the GPU check build theirs with it too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=unk))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(text or TRAINING_TEXT, trainer=trainer)
    named = {"eos_token": eos, "pad_token": pad, "bos_token": bos, "unk_token": unk}
    named = {k: v for k, v in named.items() if v is not None}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        additional_special_tokens=[t for t in special_tokens if t not in named.values()],
        model_max_length=max_length,
        **named,
        **({"extra_special_tokens": extra_special_tokens} if extra_special_tokens else {}),
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def text_config(tokenizer: Any, **extra: Any) -> dict[str, Any]:
    """A two-layer text model of head size 32 over the twin's vocabulary."""
    config = {
        "vocab_size": len(tokenizer),
        "hidden_size": HIDDEN,
        "intermediate_size": HIDDEN * 2,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if tokenizer.bos_token_id is not None:
        config["bos_token_id"] = tokenizer.bos_token_id
    config.update(extra)
    return config


def mrope_section(head_dim: int) -> list[int]:
    """Half the head size split over time, height and width as Qwen2-VL does (16:24:24 of 64)."""
    half = head_dim // 2
    time = half // 4
    height = (half - time) // 2
    return [time, height, half - time - height]


def save(folder: Path, config: Any, processor: Any, tokenizer: Any) -> None:
    config.save_pretrained(folder)
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _tiny_vit(model_type: str, image_size: int, **extra: Any) -> dict[str, Any]:
    """A two-layer ViT of width 64 with 14 px patches: the twins' CLIP and SigLIP towers."""
    return {
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": image_size,
        "patch_size": 14,
        **extra,
    }


def clip_vision(image_size: int) -> dict[str, Any]:
    return _tiny_vit("clip_vision_model", image_size, projection_dim=64)


def siglip_vision(image_size: int) -> dict[str, Any]:
    return _tiny_vit("siglip_vision_model", image_size)
