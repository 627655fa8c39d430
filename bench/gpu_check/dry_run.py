"""`--dry-run`: the two folders written and checked without a GPU or an engine.

Transformers loads each config and processor (with the card's prompt and the image tokens it
expands to), counts the model's parameters on the meta device against the published count, and,
where vLLM is installed, vLLM's model config accepts the folder with the check's engine
arguments. Runs on any machine, so the folders are known good before a GPU is booked.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import (
    IMAGE_SIDE,
    MAX_MODEL_LEN,
    MAX_POSITION_EMBEDDINGS,
    PROMPT,
    SPECS,
    ModelSpec,
    describe_error,
    describe_model,
    log,
)
from .engines import engine_args
from .folders import model_card, write_model_folders
from .machine import describe_machine


def check_folder(folder: Path, spec: ModelSpec) -> list[dict[str, Any]]:
    """What transformers (and vLLM's model config, where vLLM is installed) make of `folder`."""
    checks: list[dict[str, Any]] = []

    def check(name: str, action: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = action()
        except Exception as error:
            ok, detail = False, describe_error(error)
        checks.append({"name": f"{spec.title}: {name}", "ok": ok, "detail": detail})

    def config_loads() -> tuple[bool, str]:
        from transformers import AutoConfig, Qwen2VLConfig

        config = AutoConfig.from_pretrained(folder)
        text, vision = config.text_config, config.vision_config
        found = {
            "hidden_size": text.hidden_size,
            "intermediate_size": text.intermediate_size,
            "num_hidden_layers": text.num_hidden_layers,
            "num_attention_heads": text.num_attention_heads,
            "num_key_value_heads": text.num_key_value_heads,
            "vocab_size": text.vocab_size,
            "max_position_embeddings": text.max_position_embeddings,
            "mrope_section": list(text.rope_parameters.get("mrope_section", [])),
            "vision depth": vision.depth,
            "vision embed_dim": vision.embed_dim,
            "tie_word_embeddings": config.tie_word_embeddings,
        }
        wanted = {
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.kv_heads,
            "vocab_size": spec.vocab_size,
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "mrope_section": [16, 24, 24],
            "vision depth": spec.vision_depth,
            "vision embed_dim": spec.vision_embed_dim,
            "tie_word_embeddings": spec.tie_word_embeddings,
        }
        wrong = {k: (found[k], wanted[k]) for k in wanted if found[k] != wanted[k]}
        ids = [config.image_token_id, config.video_token_id, config.vision_start_token_id]
        ids += [config.vision_end_token_id, text.eos_token_id]
        ok = isinstance(config, Qwen2VLConfig) and not wrong and max(ids) < spec.vocab_size
        detail = (
            f"{type(config).__name__}, {spec.layers} layers x {spec.hidden_size}, vocab {text.vocab_size}"
        )
        return ok, detail if not wrong else f"differs (found, wanted): {wrong}"

    def processor_loads() -> tuple[bool, str]:
        import numpy as np
        from PIL import Image
        from transformers import AutoConfig, AutoProcessor

        from app.catalog.adapters import render

        config = AutoConfig.from_pretrained(folder)
        processor = AutoProcessor.from_pretrained(folder)
        image = Image.fromarray(np.zeros((IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8))
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image},
                    {"type": "text", "text": "Describe this picture."},
                ],
            }
        ]
        # The prompt as the app writes it: the card's format (Qwen2-VL's).
        prompt = render(model_card(spec, folder), messages, processor.tokenizer).prompt
        inputs = processor(text=[prompt], images=[image], return_tensors="np")
        ids = inputs["input_ids"][0]
        image_tokens = int((ids == config.image_token_id).sum())
        expected = int(inputs["image_grid_thw"].prod()) // 4
        ok = (
            type(processor).__name__ == "Qwen2VLProcessor"
            and prompt == PROMPT
            and image_tokens == expected
            and int(ids.max()) < spec.vocab_size
        )
        detail = (
            f"{type(processor).__name__}; prompt {'as expected' if prompt == PROMPT else 'differs'}; "
            f"a {IMAGE_SIDE}x{IMAGE_SIDE} image -> {image_tokens} image tokens (expected {expected}); "
            f"tokenizer of {len(processor.tokenizer)} tokens"
        )
        return ok, detail

    def parameter_count() -> tuple[bool, str]:
        import torch
        from transformers import AutoConfig, Qwen2VLForConditionalGeneration

        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = Qwen2VLForConditionalGeneration(config)
        count = sum(p.numel() for p in model.parameters())
        off = count / spec.parameters - 1
        return abs(off) < 0.01, f"{count:,} parameters (published {spec.parameters:,}, {off:+.2%})"

    def vllm_accepts() -> tuple[bool, str]:
        try:
            from vllm.engine.arg_utils import EngineArgs
        except ImportError:
            return True, "vLLM not installed here: not checked"
        # Sleep mode exists on CUDA only; the rest is what the engine check builds with.
        args = engine_args(folder, 0.5, spec.kv_reserve_bytes)
        model = EngineArgs(**{**args, "enable_sleep_mode": False}).create_model_config()
        return (
            model.max_model_len == MAX_MODEL_LEN and model.get_vocab_size() == spec.vocab_size,
            f"vLLM model config: {model.architecture}, max_model_len {model.max_model_len}, "
            f"vocab {model.get_vocab_size()}, dtype {model.dtype}",
        )

    check("AutoConfig.from_pretrained", config_loads)
    check("AutoProcessor.from_pretrained, the card's prompt and image tokens", processor_loads)
    check("parameter count (transformers, meta device)", parameter_count)
    check("vLLM's model config (no engine)", vllm_accepts)
    return checks


def dry_run(models_dir: Path) -> dict[str, Any]:
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    start = time.perf_counter()
    folders = write_model_folders(models_dir)
    written = time.perf_counter() - start
    log(f"wrote {', '.join(str(f) for f in folders.values())} in {written:.1f} s")
    checks = []
    for role, folder in folders.items():
        checks += check_folder(folder, SPECS[role])
    return {
        "mode": "dry-run",
        "meta": {**describe_machine(gpu=False), "models_written_s": round(written, 2)},
        "models": {role: describe_model(SPECS[role], folders[role]) for role in folders},
        "checks": checks,
        "ok": all(c["ok"] for c in checks),
    }
