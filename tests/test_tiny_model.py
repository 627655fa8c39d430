"""The tiny models are real Qwen2-VL checkpoints that transformers and vLLM accept."""

from __future__ import annotations

import json
from pathlib import Path

from app.adapters import render
from app.tiny_model import VARIANTS, tiny_card


def test_both_variants_are_complete_checkpoints_of_different_sizes(tiny_models: dict[str, Path]):
    from transformers import AutoConfig, AutoProcessor

    sizes = {}
    for variant, folder in tiny_models.items():
        config = AutoConfig.from_pretrained(folder)
        processor = AutoProcessor.from_pretrained(folder)
        assert config.architectures == ["Qwen2VLForConditionalGeneration"]
        assert config.text_config.hidden_size // config.text_config.num_attention_heads >= 32
        assert processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id
        assert (folder / "model.safetensors").stat().st_size < 5 * 2**20
        sizes[variant] = config.text_config.hidden_size
    assert sizes == {name: variant.hidden_size for name, variant in VARIANTS.items()}


def test_a_built_model_is_reused(tiny_models: dict[str, Path]):
    from app.tiny_model import build_tiny_vlm

    folder = tiny_models["tiny-a"]
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    build_tiny_vlm(folder, "tiny-a")
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((folder / "tiny-vlm.json").read_text())["variant"] == "tiny-a"


def test_the_tiny_card_renders_like_its_chat_template(tiny_models: dict[str, Path]):
    from transformers import AutoTokenizer

    folder = tiny_models["tiny-a"]
    card = tiny_card("tiny-a", folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    messages = [
        {"role": "user", "content": [{"type": "image", "image": "img"}, {"type": "text", "text": "Hi"}]}
    ]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render(card, messages, tokenizer).prompt == expected
