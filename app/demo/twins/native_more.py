"""Twins of further architectures whose classes ship in transformers (Mistral 3, Cohere 2
Vision, Aria, Llama 4, Gemma 3n...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard
from app.demo.twins.common import (
    HEAD_DIM,
    HEADS,
    HIDDEN,
    LAYERS,
    MAX_POSITIONS,
    QWEN_SPECIAL_TOKENS,
    Builder,
    save,
    siglip_vision,
    text_config,
    train_tokenizer,
)

# --- shared pieces -------------------------------------------------------------------------


def _pixtral_vision(image_size: int, patch_size: int) -> dict[str, Any]:
    """A two-layer Pixtral tower (head size 32) for images up to `image_size` pixels."""
    return {
        "model_type": "pixtral",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "head_dim": 32,
        "image_size": image_size,
        "patch_size": patch_size,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


# --- builders, one per architecture --------------------------------------------------------


def _mistral3(card: ModelCard, folder: Path) -> None:
    """Mistral Small 3.1 (Hugging Face format): a Pixtral tower of patch 14 with 2x2 patch
    merging (images up to 112 px: rows of `[IMG]` closed by `[IMG_BREAK]`, then `[IMG_END]`)
    and a Mistral text model."""
    from transformers import Mistral3Config, PixtralImageProcessor, PixtralProcessor

    tokenizer = train_tokenizer(
        ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"],
        eos="</s>",
        bos="<s>",
        unk="<unk>",
    )
    image_processor = PixtralImageProcessor(size={"longest_edge": 112}, patch_size=14)
    processor = PixtralProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=14, spatial_merge_size=2
    )
    config = Mistral3Config(
        vision_config=_pixtral_vision(112, 14),
        text_config=text_config(tokenizer, model_type="mistral", head_dim=HEAD_DIM, sliding_window=None),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2,
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


# LightOnOCR's processor_config.json names Qwen's vision tokens for Pixtral's image, row break and end.
LIGHTONOCR_IMAGE_TOKENS = {
    "image_token": "<|image_pad|>",
    "image_break_token": "<|vision_pad|>",
    "image_end_token": "<|vision_end|>",
}


def _lightonocr(card: ModelCard, folder: Path) -> None:
    """LightOnOCR-1B: Mistral 3's layout (Pixtral tower of patch 14, 2x2 merge) over a Qwen3
    text model with Qwen's tokens; the image is `<|image_pad|>` (vLLM drops the row breaks)."""
    from transformers import Mistral3Config, PixtralImageProcessor, PixtralProcessor

    tokenizer = train_tokenizer(
        [*QWEN_SPECIAL_TOKENS, "<|vision_pad|>"], eos="<|im_end|>", pad="<|endoftext|>"
    )
    image_processor = PixtralImageProcessor(size={"longest_edge": 112}, patch_size=14)
    processor = PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        spatial_merge_size=2,
        **LIGHTONOCR_IMAGE_TOKENS,
    )
    config = Mistral3Config(
        # vLLM sizes LightOnOCR's images from the tower's image_size: the processor's edge.
        vision_config=_pixtral_vision(112, 14),
        text_config=text_config(tokenizer, model_type="qwen3", head_dim=HEAD_DIM),
        image_token_index=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        spatial_merge_size=2,
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        projector_hidden_act="gelu",
        tie_word_embeddings=True,
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _command_a_vision(card: ModelCard, folder: Path) -> None:
    """Command A Vision: a SigLIP tower on tiles of 56 px (4x4 patches, pixel shuffle by 2: 2x2
    `<|IMG_PATCH|>` a tile, each tile closed by `<|IMG_LINE_BREAK|>`, plus a thumbnail) and a
    Cohere 2 text model with its sliding-window layers."""
    from transformers import Cohere2VisionConfig, Cohere2VisionImageProcessor, Cohere2VisionProcessor

    image_tokens = {
        "boi_token": "<|START_OF_IMG|>",
        "eoi_token": "<|END_OF_IMG|>",
        "image_token": "<|IMG_PATCH|>",
        "img_line_break_token": "<|IMG_LINE_BREAK|>",
    }
    turns = ["<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>"]
    tokenizer = train_tokenizer(
        ["<PAD>", "<UNK>", "<BOS_TOKEN>", "<EOS_TOKEN>", *turns, "<|SYSTEM_TOKEN|>", *image_tokens.values()],
        eos="<|END_OF_TURN_TOKEN|>",
        bos="<BOS_TOKEN>",
        pad="<PAD>",
        unk="<UNK>",
        extra_special_tokens=image_tokens,
    )
    # `patch_size` here counts merged tokens along a tile's side: 56 px / 14 / 2 = 2.
    image_processor = Cohere2VisionImageProcessor(
        size={"height": 56, "width": 56}, patch_size=2, max_patches=12, crop_to_patches=True
    )
    processor = Cohere2VisionProcessor(image_processor=image_processor, tokenizer=tokenizer)
    config = Cohere2VisionConfig(
        vision_config={**siglip_vision(56), "vision_use_head": False},
        text_config=text_config(tokenizer, model_type="cohere2", sliding_window=512, logit_scale=0.0625),
        downsample_factor=2,
        alignment_intermediate_size=HIDDEN * 2,
        image_token_id=tokenizer.convert_tokens_to_ids("<|IMG_PATCH|>"),
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


ARIA_VOCAB = 100352


def _aria(card: ModelCard, folder: Path) -> None:
    """Aria: an Idefics3-style tower of patch 14 at the real crop sizes (490 and 980 px) with
    tiny widths, a cross-attention projector of 4 or 8 queries per crop, and a two-layer
    mixture-of-experts text model (4 experts, top 2, one shared)."""
    from transformers import AriaConfig, AriaImageProcessor, AriaProcessor

    tokenizer = train_tokenizer(
        ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<fim_prefix>", "<fim_suffix>", "<|img|>"],
        eos="</s>",
        bos="<s>",
        unk="<unk>",
        pad="</s>",
        extra_special_tokens={"image_token": "<|img|>"},
    )
    # The processor's own defaults resize to 980 px whatever the image processor says, so the
    # crop sizes stay real and only the queries per crop shrink (128/256 in the real model).
    processor = AriaProcessor(
        image_processor=AriaImageProcessor(max_image_size=980, min_image_size=490),
        tokenizer=tokenizer,
        size_conversion={490: 4, 980: 8},
    )
    config = AriaConfig(
        vision_config={
            "model_type": "idefics3_vision",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 980,
            "patch_size": 14,
        },
        text_config=text_config(
            tokenizer,
            model_type="aria_text",
            # The real vocabulary's size: the card's stop token ids (up to 93653) must be in it.
            vocab_size=ARIA_VOCAB,
            moe_num_experts=4,
            moe_topk=2,
            moe_num_shared_experts=1,
        ),
        projector_patch_to_query_dict={(490 // 14) ** 2: 4, (980 // 14) ** 2: 8},
        image_token_index=tokenizer.convert_tokens_to_ids("<|img|>"),
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _llama4(card: ModelCard, folder: Path) -> None:
    """Llama 4 Scout: a two-layer vision encoder on tiles of 56 px (patch 14, pixel shuffle 0.5:
    4 `<|patch|>` a tile, tiles split by the x/y separators, then the global tile) and a tiny
    mixture-of-experts text model (4 experts, top 1, MoE in every layer as in Scout; a
    chunked-attention RoPE layer and a global NoPE layer); the real chat template."""
    from transformers import Llama4Config, Llama4ImageProcessor, Llama4Processor
    from transformers.models.llama4 import processing_llama4

    image_tokens = [
        "<|image_start|>",
        "<|image_end|>",
        "<|image|>",
        "<|patch|>",
        "<|tile_x_separator|>",
        "<|tile_y_separator|>",
    ]
    tokenizer = train_tokenizer(
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|finetune_right_pad|>",
            "<|header_start|>",
            "<|header_end|>",
            "<|eot|>",
            *image_tokens,
        ],
        eos="<|eot|>",
        bos="<|begin_of_text|>",
        pad="<|finetune_right_pad|>",
        # The template transformers ships for Llama 4 is the model's own.
        chat_template=processing_llama4.chat_template,
    )
    processor = Llama4Processor(
        image_processor=Llama4ImageProcessor(size={"height": 56, "width": 56}, max_patches=16),
        tokenizer=tokenizer,
        patch_size=14,
        pixel_shuffle_ratio=0.5,
    )
    token_id = tokenizer.convert_tokens_to_ids
    config = Llama4Config(
        vision_config={
            "hidden_size": 64,
            # Pixel shuffle by 0.5 gives 4 x hidden channels, which the adapter MLP takes in.
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 56,
            "patch_size": 14,
            "pixel_shuffle_ratio": 0.5,
            "projector_input_dim": HIDDEN,
            "projector_output_dim": HIDDEN,
            "vision_output_dim": HIDDEN,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
        text_config=text_config(
            tokenizer,
            model_type="llama4_text",
            head_dim=HEAD_DIM,
            intermediate_size=HIDDEN,
            intermediate_size_mlp=HIDDEN * 2,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=1,
            no_rope_layer_interval=2,
            attention_chunk_size=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        ),
        boi_token_index=token_id("<|image_start|>"),
        eoi_token_index=token_id("<|image_end|>"),
        image_token_index=token_id("<|image|>"),
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


STEP3_FP8 = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
}


def _step3(card: ModelCard, folder: Path) -> None:
    """Step3 (FP8): vLLM's Step3VLConfig and processor (a 728 px image, 169 `<im_patch>`, plus
    504 px windows of 81), a two-layer ViT of the real image and patch sizes with tiny widths,
    and a Step3 text model (one dense layer, one MoE layer) quantized as the real model is."""
    from vllm.transformers_utils.configs.step3_vl import Step3VLConfig

    media = ["<im_patch>", "<im_start>", "<im_end>", "<patch_start>", "<patch_end>", "<patch_newline>"]
    tokenizer = train_tokenizer(
        ["<|begin▁of▁sentence|>", "<|end▁of▁sentence|>", "<|BOT|>", "<|EOT|>", "<think>", "</think>", *media],
        eos="<|end▁of▁sentence|>",
        bos="<|begin▁of▁sentence|>",
        pad="<|end▁of▁sentence|>",
    )
    config = Step3VLConfig(
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "output_hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 728,
            "patch_size": 14,
        },
        text_config={
            "architectures": ["Step3TextForCausalLM"],
            "vocab_size": len(tokenizer),
            "hidden_size": HIDDEN,
            "intermediate_size": HIDDEN * 2,
            "num_attention_heads": HEADS,
            "num_attention_groups": 1,
            "num_hidden_layers": LAYERS,
            "head_dim": HEAD_DIM,
            "share_q_dim": HIDDEN,
            "moe_intermediate_size": HIDDEN,
            "moe_num_experts": 4,
            "moe_top_k": 2,
            "share_expert_dim": HIDDEN,
            "moe_layers_enum": "1",
            "max_position_embedding": MAX_POSITIONS,
            "max_seq_len": MAX_POSITIONS,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
        understand_projector_stride=2,
        projector_bias=False,
        image_token_id=tokenizer.convert_tokens_to_ids("<im_patch>"),
        quantization_config=STEP3_FP8,
        architectures=[card.architecture],
    )
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _gemma3n(card: ModelCard, folder: Path) -> None:
    """Gemma 3n E2B: the MobileNet-V5 tower (timm builds it at its real size from the
    architecture name; its 16x16 output, 256 soft tokens, does not depend on the input size, so
    images are 256 px instead of 768), a tiny conformer audio tower, and a two-layer Gemma 3n
    text model (AltUp, LAuReL, per-layer inputs, one sparse layer) of head size 32."""
    from tokenizers import AddedToken
    from transformers import (
        Gemma3nAudioFeatureExtractor,
        Gemma3nConfig,
        Gemma3nProcessor,
        SiglipImageProcessor,
    )

    media_tokens = {
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
        "boa_token": "<start_of_audio>",
        "eoa_token": "<end_of_audio>",
        "audio_token": "<audio_soft_token>",
    }
    tokenizer = train_tokenizer(
        ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", *media_tokens.values()],
        eos="<eos>",
        bos="<bos>",
        pad="<pad>",
        unk="<unk>",
        extra_special_tokens=media_tokens,
    )
    # Gemma's SentencePiece vocabulary holds runs of newlines; the processor wraps media in "\n\n".
    tokenizer.add_tokens([AddedToken("\n" * n, normalized=False) for n in range(1, 5)])
    processor = Gemma3nProcessor(
        feature_extractor=Gemma3nAudioFeatureExtractor(),
        image_processor=SiglipImageProcessor(size={"height": 256, "width": 256}),
        tokenizer=tokenizer,
        image_seq_length=256,
        audio_seq_length=188,
    )
    vocab = len(tokenizer)
    token_id = tokenizer.convert_tokens_to_ids
    config = Gemma3nConfig(
        text_config=text_config(
            tokenizer,
            model_type="gemma3n_text",
            head_dim=HEAD_DIM,
            vocab_size_per_layer_input=vocab,
            hidden_size_per_layer_input=32,
            laurel_rank=16,
            altup_num_inputs=4,
            num_kv_shared_layers=0,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=512,
            activation_sparsity_pattern=[0.95, 0.0],
            hidden_activation="gelu_pytorch_tanh",
        ),
        vision_config={
            "architecture": "mobilenetv5_300m_enc",
            "hidden_size": 2048,
            "vocab_size": 128,
            "vocab_offset": vocab,
        },
        audio_config={
            "hidden_size": 64,
            "conf_num_attention_heads": 2,
            "conf_num_hidden_layers": 1,
            "sscp_conv_channel_size": [32, 16],
            "vocab_size": 128,
            "vocab_offset": vocab + 128,
        },
        vision_soft_tokens_per_image=256,
        audio_soft_tokens_per_image=188,
        boi_token_id=token_id("<start_of_image>"),
        eoi_token_id=token_id("<end_of_image>"),
        image_token_id=token_id("<image_soft_token>"),
        boa_token_id=token_id("<start_of_audio>"),
        eoa_token_id=token_id("<end_of_audio>"),
        audio_token_id=token_id("<audio_soft_token>"),
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


# Card key -> builder writing the twin's files into a folder.
BUILDERS: dict[str, Builder] = {
    "mistral3": _mistral3,
    "lightonocr": _lightonocr,
    "command_a_vision": _command_a_vision,
    "aria": _aria,
    "llama4": _llama4,
    "gemma3n": _gemma3n,
}


def _remote_processor(processor: str, where: str) -> str:
    return (
        f"the processor class ({processor}) lives only in the model repository ({where}, named by "
        "its auto_map), and vLLM's model code calls it through AutoProcessor (ctx.get_hf_processor() "
        "with no class of its own); neither vLLM 0.32 nor transformers carries it, and it cannot be "
        "fetched here"
    )


# Cards that cannot have a twin here, and precisely why.
WHY_NOT: dict[str, str] = {
    "step3": (
        "FP8 weights (quantization_config: fp8, e4m3, weight_block_size [128, 128]): every FP8 "
        "linear kernel of vLLM 0.32's CPU backend requires AMX tiles ('CPUFp8W8A8BlockScaledMMKernel "
        "requires AMX tile support (Sapphire Rapids or newer)'), which these CPUs lack, so the "
        "engine fails while building the model. Tried: the same twin without the quantization "
        "config passes one image, multi-turn and the system prompt; _step3 is ready for a GPU or "
        "an AMX CPU."
    ),
    "phi3_v": _remote_processor("Phi3VProcessor", "processing_phi3_v.py"),
    "phi4_mm": _remote_processor("Phi4MMProcessor", "processing_phi4mm.py"),
    "molmo": _remote_processor("MolmoProcessor", "preprocessing_molmo.py"),
}
