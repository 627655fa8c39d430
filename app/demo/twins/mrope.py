"""Twins of Qwen-style multimodal-RoPE architectures beyond Qwen2/2.5/3-VL and GLM-4.1V:
Qwen3-VL-MoE, GLM-4.5V (MoE), Qwen2.5-Omni's thinker, HunyuanOCR.

The mixture-of-experts variants reuse the dense twins of app.demo.twins.native (same tokenizer,
processor and vision tower) and swap the config for the MoE class with a few tiny experts.
`_glm4_5v_fp8` is written and tried but not registered: vLLM's CPU backend cannot run its FP8
experts (WHY_NOT says precisely why); it is ready for a machine that can. HunyuanOCR runs with
the CPU environment's oneDNN stride fix (scripts/setup-cpu-env.sh).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard
from app.demo.twins import native
from app.demo.twins.common import (
    HEAD_DIM,
    HIDDEN,
    QWEN2_5_VL_VISION,
    Builder,
    mrope_section,
    save,
    text_config,
    train_tokenizer,
)

# Experts per MoE layer and experts per token: a few, as small as the MoE kernels take.
EXPERTS, EXPERTS_PER_TOKEN, EXPERT_SIZE = 4, 2, 64


def _dense_config(folder: Path) -> dict[str, Any]:
    """The config the dense builder wrote, as a plain dict to build the MoE config from."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder).to_dict()


def _qwen3_vl_moe(card: ModelCard, folder: Path) -> None:
    """Qwen3-VL-MoE: the Qwen3-VL twin (tokenizer, processor, ViT) with a Qwen3-MoE text model
    of 4 experts (2 per token) in every layer."""
    from transformers import Qwen3VLMoeConfig

    native.BUILDERS["qwen3_vl"](card, folder)
    dense = _dense_config(folder)
    text = {
        **dense["text_config"],
        "model_type": "qwen3_vl_moe_text",
        "num_experts": EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "moe_intermediate_size": EXPERT_SIZE,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    }
    vision = {**dense["vision_config"], "model_type": "qwen3_vl_moe_vision"}
    config = Qwen3VLMoeConfig(
        text_config=text,
        vision_config=vision,
        **_token_ids(
            dense, "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"
        ),
        tie_word_embeddings=False,
        architectures=[card.architecture],
    )
    config.save_pretrained(folder)


def _glm4_5v(card: ModelCard, folder: Path) -> None:
    """GLM-4.5V: the GLM-4.1V twin (tokenizer, processor, ViT) with a GLM-4.5 MoE text model:
    one dense first layer, then 4 routed experts (2 per token) and a shared expert."""
    from transformers import Glm4vMoeConfig

    native.BUILDERS["glm4_1v"](card, folder)
    config = Glm4vMoeConfig(**_glm4_5v_fields(card, _dense_config(folder)))
    config.save_pretrained(folder)


# GLM-4.5V-FP8's quantization: compressed-tensors FP8, weights per output channel and
# activations per token (dynamic); the router gates, the vision tower and the head stay BF16.
GLM4_5V_FP8_QUANTIZATION: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "float",
                "symmetric": True,
                "strategy": "channel",
                "dynamic": False,
            },
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "symmetric": True,
                "strategy": "token",
                "dynamic": True,
            },
        }
    },
    "ignore": ["lm_head", "re:.*visual.*", "re:.*mlp[.]gate$"],
}


def _glm4_5v_fp8(card: ModelCard, folder: Path) -> None:
    """GLM-4.5V-FP8: the GLM-4.5V twin with the real model's FP8 quantization config."""
    from transformers import Glm4vMoeConfig

    native.BUILDERS["glm4_1v"](card, folder)
    fields = _glm4_5v_fields(card, _dense_config(folder))
    config = Glm4vMoeConfig(**fields, quantization_config=GLM4_5V_FP8_QUANTIZATION)
    config.save_pretrained(folder)


def _glm4_5v_fields(card: ModelCard, dense: dict[str, Any]) -> dict[str, Any]:
    text = {
        **dense["text_config"],
        "model_type": "glm4v_moe_text",
        "head_dim": dense["text_config"]["hidden_size"] // dense["text_config"]["num_attention_heads"],
        "attention_bias": True,
        "n_routed_experts": EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "n_shared_experts": 1,
        "moe_intermediate_size": EXPERT_SIZE,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "use_qk_norm": False,
    }
    vision = {**dense["vision_config"], "model_type": "glm4v_moe_vision"}
    ids = _token_ids(
        dense,
        "image_token_id",
        "video_token_id",
        "image_start_token_id",
        "image_end_token_id",
        "video_start_token_id",
        "video_end_token_id",
    )
    return {
        "text_config": text,
        "vision_config": vision,
        **ids,
        "tie_word_embeddings": False,
        "architectures": [card.architecture],
    }


def _qwen2_5_omni(card: ModelCard, folder: Path) -> None:
    """Qwen2.5-Omni: the thinker vLLM runs (Qwen2.5-VL's windowed ViT of depth 2, a Whisper-style
    audio tower of 2 layers, a Qwen2 text model with M-RoPE); talker and token2wav configs keep
    their defaults, since vLLM builds only the thinker. Omni names its media tokens
    `<|IMAGE|>`, `<|VIDEO|>`, `<|AUDIO|>` between `<|vision_bos|>`/`<|vision_eos|>` and
    `<|audio_bos|>`/`<|audio_eos|>`; the processor finds them as the tokenizer's named tokens."""
    from transformers import (
        Qwen2_5OmniConfig,
        Qwen2_5OmniProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        WhisperFeatureExtractor,
    )

    media = {
        "image_token": "<|IMAGE|>",
        "video_token": "<|VIDEO|>",
        "audio_token": "<|AUDIO|>",
        "vision_bos_token": "<|vision_bos|>",
        "vision_eos_token": "<|vision_eos|>",
        "audio_bos_token": "<|audio_bos|>",
        "audio_eos_token": "<|audio_eos|>",
    }
    tokenizer = train_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *media.values()],
        eos="<|im_end|>",
        pad="<|endoftext|>",
        extra_special_tokens=media,
    )
    processor = Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(),
        video_processor=Qwen2VLVideoProcessor(),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tokenizer,
    )
    token_id = tokenizer.convert_tokens_to_ids
    thinker = {
        "text_config": text_config(
            tokenizer,
            model_type="qwen2_5_omni_text",
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": mrope_section(HEAD_DIM),
            },
            tie_word_embeddings=False,
        ),
        "vision_config": QWEN2_5_VL_VISION,
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128,
            "d_model": 64,
            "output_dim": HIDDEN,
        },
        "image_token_index": token_id("<|IMAGE|>"),
        "video_token_index": token_id("<|VIDEO|>"),
        "audio_token_index": token_id("<|AUDIO|>"),
        "audio_start_token_id": token_id("<|audio_bos|>"),
        "audio_end_token_id": token_id("<|audio_eos|>"),
        "user_token_id": token_id("user"),
    }
    config = Qwen2_5OmniConfig(thinker_config=thinker, architectures=[card.architecture])
    save(folder, config, processor, tokenizer)


# HunyuanOCR's named tokens: the image span is start (100), image (102), end (101); 103 is the
# row separator the config names `im_newline_id`.
HUNYUAN_TOKENS = {
    "image_start_token": "<|hy_place▁holder▁no▁100|>",
    "image_end_token": "<|hy_place▁holder▁no▁101|>",
    "image_token": "<|hy_place▁holder▁no▁102|>",
}
HUNYUAN_NEWLINE = "<|hy_place▁holder▁no▁103|>"


def _hunyuan_vl(card: ModelCard, folder: Path) -> None:
    """HunyuanOCR: the HunYuan ViT (patch 16, 2x2 conv merger, a newline token per row; depth 2)
    at 64 to 128 px, and a HunYuan dense text model with XD-RoPE (four sections, NTK alpha).
    vLLM runs it through its Transformers backend with transformers' own model code."""
    from transformers import HunYuanVLConfig, HunYuanVLImageProcessor, HunYuanVLProcessor

    # bos and the image tokens are the card's; eos and pad names are assumed (the repository's
    # tokenizer_config.json could not be read here), which matters only for stopping.
    bos, eos, pad = "<|hy_begin▁of▁sentence|>", "<|hy_place▁holder▁no▁2|>", "<|hy_▁pad▁|>"
    tokenizer = train_tokenizer(
        [pad, bos, eos, "<|hy_User|>", "<|hy_Assistant|>", *HUNYUAN_TOKENS.values(), HUNYUAN_NEWLINE],
        eos=eos,
        bos=bos,
        pad=pad,
        extra_special_tokens=HUNYUAN_TOKENS,
    )
    image_processor = HunYuanVLImageProcessor(min_pixels=64 * 64, max_pixels=128 * 128)
    processor = HunYuanVLProcessor(image_processor=image_processor, tokenizer=tokenizer)
    token_id = tokenizer.convert_tokens_to_ids
    config = HunYuanVLConfig(
        text_config=text_config(
            tokenizer,
            model_type="hunyuan_vl_text",
            head_dim=HEAD_DIM,
            # XD-RoPE: the real model's "xdrope" with NTK alpha, four position sections.
            rope_parameters={
                "rope_type": "xdrope",
                "rope_theta": 10000.0,
                "alpha": 1000.0,
                "factor": 1.0,
                "xdrope_section": [HEAD_DIM // 8] * 4,
            },
            eod_token_id=token_id(eos),
            sep_token_id=token_id(pad),
            tie_word_embeddings=True,
        ),
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "out_hidden_size": HIDDEN,
            "max_image_size": 128,
            "min_image_size": 64,
        },
        image_token_id=token_id(HUNYUAN_TOKENS["image_token"]),
        im_start_id=token_id(HUNYUAN_TOKENS["image_start_token"]),
        im_end_id=token_id(HUNYUAN_TOKENS["image_end_token"]),
        im_newline_id=token_id(HUNYUAN_NEWLINE),
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _token_ids(dense: dict[str, Any], *names: str) -> dict[str, int]:
    return {name: dense[name] for name in names}


BUILDERS: dict[str, Builder] = {
    "qwen3_vl_moe": _qwen3_vl_moe,
    "glm4_5v": _glm4_5v,
    "qwen2_5_omni": _qwen2_5_omni,
    "hunyuan_vl": _hunyuan_vl,
}

# Cards that cannot have a twin here, and precisely why (each tried with its builder above).
WHY_NOT: dict[str, str] = {
    "glm4_5v_fp8": (
        "FP8 MoE experts need x86 AMX, which this CPU lacks: the twin (_glm4_5v_fp8, the GLM-4.5V "
        "twin with the compressed-tensors FP8 quantization_config) loads its FP8 linear layers "
        "(ChannelWiseTorchFP8ScaledMMLinearKernel) but vLLM 0.32's CPU FP8 MoE kernels "
        "(CPUExpertsFp8, CPUExpertsFp8W8A8 in fused_moe/experts/cpu_moe.py) require AMX tiles "
        "(Sapphire Rapids or newer; W8A8 also AMX-FP8, and the W8A16 one takes 128x128-block "
        "weights only), so loading fails with 'ValueError: Unsupported FP8 MoE backend: NONE' "
        "(compressed_tensors_moe_w8a8_fp8.process_weights_after_loading). A twin without the "
        "quantization would be the glm4_5v card's, which has one."
    ),
}
