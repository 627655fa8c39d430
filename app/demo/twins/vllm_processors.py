"""Twins of models whose processor (and often config) the installed vLLM carries itself.

DeepSeek-VL2 and DeepSeek-OCR (vLLM's DeepseekVLV2Config and processors, a DeepSeek-V2 MoE),
Ovis2 (vLLM's OvisConfig and OvisProcessor), Ovis2.5 (vLLM's Ovis2_5Processor; the
repository's configuration class is remote code, so the twin holds a minimal one written here)
and GLM-4V (vLLM's ChatGLMConfig and GLM4VProcessor, with a stand-in for the repository's
tokenizer). Kimi-VL and MiniCPM-V/o need processor classes that only their model repositories
hold: WHY_NOT says which.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard
from app.demo.twins.common import (
    HEAD_DIM,
    HEADS,
    HIDDEN,
    KV_HEADS,
    LAYERS,
    MAX_POSITIONS,
    TRAINING_TEXT,
    Builder,
    text_config,
    train_tokenizer,
)

# Qwen2/2.5/3's special tokens in the order of their ids, from 151643 on.
QWEN_TEXT_VOCAB = 151643
QWEN_SPECIALS_BY_ID = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
QWEN3_SPECIALS = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
# A Qwen text model's embedding rows (the tokenizer's ids end below this).
QWEN_EMBEDDINGS = 151936

# ChatML as the Qwen2 family (Ovis2's text models) writes it, with Qwen2's default system prompt.
QWEN2_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] != 'system' %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The Ovis2.5 repository's configuration is remote code that neither vLLM nor transformers
# carries: the twin holds this minimal stand-in, written here, with only the fields vLLM reads.
OVIS2_5_CONFIGURATION = '''"""Minimal Ovis2.5 configuration for a tiny test twin (VLM Playground), not the
model repository's code: it holds the fields vLLM's ovis2_5.py and siglip2navit.py read."""

from transformers import AutoConfig, PretrainedConfig


class Siglip2NavitConfig(PretrainedConfig):
    model_type = "siglip2_navit"

    def __init__(
        self,
        hidden_size=1152,
        intermediate_size=4304,
        num_hidden_layers=27,
        num_attention_heads=16,
        num_channels=3,
        num_patches=-1,
        image_size=512,
        patch_size=16,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
        attention_dropout=0.0,
        hidden_stride=2,
        window_size=112,
        fullatt_block_indexes=None,
        temporal_patch_size=1,
        preserve_original_pe=True,
        use_rope=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_channels = num_channels
        self.num_patches = num_patches
        self.image_size = image_size
        self.patch_size = patch_size
        self.hidden_act = hidden_act
        self.layer_norm_eps = layer_norm_eps
        self.attention_dropout = attention_dropout
        self.hidden_stride = hidden_stride
        self.window_size = window_size
        self.fullatt_block_indexes = fullatt_block_indexes
        self.temporal_patch_size = temporal_patch_size
        self.preserve_original_pe = preserve_original_pe
        self.use_rope = use_rope


class Ovis2_5_Config(PretrainedConfig):
    model_type = "ovis2_5"

    def __init__(
        self,
        llm_config=None,
        vit_config=None,
        visual_vocab_size=65536,
        hidden_size=None,
        conversation_formatter_class=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(llm_config, dict):
            llm_config = dict(llm_config)
            llm_config = AutoConfig.for_model(llm_config.pop("model_type"), **llm_config)
        if isinstance(vit_config, dict):
            vit_config = dict(vit_config)
            vit_config.pop("model_type", None)
            vit_config = Siglip2NavitConfig(**vit_config)
        self.llm_config = llm_config
        self.vit_config = vit_config
        self.visual_vocab_size = visual_vocab_size
        self.hidden_size = hidden_size
        self.conversation_formatter_class = conversation_formatter_class
'''

# GLM-4's special tokens in the order of their ids, from 151329 on (glm-4v-9b's
# tokenizer_config.json); config.json's pad (the image token), boi and eoi ids point into them.
GLM4_TEXT_VOCAB = 151329
GLM4_SPECIALS_BY_ID = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
]
# GLM-4V 9B's embedding rows (padded_vocab_size).
GLM4_EMBEDDINGS = 151552


# --- pieces ---------------------------------------------------------------------------------


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_config(folder: Path, config: dict[str, Any]) -> None:
    """config.json as save_pretrained writes it: with the transformers version (without one,
    transformers takes a local tokenizer for a Mistral one and warns about its regex)."""
    import transformers

    _write_json(folder / "config.json", {**config, "transformers_version": transformers.__version__})


def _save_tokenizer(folder: Path, tokenizer: Any, tokenizer_class: str) -> None:
    """Saves the tokenizer under the class name the real repository's tokenizer_config.json gives."""
    tokenizer.save_pretrained(folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = tokenizer_class
    _write_json(path, config)


def _bpe_with_specials_from(first_id: int, specials: list[str]) -> Any:
    """A byte-level BPE trained on a few lines whose special tokens sit at the real model's ids,
    from `first_id` on: the learned vocabulary is padded with unreachable entries up to it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=512, initial_alphabet=alphabet, show_progress=False)
    bpe.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    state = json.loads(bpe.to_str())
    vocab = state["model"]["vocab"]
    # No merge produces these, so no text ever encodes to them.
    vocab.update({f"<|twin_unused_{i}|>": i for i in range(len(vocab), first_id)})
    bpe = Tokenizer.from_str(json.dumps(state))
    bpe.add_special_tokens(specials)
    return bpe


def _qwen_tokenizer_at_real_ids(extra: list[str], chat_template: str | None = None) -> Any:
    """Qwen's special tokens at their real ids: vLLM's Ovis code hard-codes some (`<|image_pad|>`
    151655, Ovis2.5's indicators 151672-5)."""
    from transformers import PreTrainedTokenizerFast

    specials = [*QWEN_SPECIALS_BY_ID, *extra]
    bpe = _bpe_with_specials_from(QWEN_TEXT_VOCAB, specials)
    named = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, additional_special_tokens=specials[3:], model_max_length=MAX_POSITIONS, **named
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def _deepseek_tokenizer(extra: list[str]) -> Any:
    """DeepSeek's byte-level BPE (its repositories name it LlamaTokenizerFast; transformers loads
    it as it is for DeepSeek model types) with BOS 0, EOS 1 and the model's other special tokens."""
    return train_tokenizer(
        ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", *extra],
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
        pad="<｜▁pad▁｜>",
    )


def _deepseek_v2_text(tokenizer: Any) -> dict[str, Any]:
    """DeepSeek-V2 language config as DeepSeek-VL2 Tiny ships it (MoE, no MLA: multi-head
    attention), at the shared sizes: one dense layer, then one MoE layer of 4 small experts."""
    return {
        "model_type": "deepseek_v2",
        "architectures": ["DeepseekV2ForCausalLM"],
        "vocab_size": len(tokenizer),
        "hidden_size": HIDDEN,
        "intermediate_size": HIDDEN * 2,
        "moe_intermediate_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "kv_lora_rank": None,
        "q_lora_rank": None,
        "qk_nope_head_dim": 0,
        "qk_rope_head_dim": 0,
        "v_head_dim": 0,
        "use_mla": False,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


# --- builders, one per architecture --------------------------------------------------------


def _deepseek_vl_v2(card: ModelCard, folder: Path) -> None:
    """DeepSeek-VL2 Tiny: vLLM's config and processor (DeepseekVLV2Processor, named in
    processor_config.json), tiles of 56 px instead of 384. vLLM builds the SigLIP-so400m tower
    through timm (a requirement) at its real size whatever the config says; it takes 56 px tiles."""
    grounding = ["<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<|grounding|>"]
    tokenizer = _deepseek_tokenizer(["<image>", *grounding, "<|User|>", "<|Assistant|>"])
    tile = 56
    resolutions = [[tile * h, tile * w] for h in (1, 2) for w in (1, 2)]
    config = {
        "architectures": [card.architecture],
        "model_type": "deepseek_vl_v2",
        "candidate_resolutions": resolutions,
        "global_view_pos": "head",
        "tile_tag": "2D",
        "language_config": _deepseek_v2_text(tokenizer),
        "projector_config": {
            "model_type": "mlp_projector",
            "projector_type": "downsample_mlp_gelu",
            "input_dim": 1152,
            "n_embed": HIDDEN,
            "depth": 2,
            "mlp_ratio": 1,
            "downsample_ratio": 2,
            "token_pooling": False,
        },
        "vision_config": {
            "model_type": "vision",
            "model_name": "siglip_so400m_patch14_384",
            "image_size": tile,
            "patch_size": 14,
            "width": 1152,
            "layers": 27,
            "mlp_ratio": 3.7362,
            "global_pool": "map",
            "ignore_head": True,
            "class_token": False,
            "num_classes": 0,
            "use_checkpoint": False,
        },
    }
    _write_config(folder, config)
    _write_json(
        folder / "processor_config.json",
        {
            "processor_class": "DeepseekVLV2Processor",
            "candidate_resolutions": resolutions,
            "patch_size": 14,
            "downsample_ratio": 2,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "normalize": True,
            "image_token": "<image>",
            "pad_token": "<｜▁pad▁｜>",
            "add_special_token": False,
            "sft_format": "deepseek",
            "mask_prompt": False,
            "ignore_id": -100,
        },
    )
    _save_tokenizer(folder, tokenizer, "LlamaTokenizerFast")


def _deepseek_ocr(card: ModelCard, folder: Path) -> None:
    """DeepSeek-OCR: vLLM's DeepSeek-VL2 config class and its DeepseekOCRProcessor, a DeepSeek-V2
    MoE at the shared sizes. The SAM-B and CLIP-L encoders and the 1024/640 px views are fixed in
    vLLM's code (not read from the config), so this twin's vision side is the real model's size."""
    tokenizer = _deepseek_tokenizer(["<image>"])
    config = {
        "architectures": [card.architecture],
        "model_type": "deepseek_vl_v2",
        "candidate_resolutions": [[1024, 1024]],
        "global_view_pos": "head",
        "tile_tag": "2D",
        "language_config": _deepseek_v2_text(tokenizer),
        # The concatenated CLIP-L and SAM-B features (1024 + 1024) mapped onto the text width.
        "projector_config": {
            "model_type": "mlp_projector",
            "projector_type": "linear",
            "input_dim": 2048,
            "n_embed": HIDDEN,
        },
        "vision_config": {"model_type": "vision", "model_name": "deeplip_b_l", "image_size": 1024},
    }
    _write_config(folder, config)
    _save_tokenizer(folder, tokenizer, "LlamaTokenizerFast")


def _ovis(card: ModelCard, folder: Path) -> None:
    """Ovis2: vLLM's OvisConfig and OvisProcessor, an AIMv2 visual tokenizer (2 layers, 56 px
    crops, a visual vocabulary of 256) and a Qwen2 with Qwen2.5's tokenizer and chat template."""
    from transformers import CLIPImageProcessor

    tokenizer = _qwen_tokenizer_at_real_ids([], chat_template=QWEN2_CHAT_TEMPLATE)
    config = {
        "architectures": [card.architecture],
        "model_type": "ovis",
        "hidden_size": HIDDEN,
        "multimodal_max_length": MAX_POSITIONS,
        "llm_config": text_config(
            tokenizer, model_type="qwen2", vocab_size=QWEN_EMBEDDINGS, tie_word_embeddings=True
        ),
        "visual_tokenizer_config": {
            "model_type": "aimv2_visual_tokenizer",
            "vocab_size": 256,
            "tokenize_function": "softmax",
            "tau": 1.0,
            "hidden_stride": 2,
            "drop_cls_token": False,
            "backbone_config": {
                "model_type": "aimv2",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "image_size": 56,
                "patch_size": 14,
                "rms_norm_eps": 1e-5,
                "qkv_bias": False,
                "mlp_bias": False,
            },
        },
    }
    _write_config(folder, config)
    # OvisProcessor pads each crop to a square of the image processor's shortest edge.
    CLIPImageProcessor(size={"shortest_edge": 56}, do_center_crop=False).save_pretrained(folder)
    _save_tokenizer(folder, tokenizer, "Qwen2Tokenizer")


def _ovis2_5(card: ModelCard, folder: Path) -> None:
    """Ovis2.5: vLLM's Ovis2_5Processor, a SigLIP2-NaViT visual tokenizer (2 layers, one windowed
    and one full-attention block, a visual vocabulary of 256) and a Qwen3 at the shared sizes. The
    repository's configuration class is remote code: a minimal stand-in is written beside it."""
    from transformers import SiglipImageProcessor

    # Ovis2.5's own tokens follow Qwen3's, from 151669 on; vLLM finds the four indicators by id.
    ovis_tokens = ["<image>", "<video>", "<ovis_visual_atom>", "<ovis_image_start>", "<ovis_image_end>"]
    ovis_tokens += ["<ovis_video_start>", "<ovis_video_end>"]
    tokenizer = _qwen_tokenizer_at_real_ids([*QWEN3_SPECIALS, *ovis_tokens])
    config = {
        "architectures": [card.architecture],
        "model_type": "ovis2_5",
        "auto_map": {"AutoConfig": "configuration_ovis2_5.Ovis2_5_Config"},
        "hidden_size": HIDDEN,
        "visual_vocab_size": 256,
        "llm_config": text_config(
            tokenizer,
            model_type="qwen3",
            vocab_size=QWEN_EMBEDDINGS,
            head_dim=HEAD_DIM,
            tie_word_embeddings=True,
        ),
        "vit_config": {
            "model_type": "siglip2_navit",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_channels": 3,
            "num_patches": -1,
            "image_size": 512,
            "patch_size": 16,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "hidden_stride": 2,
            "window_size": 112,
            "fullatt_block_indexes": "1",
            "temporal_patch_size": 1,
            "preserve_original_pe": True,
            "use_rope": True,
        },
    }
    _write_config(folder, config)
    (folder / "configuration_ovis2_5.py").write_text(OVIS2_5_CONFIGURATION, encoding="utf-8")
    # Ovis2_5Processor resizes each image itself (448 to 1792 px per side) before this.
    SiglipImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(folder)
    _save_tokenizer(folder, tokenizer, "Qwen2Tokenizer")


def _glm4v(card: ModelCard, folder: Path) -> None:
    """GLM-4V 9B: vLLM's ChatGLMConfig (model_type chatglm) with a 2-layer EVA2-CLIP tower on
    112 px images (16 image tokens) and a 2-layer GLM-4 at the shared sizes; vLLM builds its own
    GLM4VProcessor and GLM4VImageProcessorFast from the config, so the folder holds no processor.

    The tokenizer's class differs from the real one: glm-4v-9b's ChatGLM4Tokenizer (tiktoken,
    tokenization_chatglm.py) is remote code that cannot be fetched here, so a PreTrainedTokenizerFast
    stands in. It is faithful for what the twin tests: GLM-4's special tokens sit at their real ids
    (the card's stop ids and config.json's image, boi and eoi ids name the same tokens as on the real
    model), and encoding with special tokens prepends `[gMASK]<sop>` as ChatGLM4Tokenizer's
    build_inputs_with_special_tokens does, so the prompt vLLM sees has the real model's shape.
    config.json names GLM4VForCausalLM, as the card's hf_overrides make the real ChatGLMModel."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from vllm.transformers_utils.configs.chatglm import ChatGLMConfig

    bpe = _bpe_with_specials_from(GLM4_TEXT_VOCAB, GLM4_SPECIALS_BY_ID)
    prefix = [(token, bpe.token_to_id(token)) for token in ("[gMASK]", "<sop>")]
    bpe.post_processor = processors.TemplateProcessing(
        single="[gMASK] <sop> $A", pair="[gMASK] <sop> $A $B", special_tokens=prefix
    )
    named = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        **named,
        additional_special_tokens=GLM4_SPECIALS_BY_ID[1:],
        model_max_length=MAX_POSITIONS,
        padding_side="left",
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in GLM4_SPECIALS_BY_ID}
    image_size, patch_size = 112, 14
    config = ChatGLMConfig(
        architectures=[card.architecture],
        num_layers=LAYERS,
        padded_vocab_size=GLM4_EMBEDDINGS,
        hidden_size=HIDDEN,
        ffn_hidden_size=HIDDEN * 2,
        kv_channels=HEAD_DIM,
        num_attention_heads=HEADS,
        multi_query_attention=True,
        multi_query_group_num=KV_HEADS,
        seq_length=8192,
        add_qkv_bias=True,
        layernorm_epsilon=1.5625e-07,
        # glm-4v-9b's rotary embedding as vLLM's chatglm.py reads it (not NeoX style).
        original_rope=True,
        tie_word_embeddings=False,
        # vLLM's glm4v.py: the image placeholder is the pad token, framed by boi and eoi.
        pad_token_id=ids["<|endoftext|>"],
        boi_token_id=ids["<|begin_of_image|>"],
        eoi_token_id=ids["<|end_of_image|>"],
        eos_token_id=[ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_heads": 2,
            "in_channels": 3,
            "image_size": image_size,
            "patch_size": patch_size,
            # The patches plus the class embedding.
            "num_positions": (image_size // patch_size) ** 2 + 1,
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-6,
            "dropout_prob": 0.0,
            "scaling_factor": 8,
        },
    )
    # glm-4v-9b's config.json also spells the depth num_hidden_layers (save_pretrained writes only
    # num_layers, which ChatGLMConfig maps it to): the app's memory estimate reads that name.
    _write_config(folder, {**config.to_dict(), "num_hidden_layers": LAYERS})
    # A transformers class, so AutoTokenizer loads it without the repository's code.
    _save_tokenizer(folder, tokenizer, "PreTrainedTokenizerFast")


BUILDERS: dict[str, Builder] = {
    "deepseek_vl_v2": _deepseek_vl_v2,
    "deepseek_ocr": _deepseek_ocr,
    "ovis": _ovis,
    "ovis2_5": _ovis2_5,
    "glm4v": _glm4v,
}

WHY_NOT: dict[str, str] = {
    "kimi_vl": (
        "the processor lives only in the model repository (KimiVLProcessor and KimiVLImageProcessor, "
        "processing_kimi_vl.py and image_processing_kimi_vl.py through auto_map), and so does the "
        "tokenizer (TikTokenTokenizer, tokenization_moonshot.py): vLLM 0.32 carries KimiVLConfig and "
        "MoonViTConfig only, and its kimi_vl.py loads the processor through AutoProcessor and reads the "
        "image processor's patch_size, merge_kernel_size and in_token_limit: they cannot be fetched here"
    ),
    "minicpmv": (
        "the image processor lives only in the model repository (MiniCPMVImageProcessor, "
        "image_processing_minicpmv.py): vLLM 0.32's minicpmv.py loads it from "
        "preprocessor_config.json's auto_map with get_class_from_dynamic_module and calls its "
        "slicing methods (get_sliced_grid, get_slice_image_placeholder); vLLM carries only the "
        "MiniCPMVProcessor wrapper, and the config (MiniCPMVConfig) and tokenizer are remote code "
        "too: they cannot be fetched here"
    ),
    "minicpmo": (
        "the image processor lives only in the model repository (MiniCPMVImageProcessor, "
        "image_processing_minicpmv.py, reached through preprocessor_config.json's auto_map), and "
        "vLLM 0.32's minicpmo.py also takes the tokenizer and audio feature extractor from the "
        "repository's own processor (processing_minicpmo.py through AutoProcessor); vLLM carries "
        "only the MiniCPMOProcessor wrapper, and the config (MiniCPMOConfig) is remote code too: "
        "they cannot be fetched here"
    ),
}
