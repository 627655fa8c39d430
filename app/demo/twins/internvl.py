"""Twins of the InternVL family: remote-code configs, processors that vLLM carries.

The original-format models (InternVL3, H2OVL, NVLM-D, Skywork-R1V) keep their config class in
the model repository (`configuration_*.py`, `auto_map`), and neither vLLM nor transformers
carries it; vLLM builds their processors itself from the config (image size, patch size,
downsample ratio, dynamic tiling) and the tokenizer's special tokens. Each twin therefore holds
a minimal config class written here (`CHAT_CONFIG_SOURCE`), a config.json that names it, and a
tokenizer with the model's tokens and chat template. Intern-S1 is the same idea in the
Hugging Face layout: vLLM loads transformers' `InternVLProcessor` for it by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard
from app.demo.twins.common import HEAD_DIM, Builder, text_config, train_tokenizer

# --- config classes written into the twin folders ------------------------------------------

CHAT_CONFIG_SOURCE = '''"""Minimal stand-in for the model repository's own configuration code, written by the
VLM Playground twin builder (app/demo/twins/internvl.py), not copied from the repository: it holds
what vLLM's model and processor code read (vision_config of the InternViT kind, llm_config of
the language model's kind, select_layer, force_image_size, downsample_ratio, ps_version,
dynamic tiling) and nothing else."""

from transformers import AutoConfig, PretrainedConfig


class {vision_class}(PretrainedConfig):
    """InternViT sizes; every field comes from config.json."""

    model_type = "{vision_type}"


class {config_class}(PretrainedConfig):
    """The chat model: an InternViT, an MLP projector and a causal language model."""

    model_type = "{model_type}"

    def __init__(self, vision_config=None, llm_config=None, **kwargs):
        # Sub-configs are set before PretrainedConfig validates the token ids through them.
        self.vision_config = {vision_class}(**(vision_config or {{}}))
        llm = dict(llm_config or {{"model_type": "{llm_type}"}})
        self.llm_config = AutoConfig.for_model(llm.pop("model_type"), **llm)
        super().__init__(**kwargs)

    def get_text_config(self, decoder=None, encoder=None):
        return self.llm_config
'''

INTERNS1_CONFIG_SOURCE = '''"""Minimal stand-in for Intern-S1's configuration_interns1.py, written by the
VLM Playground twin builder (app/demo/twins/internvl.py), not copied from the repository: it holds
what vLLM's interns1.py and interns1_vit.py read (vision_config, text_config of the Qwen3 kind,
downsample_ratio, projector_hidden_act) and nothing else."""

from transformers import AutoConfig, PretrainedConfig


class InternS1VisionConfig(PretrainedConfig):
    """The vision tower's sizes; every field comes from config.json."""

    model_type = "interns1_vision"


class InternS1Config(PretrainedConfig):
    model_type = "interns1"

    def __init__(self, vision_config=None, text_config=None, **kwargs):
        self.vision_config = InternS1VisionConfig(**(vision_config or {}))
        text = dict(text_config or {"model_type": "qwen3"})
        self.text_config = AutoConfig.for_model(text.pop("model_type"), **text)
        super().__init__(**kwargs)
'''

# --- chat templates (the models' formats, written here) -------------------------------------


def _chatml(default_system: str | None = None) -> str:
    """ChatML turns, as InternVL3, NVLM-D and Intern-S1 render them; InternVL3 opens with its
    own system prompt when the conversation has none."""
    opening = ""
    if default_system is not None:
        opening = (
            "{% if messages[0]['role'] != 'system' %}"
            f"{{{{ '<|im_start|>system\\n{default_system}<|im_end|>\\n' }}}}{{% endif %}}"
        )
    return (
        opening + "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


# H2O-Danube's turns: <|system|>, <|prompt|> and <|answer|>, each ended by </s>.
H2O_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>' + message['content'] + eos_token }}"
    "{% elif message['role'] == 'user' %}{{ '<|prompt|>' + message['content'] + eos_token }}"
    "{% else %}{{ '<|answer|>' + message['content'] + eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|answer|>' }}{% endif %}"
)

# DeepSeek-R1's turns (Skywork-R1V's language model is an R1 distillation): <｜User｜>,
# <｜Assistant｜>, answers ended by <｜end▁of▁sentence｜>, generation opening a <think> block.
R1_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{% else %}{{ '<｜Assistant｜>' + message['content'] + eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
)

QWEN_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The tokens the original-format InternVL processors look up (<img>, </img>, <IMG_CONTEXT>).
INTERNVL_TOKENS = [
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<quad>",
    "</quad>",
    "<ref>",
    "</ref>",
    "<box>",
    "</box>",
]

# --- shared pieces -------------------------------------------------------------------------

IMAGE_SIZE, PATCH = 56, 14  # 16 patches a tile, 4 tokens after the 0.5 pixel shuffle


def _intern_vit(*, large: bool) -> dict[str, Any]:
    """A two-layer InternViT. `large`: the 6B kind (RMS norm, QK normalization, no QKV bias);
    otherwise the 300M kind (layer norm, QKV bias)."""
    return {
        "model_type": "intern_vit_6b",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "num_channels": 3,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-6,
        "initializer_factor": 1.0,
        "qkv_bias": not large,
        "qk_normalization": large,
        "norm_type": "rms_norm" if large else "layer_norm",
        "use_flash_attn": False,
    }


def _write_chat_twin(
    card: ModelCard,
    folder: Path,
    *,
    config_file: str,
    config_class: str,
    model_type: str,
    tokenizer: Any,
    llm_type: str,
    large_vit: bool,
    **fields: Any,
) -> None:
    """Writes an original-format InternVL-style twin: config class, config.json, tokenizer."""
    (folder / f"{config_file}.py").write_text(
        CHAT_CONFIG_SOURCE.format(
            vision_class="InternVisionConfig",
            vision_type="intern_vit_6b",
            config_class=config_class,
            model_type=model_type,
            llm_type=llm_type,
        )
    )
    llm = text_config(
        tokenizer,
        model_type=llm_type,
        architectures=[_LLM_ARCHITECTURES[llm_type]],
        tie_word_embeddings=False,
    )
    config = {
        "architectures": [card.architecture],
        "model_type": model_type,
        "auto_map": {"AutoConfig": f"{config_file}.{config_class}"},
        "vision_config": _intern_vit(large=large_vit),
        "llm_config": llm,
        "select_layer": -1,
        "force_image_size": IMAGE_SIZE,
        "downsample_ratio": 0.5,
        "ps_version": "v2",
        "min_dynamic_patch": 1,
        "dynamic_image_size": True,
        "use_thumbnail": True,
        "tie_word_embeddings": False,
        **fields,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(folder)


_LLM_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


# --- builders ------------------------------------------------------------------------------


def _internvl_chat(card: ModelCard, folder: Path) -> None:
    """InternVL3-2B: a 300M-kind InternViT and Qwen2; <|video_pad|> in the vocabulary turns on
    vLLM's video path (its context token for Qwen language models)."""
    tokenizer = train_tokenizer(
        # Image tokens first: dummy weights answer token 0 over and over, and with
        # <|endoftext|> there the card's stop tokens would end every answer after one token.
        [*INTERNVL_TOKENS, "<|video_pad|>", *QWEN_TOKENS],
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=_chatml("You are InternVL, a multimodal large language model."),
    )
    _write_chat_twin(
        card,
        folder,
        config_file="configuration_internvl_chat",
        config_class="InternVLChatConfig",
        model_type="internvl_chat",
        tokenizer=tokenizer,
        llm_type="qwen2",
        large_vit=False,
        template="internvl2_5",
        max_dynamic_patch=12,
    )


def _h2ovl_chat(card: ModelCard, folder: Path) -> None:
    """H2OVL Mississippi 800M: a 300M-kind InternViT and H2O-Danube3 (Llama), without
    multi-scale adaptive cropping (use_msac false, as the 800M model ships)."""
    tokenizer = train_tokenizer(
        ["<unk>", "<s>", "</s>", "<|prompt|>", "<|answer|>", "<|system|>", *INTERNVL_TOKENS],
        eos="</s>",
        bos="<s>",
        unk="<unk>",
        pad="<unk>",
        chat_template=H2O_TEMPLATE,
    )
    _write_chat_twin(
        card,
        folder,
        config_file="configuration_h2ovl_chat",
        config_class="H2OVLChatConfig",
        model_type="h2ovl_chat",
        tokenizer=tokenizer,
        llm_type="llama",
        large_vit=False,
        template="h2ogpt2",
        max_dynamic_patch=6,
        use_msac=False,
    )


def _nvlm_d(card: ModelCard, folder: Path) -> None:
    """NVLM-D-72B: a 6B-kind InternViT (vLLM pads it with 7 dummy heads) and Qwen2; tiles are
    tagged <tile_k> and images wrapped in <Image>...</Image> as plain text, with <|vision_pad|>
    as the context token."""
    tokenizer = train_tokenizer(
        [*QWEN_TOKENS, "<|vision_pad|>"],
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=_chatml(),
    )
    _write_chat_twin(
        card,
        folder,
        config_file="configuration_nvlm_d",
        config_class="NVLM_D_Config",
        model_type="NVLM_D",
        tokenizer=tokenizer,
        llm_type="qwen2",
        large_vit=True,
        template="chatml",
        max_dynamic_patch=6,
    )


def _skywork_chat(card: ModelCard, folder: Path) -> None:
    """Skywork-R1V-38B: a 6B-kind InternViT and an R1-distilled Qwen2."""
    tokenizer = train_tokenizer(
        [
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<think>",
            "</think>",
            *QWEN_TOKENS,
            *INTERNVL_TOKENS,
        ],
        eos="<｜end▁of▁sentence｜>",
        bos="<｜begin▁of▁sentence｜>",
        pad="<|endoftext|>",
        chat_template=R1_TEMPLATE,
    )
    _write_chat_twin(
        card,
        folder,
        config_file="configuration_skywork_chat",
        config_class="SkyworkChatConfig",
        model_type="skywork_chat",
        tokenizer=tokenizer,
        llm_type="qwen2",
        large_vit=True,
        template="r1-v",
        max_dynamic_patch=12,
    )


def _interns1(card: ModelCard, folder: Path) -> None:
    """Intern-S1-mini: the Hugging Face layout (InternS1 vision tower, Qwen3). vLLM loads
    transformers' `InternVLProcessor` (GotOcr2 image processor, InternVL video processor) by
    name, so the twin holds that processor's files; the tokenizer names the image tokens."""
    from transformers import GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor

    image_tokens = {
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    }
    tokenizer = train_tokenizer(
        [*QWEN_TOKENS, *image_tokens.values()],
        eos="<|im_end|>",
        pad="<|endoftext|>",
        chat_template=_chatml(),
        extra_special_tokens=image_tokens,
    )
    size = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(
            size=size, crop_to_patches=False, min_patches=1, max_patches=12
        ),
        video_processor=InternVLVideoProcessor(size=size),
        tokenizer=tokenizer,
        image_seq_length=(IMAGE_SIZE // PATCH) ** 2 // 4,
    )
    (folder / "configuration_interns1.py").write_text(INTERNS1_CONFIG_SOURCE)
    config = {
        "architectures": [card.architecture],
        "model_type": "interns1",
        "auto_map": {"AutoConfig": "configuration_interns1.InternS1Config"},
        "vision_config": {
            "model_type": "interns1_vision",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 2,
            "num_hidden_layers": 2,
            "image_size": [IMAGE_SIZE, IMAGE_SIZE],
            "patch_size": [PATCH, PATCH],
            "num_channels": 3,
            "hidden_act": "gelu",
            "norm_type": "layer_norm",
            "layer_norm_eps": 1e-6,
            "attention_bias": True,
            "use_qk_norm": False,
            "layer_scale_init_value": 0.1,
            "use_mask_token": False,
            "use_absolute_position_embeddings": True,
            "use_mean_pooling": True,
        },
        "text_config": text_config(
            tokenizer, model_type="qwen3", head_dim=HEAD_DIM, tie_word_embeddings=False
        ),
        "downsample_ratio": 0.5,
        "projector_hidden_act": "gelu",
        "image_token_id": tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        "image_seq_length": processor.image_seq_length,
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


BUILDERS: dict[str, Builder] = {
    "internvl_chat": _internvl_chat,
    "h2ovl_chat": _h2ovl_chat,
    "NVLM_D": _nvlm_d,
    "skywork_chat": _skywork_chat,
    "interns1": _interns1,
}

WHY_NOT: dict[str, str] = {
    "nemotron_vl": (
        "the vision tower and the image processor live only in the model repository: vLLM builds "
        "the C-RADIO tower with AutoModel.from_config(config.vision_config, trust_remote_code=True) "
        "and calls it as vision_model(x=...).features, the repository's RADIOModel interface "
        "(transformers 5.19's own RadioModel takes pixel_values, not x), and reads image_size, "
        "max_num_tiles and use_thumbnail from the repository's LlamaNemotronNanoVLImageProcessor "
        "(image_processing.py, auto_map) through AutoImageProcessor: neither can be fetched here"
    ),
}
