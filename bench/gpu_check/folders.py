"""The two model folders the check builds its engines on, and the app's card for each.

A folder holds Qwen2-VL's config with one model's published sizes, a tokenizer trained here and
the processor, and no weights: vLLM makes them up (`load_format="dummy"`), so nothing is
downloaded. The card is what the app would list for the folder: the dry run renders its prompt,
the manager phase swaps between the two.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.catalog.cards import QWEN_PATCH_PIXELS
from app.demo.twins.common import QWEN_SPECIAL_TOKENS

from . import common
from .common import (
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MAX_PIXELS,
    MAX_POSITION_EMBEDDINGS,
    MIN_PIXELS,
    SPECS,
    ModelSpec,
)


def train_tokenizer() -> Any:
    """Qwen2-VL's special tokens on a byte-level BPE trained here, as the twins have them
    (`app.demo.twins`), at this check's context length (the card renders its own prompt format)."""
    from app.demo.twins import train_tokenizer as train

    return train(
        QWEN_SPECIAL_TOKENS,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        max_length=MAX_POSITION_EMBEDDINGS,
    )


def model_config(spec: ModelSpec, tokenizer: Any) -> Any:
    """Qwen2VLConfig with the published sizes; token ids from the local tokenizer (all below
    the real vocabulary size, which the embedding keeps)."""
    from transformers import Qwen2VLConfig

    token_id = tokenizer.convert_tokens_to_ids
    return Qwen2VLConfig(
        text_config={
            "vocab_size": spec.vocab_size,
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.kv_heads,
            "hidden_act": "silu",
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "max_window_layers": spec.layers,
            "use_sliding_window": False,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [16, 24, 24],
            },
            "bos_token_id": token_id("<|endoftext|>"),
            "eos_token_id": token_id("<|im_end|>"),
            "pad_token_id": token_id("<|endoftext|>"),
        },
        vision_config={
            "depth": spec.vision_depth,
            "embed_dim": spec.vision_embed_dim,
            "hidden_size": spec.hidden_size,
            "num_heads": spec.vision_heads,
            "mlp_ratio": spec.vision_mlp_ratio,
            "hidden_act": "quick_gelu",
            "in_channels": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
        tie_word_embeddings=spec.tie_word_embeddings,
        architectures=["Qwen2VLForConditionalGeneration"],
        dtype="bfloat16",
    )


def write_model_folder(folder: Path, spec: ModelSpec) -> Path:
    """Config, tokenizer and processor for `spec` in `folder` (no weights: vLLM makes them up)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    pixels = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        video_processor=Qwen2VLVideoProcessor(**pixels),
        tokenizer=tokenizer,
    )
    model_config(spec, tokenizer).save_pretrained(folder)
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "gpu-check.json").write_text(json.dumps({"spec": spec.key, "weights": "none (dummy)"}))
    return folder


def write_model_folders(root: Path, specs: dict[str, ModelSpec] = SPECS) -> dict[str, Path]:
    return {role: write_model_folder(root / spec.key, spec) for role, spec in specs.items()}


def cached_weights(spec: ModelSpec, cache_dir: Path | None = None) -> Path | None:
    """The published model's folder where all its weights are in the Hugging Face cache (the
    snapshot of its default revision): engines built on it read real weights from disk, so
    rebuild times are what a user's are. None where any weight file, the tokenizer or the
    processor's config is missing (a download of the weights alone, as `--include "*.safetensors"`
    makes, would fail the engine's build rather than fall back to random weights)."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(spec.repo, local_files_only=True, cache_dir=cache_dir))
    except Exception:  # not in the cache (LocalEntryNotFoundError), or an unreadable one
        return None
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError):
            return None
    else:
        files = {"model.safetensors"}
    files |= {"config.json", "tokenizer_config.json", "preprocessor_config.json"}
    tokenizer = (folder / "tokenizer.json").is_file() or (folder / "vocab.json").is_file()
    complete = tokenizer and all((folder / name).is_file() for name in files)
    return folder if complete else None


def model_card(spec: ModelSpec, folder: Path, load_format: str = "dummy") -> Any:
    """The app's card for a folder: the Qwen2-VL card's twin (its prompt format) with this
    model's engine arguments, one image a prompt, and its parameter count for memory sizing."""
    from app.catalog.cards import ModelCard, VisualTokens, load_cards
    from app.demo.models import twin_card

    weights = "dummy weights" if load_format == "dummy" else "real weights"
    fields = twin_card(load_cards()["qwen2_vl"], folder, spec.key).model_dump()
    fields.update(
        display_name=f"{spec.title} ({weights})",
        modalities=["image"],
        multi_image=False,
        parameters_b=spec.parameters / 1e9,
        reference=f"bench/gpu_check ({weights})",
        engine_overrides=None,
        reference_engine_args={
            "model": str(folder),
            "load_format": load_format,
            "dtype": common.DTYPE,
            "mm_processor_kwargs": dict(common.PIXELS),
            "max_model_len": MAX_MODEL_LEN,
            "max_num_seqs": MAX_NUM_SEQS,
            "limit_mm_per_prompt": {"image": 1},
            **common.ENGINE_OVERRIDES,
        },
        visual_tokens=VisualTokens(
            pixels_per_token=QWEN_PATCH_PIXELS,
            min_pixels=MIN_PIXELS,
            max_pixels=MAX_PIXELS,
            frames_per_token=2,
        ).model_dump(),
        hardware="One GPU.",
        runs_on_cpu=False,
        notes="Random weights from vLLM's dummy loader." if load_format == "dummy" else "Real weights.",
    )
    return ModelCard.model_validate(fields)
