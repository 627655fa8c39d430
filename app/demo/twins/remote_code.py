"""Twins of remote-code models whose config or processor the installed vLLM or transformers
carries (Keye-VL, dots.ocr, ERNIE-4.5-VL, R-4B, Bee).

Only dots.ocr can have one: vLLM carries its config class and loads transformers' own
`Qwen2VLProcessor` for it. The others reach vLLM through the model repository's own processor
(AutoProcessor over `auto_map`), which neither vLLM nor transformers carries; a processor written
here would not be the real one, so those cards are in WHY_NOT with the class and file."""

from __future__ import annotations

import json
from pathlib import Path

from app.catalog.cards import ModelCard
from app.demo.twins.common import HIDDEN, QWEN_SPECIAL_TOKENS, Builder, text_config, train_tokenizer

# The repository's configuration module name, as the real config.json's auto_map names it.
DOTS_CONFIG_MODULE = "configuration_dots"

# Written into the twin as configuration_dots.py. It holds no code of its own: the class is the
# one vLLM carries (the real repository's configuration_dots.py defines the same DotsOCRConfig).
DOTS_CONFIG_SOURCE = '''"""dots.ocr's configuration for a tiny twin.

The real repository ships configuration_dots.py with DotsOCRConfig (a Qwen2Config with a
`vision_config` for its ViT) and DotsVisionConfig; vLLM carries the same classes in
vllm/transformers_utils/configs/dotsocr.py but does not register the `dots_ocr` model type, so
the config is still reached through config.json's auto_map, as with the real model.
"""

from vllm.transformers_utils.configs.dotsocr import DotsOCRConfig, DotsVisionConfig

__all__ = ["DotsOCRConfig", "DotsVisionConfig"]
'''


def _dots_ocr(card: ModelCard, folder: Path) -> None:
    """dots.ocr: a Qwen2 text model (head size 32) with the dots ViT (depth 2, embed 64, patch 14,
    merge 2, one frame per patch) behind `<|img|><|imgpad|><|endofimg|>`. vLLM's dots_ocr.py
    loads transformers' Qwen2VLProcessor itself (not the repository's DotsVLProcessor) and reads
    `Qwen2VLImageProcessor` from preprocessor_config.json, so the twin holds only that file, the
    tokenizer and the config (DotsOCRConfig through auto_map)."""
    from transformers import Qwen2VLImageProcessor
    from vllm.transformers_utils.configs.dotsocr import DotsOCRConfig

    # Qwen2.5's chat and vision tokens plus dots.ocr's own image tokens (<|imgpad|> is the one
    # vLLM expands per image patch).
    tokenizer = train_tokenizer(
        [
            *QWEN_SPECIAL_TOKENS,
            "<|imgpad|>",
            "<|img|>",
            "<|endofimg|>",
            "<|user|>",
            "<|assistant|>",
            "<|endofassistant|>",
        ],
        eos="<|endoftext|>",
        pad="<|endoftext|>",
    )
    # The real preprocessor: Qwen2-VL's, patch 14, merge 2, one frame per patch; only the pixel
    # budget is small (up to 64 image tokens a picture).
    image_processor = Qwen2VLImageProcessor(
        patch_size=14, temporal_patch_size=1, merge_size=2, min_pixels=3136, max_pixels=112 * 112
    )
    token_id = tokenizer.convert_tokens_to_ids
    config = DotsOCRConfig(
        **text_config(tokenizer),
        image_token_id=token_id("<|imgpad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_config={
            "embed_dim": 64,
            "hidden_size": HIDDEN,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 1,
        },
        tie_word_embeddings=False,
        architectures=[card.architecture],
    )
    values = config.to_dict()
    values["auto_map"] = {"AutoConfig": f"{DOTS_CONFIG_MODULE}.DotsOCRConfig"}
    (folder / "config.json").write_text(json.dumps(values, indent=2))
    (folder / f"{DOTS_CONFIG_MODULE}.py").write_text(DOTS_CONFIG_SOURCE)
    image_processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


BUILDERS: dict[str, Builder] = {"dots_ocr": _dots_ocr}

_REPO_PROCESSOR = (
    "the processor lives only in the model repository ({where}), which vLLM 0.32 reaches through "
    "AutoProcessor with trust_remote_code and neither vLLM nor transformers 5 carries; {detail}. "
    "A processor written here would not be the real one, and the repository cannot be fetched here"
)

WHY_NOT: dict[str, str] = {
    "keye_vl": _REPO_PROCESSOR.format(
        where="KeyeProcessor in processing_keye.py, its image processor in image_processing_keye.py",
        detail=(
            "vLLM's keye.py has no processor of its own and reads the repository processor's "
            "image_token/video_token and its image processor's size min_pixels/max_pixels and "
            "merge_size (the config, configuration_keye.py, is the repository's too)"
        ),
    ),
    "keye_vl1_5": _REPO_PROCESSOR.format(
        where="KeyeVL1_5Processor in processing_keye_vl_1_5.py, with image_processing_keye_vl_1_5.py",
        detail=(
            "vLLM's keye_vl1_5.py reads attributes only that class has (fast_start/fast_end, the "
            "tokens around the fast frames of its slow-fast video encoding) and its image "
            "processor's size min_pixels/max_pixels (the config class is the repository's too)"
        ),
    ),
    "ernie45_vl": _REPO_PROCESSOR.format(
        where="Ernie4_5_VLProcessor in processing_ernie4_5_vl.py, config in configuration_ernie4_5_vl.py",
        detail=(
            "vLLM's ernie45_vl.py needs what only those classes have: processor.spatial_conv_size/"
            "temporal_conv_size, processor outputs named 'images'/'grid_thw', image processor size "
            "min_pixels/max_pixels, and a flat config (spatial_conv_size, pixel_hidden_size, "
            "im_patch_id). transformers 5's Ernie4_5_VLMoeProcessor/Ernie4_5_VLMoeConfig "
            "(model_type ernie4_5_vl_moe) have none of them, so vLLM cannot run on them"
        ),
    ),
    "rvl": _REPO_PROCESSOR.format(
        where="R-4B's processor and configuration_r.py, named by its auto_map",
        detail=(
            "vLLM's rvl.py overrides get_hf_processor/get_hf_config with the untyped "
            "ctx.get_hf_processor()/ctx.get_hf_config(), and model_type 'rvl' is in neither "
            "transformers 5's auto mappings nor vLLM's config registry"
        ),
    ),
    "bee": _REPO_PROCESSOR.format(
        where="BeeProcessor in processing_bee.py and configuration_bee.py, named by its auto_map",
        detail=(
            "vLLM's bee.py overrides get_hf_processor/get_hf_config with the untyped "
            "ctx.get_hf_processor()/ctx.get_hf_config(), and model_type 'bee' is in neither "
            "transformers 5's auto mappings nor vLLM's config registry"
        ),
    ),
}
