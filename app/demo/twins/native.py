"""Twins of architectures whose config and processor classes ship in transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.catalog.cards import ModelCard
from app.demo.twins.common import (
    HEAD_DIM,
    HEADS,
    HIDDEN,
    LAYERS,
    LLAVA_1_5_CHAT_TEMPLATE,
    LLAVA_ONEVISION_CHAT_TEMPLATE,
    QWEN2_5_VL_VISION,
    QWEN2_VL_CHAT_TEMPLATE,
    QWEN_SPECIAL_TOKENS,
    Builder,
    clip_vision,
    mrope_section,
    save,
    siglip_vision,
    text_config,
    train_tokenizer,
)

# --- builders, one per architecture --------------------------------------------------------


def _llava(card: ModelCard, folder: Path) -> None:
    """LLaVA-1.5: a CLIP tower at 56 px (16 patches) and a Llama; `<image>` placeholder."""
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaProcessor

    tokenizer = train_tokenizer(
        ["<unk>", "<s>", "</s>", "<image>", "<pad>"], eos="</s>", bos="<s>", unk="<unk>", pad="<pad>"
    )
    image_processor = CLIPImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_1_5_CHAT_TEMPLATE,
    )
    config = LlavaConfig(
        vision_config=clip_vision(56),
        text_config=text_config(tokenizer, model_type="llama"),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _llava_next(card: ModelCard, folder: Path) -> None:
    """LLaVA-NeXT (Mistral): a CLIP tower at 56 px with any-resolution tiles of 56 px."""
    from transformers import LlavaNextConfig, LlavaNextImageProcessor, LlavaNextProcessor

    tokenizer = train_tokenizer(["<unk>", "<s>", "</s>", "<image>"], eos="</s>", bos="<s>", unk="<unk>")
    pinpoints = [[56, 112], [112, 56], [112, 112]]
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}, image_grid_pinpoints=pinpoints
    )
    processor = LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
    )
    config = LlavaNextConfig(
        vision_config=clip_vision(56),
        text_config=text_config(tokenizer, model_type="mistral", sliding_window=None),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=pinpoints,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _llava_onevision(card: ModelCard, folder: Path) -> None:
    """LLaVA-OneVision (Qwen2): a SigLIP tower at 56 px, tiles of 56 px, images and video."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    tokenizer = train_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"],
        eos="<|im_end|>",
        pad="<|endoftext|>",
    )
    pinpoints = [[56 * h, 56 * w] for h in range(1, 4) for w in range(1, 4)]
    image_processor = LlavaOnevisionImageProcessor(
        size={"height": 56, "width": 56}, image_grid_pinpoints=pinpoints
    )
    video_processor = LlavaOnevisionVideoProcessor(size={"height": 56, "width": 56})
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        num_image_tokens=16,
        vision_feature_select_strategy="full",
        chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
    )
    config = LlavaOnevisionConfig(
        vision_config=siglip_vision(56),
        text_config=text_config(tokenizer, model_type="qwen2"),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=pinpoints,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _qwen_vl(
    card: ModelCard,
    folder: Path,
    config_class: Any,
    processor_class: Any,
    text_model_type: str,
    vision_config: dict[str, Any],
) -> None:
    """Qwen2-VL and Qwen2.5-VL: Qwen2 with M-RoPE, Qwen2-VL's image and video processors and
    chat template; only the vision tower and the classes differ."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    tokenizer = train_tokenizer(
        QWEN_SPECIAL_TOKENS, eos="<|im_end|>", pad="<|endoftext|>", chat_template=QWEN2_VL_CHAT_TEMPLATE
    )
    processor = processor_class(
        image_processor=Qwen2VLImageProcessor(),
        video_processor=Qwen2VLVideoProcessor(),
        tokenizer=tokenizer,
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )
    config = config_class(
        text_config=text_config(
            tokenizer,
            model_type=text_model_type,
            bos_token_id=tokenizer.pad_token_id,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": mrope_section(HEAD_DIM),
            },
        ),
        vision_config=vision_config,
        **_qwen_token_ids(tokenizer),
        tie_word_embeddings=False,
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _qwen2_vl(card: ModelCard, folder: Path) -> None:
    """Qwen2-VL: the dynamic-resolution ViT (depth 2) and a Qwen2 text model with M-RoPE."""
    from transformers import Qwen2VLConfig, Qwen2VLProcessor

    vision = {"depth": 2, "embed_dim": 64, "hidden_size": HIDDEN, "num_heads": 4, "mlp_ratio": 2}
    _qwen_vl(card, folder, Qwen2VLConfig, Qwen2VLProcessor, "qwen2_vl_text", vision)


def _qwen2_5_vl(card: ModelCard, folder: Path) -> None:
    """Qwen2.5-VL: the windowed ViT (depth 2, one full-attention block) and Qwen2 with M-RoPE."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLProcessor

    _qwen_vl(card, folder, Qwen2_5_VLConfig, Qwen2_5_VLProcessor, "qwen2_5_vl_text", QWEN2_5_VL_VISION)


def _qwen_token_ids(tokenizer: Any) -> dict[str, int]:
    token_id = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": token_id("<|image_pad|>"),
        "video_token_id": token_id("<|video_pad|>"),
        "vision_start_token_id": token_id("<|vision_start|>"),
        "vision_end_token_id": token_id("<|vision_end|>"),
    }


def _paligemma(card: ModelCard, folder: Path, text_model_type: str = "gemma") -> None:
    """PaliGemma: a SigLIP tower at 56 px (16 image tokens) and a Gemma of head size 32."""
    from tokenizers import AddedToken
    from transformers import PaliGemmaConfig, PaliGemmaProcessor, SiglipImageProcessor

    tokenizer = train_tokenizer(
        ["<pad>", "<eos>", "<bos>", "<unk>", "<image>"], eos="<eos>", bos="<bos>", pad="<pad>", unk="<unk>"
    )
    # Gemma's SentencePiece vocabulary holds "\n" itself; vLLM's PaliGemma processor looks it up.
    tokenizer.add_tokens([AddedToken("\n", normalized=False)])
    image_processor = SiglipImageProcessor(size={"height": 56, "width": 56})
    image_processor.image_seq_length = 16
    # The processor adds PaliGemma's location and segmentation tokens to the tokenizer.
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    config = PaliGemmaConfig(
        vision_config={**siglip_vision(56), "projection_dim": HIDDEN},
        text_config=text_config(
            tokenizer, model_type="gemma", head_dim=HEAD_DIM, hidden_activation="gelu_pytorch_tanh"
        ),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        projection_dim=HIDDEN,
        hidden_size=HIDDEN,
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _paligemma2(card: ModelCard, folder: Path) -> None:
    """PaliGemma 2: PaliGemma with a Gemma 2 text model (head size 32, sliding window)."""
    _paligemma(card, folder, text_model_type="gemma2")


GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)


def _gemma3(card: ModelCard, folder: Path) -> None:
    """Gemma 3: a SigLIP tower at 56 px pooled to 4 tokens per image (pan and scan as the card
    asks) and a Gemma 3 text model of head size 32; the processor's chat template."""
    from tokenizers import AddedToken
    from transformers import Gemma3Config, Gemma3ImageProcessor, Gemma3Processor

    image_tokens = {
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
    }
    tokenizer = train_tokenizer(
        ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", *image_tokens.values()],
        eos="<eos>",
        bos="<bos>",
        pad="<pad>",
        unk="<unk>",
        extra_special_tokens=image_tokens,
    )
    # Gemma's SentencePiece vocabulary holds runs of 1 to 4 newlines; vLLM's processor looks them up.
    tokenizer.add_tokens([AddedToken("\n" * n, normalized=False) for n in range(1, 5)])
    image_processor = Gemma3ImageProcessor(
        size={"height": 56, "width": 56}, pan_and_scan_min_crop_size=28, pan_and_scan_max_num_crops=4
    )
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=4,
    )
    token_id = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(
        vision_config={**siglip_vision(56), "vision_use_head": False},
        text_config=text_config(
            tokenizer,
            model_type="gemma3_text",
            head_dim=HEAD_DIM,
            query_pre_attn_scalar=HEAD_DIM,
            sliding_window=512,
        ),
        mm_tokens_per_image=4,
        boi_token_index=token_id("<start_of_image>"),
        eoi_token_index=token_id("<end_of_image>"),
        image_token_index=token_id("<image_soft_token>"),
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _qwen3_vl(card: ModelCard, folder: Path) -> None:
    """Qwen3-VL: the ViT of patch 16 (depth 2, one DeepStack layer) and Qwen3 with interleaved M-RoPE."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tokenizer = train_tokenizer(QWEN_SPECIAL_TOKENS, eos="<|im_end|>", pad="<|endoftext|>")
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3),
        video_processor=Qwen3VLVideoProcessor(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3),
        tokenizer=tokenizer,
    )
    config = Qwen3VLConfig(
        text_config=text_config(
            tokenizer,
            model_type="qwen3_vl_text",
            head_dim=HEAD_DIM,
            bos_token_id=tokenizer.pad_token_id,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
        ),
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "out_hidden_size": HIDDEN,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [1],
        },
        **_qwen_token_ids(tokenizer),
        tie_word_embeddings=False,
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


IDEFICS3_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
]


def _idefics3_like(
    card: ModelCard, folder: Path, *, tile: int, scale: int, bos: str, eos: str, smol: bool
) -> None:
    """Idefics3 and SmolVLM: a SigLIP-like tower at the real tile size with tiny widths (the
    card's `size`/`max_image_size` keep their meaning), pixel shuffle by the real scale factor,
    and a Llama; images split into tiles plus a global image, with the row/column tags."""
    import transformers

    prefix = "SmolVLM" if smol else "Idefics3"
    tokenizer = train_tokenizer([bos, eos, "<|im_end|>", *IDEFICS3_TOKENS], eos=eos, bos=bos, pad=eos)
    image_seq_len = (tile // 14) ** 2 // scale**2
    image_processor = getattr(transformers, f"{prefix}ImageProcessor")(
        size={"longest_edge": 4 * tile}, max_image_size={"longest_edge": tile}
    )
    parts: dict[str, Any] = {"image_processor": image_processor, "tokenizer": tokenizer}
    if smol:
        parts["video_processor"] = transformers.SmolVLMVideoProcessor(
            size={"longest_edge": tile}, max_image_size={"longest_edge": tile}
        )
    processor = getattr(transformers, f"{prefix}Processor")(**parts, image_seq_len=image_seq_len)
    config = getattr(transformers, f"{prefix}Config")(
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": tile,
            "patch_size": 14,
        },
        text_config=text_config(tokenizer, model_type="llama"),
        scale_factor=scale,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _idefics3(card: ModelCard, folder: Path) -> None:
    """Idefics3-8B: tiles of 364 px, scale factor 2 (169 tokens a tile), Llama 3 tokens."""
    _idefics3_like(
        card, folder, tile=364, scale=2, bos="<|begin_of_text|>", eos="<|end_of_text|>", smol=False
    )


def _smolvlm(card: ModelCard, folder: Path) -> None:
    """SmolVLM2-2.2B: tiles of 384 px, scale factor 3 (81 tokens a tile)."""
    _idefics3_like(card, folder, tile=384, scale=3, bos="<|im_start|>", eos="<end_of_utterance>", smol=True)


def _pixtral_hf(card: ModelCard, folder: Path) -> None:
    """Pixtral (Hugging Face format): LLaVA with a Pixtral tower (patch 16, images up to 64 px:
    rows of `[IMG]` closed by `[IMG_BREAK]`, then `[IMG_END]`) and a Mistral text model."""
    from transformers import LlavaConfig, PixtralImageProcessor, PixtralProcessor

    tokenizer = train_tokenizer(
        ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"],
        eos="</s>",
        bos="<s>",
        unk="<unk>",
    )
    image_processor = PixtralImageProcessor(size={"longest_edge": 64}, patch_size=16)
    processor = PixtralProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=16)
    config = LlavaConfig(
        vision_config={
            "model_type": "pixtral",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "head_dim": 32,
            "image_size": 64,
            "patch_size": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
        text_config=text_config(tokenizer, model_type="mistral", head_dim=HEAD_DIM, sliding_window=None),
        image_token_id=tokenizer.convert_tokens_to_ids("[IMG]"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        projector_hidden_act="gelu",
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _llava_next_video(card: ModelCard, folder: Path) -> None:
    """LLaVA-NeXT-Video: a CLIP tower at 196 px, frames pooled by 2 (49 tokens a frame), Llama.

    196 px, not smaller: vLLM's video pooler divides by `image_size // patch_size**2`, zero
    below 196 px for patch 14."""
    from transformers import (
        LlavaNextImageProcessor,
        LlavaNextVideoConfig,
        LlavaNextVideoProcessor,
        LlavaNextVideoVideoProcessor,
    )

    tokenizer = train_tokenizer(
        ["<unk>", "<s>", "</s>", "<image>", "<video>"], eos="</s>", bos="<s>", unk="<unk>", pad="<unk>"
    )
    pinpoints = [[196, 392], [392, 196], [392, 392]]
    size = {"size": {"shortest_edge": 196}, "crop_size": {"height": 196, "width": 196}}
    processor = LlavaNextVideoProcessor(
        video_processor=LlavaNextVideoVideoProcessor(**size),
        image_processor=LlavaNextImageProcessor(**size, image_grid_pinpoints=pinpoints),
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
    )
    token_id = tokenizer.convert_tokens_to_ids
    config = LlavaNextVideoConfig(
        vision_config=clip_vision(196),
        text_config=text_config(tokenizer, model_type="llama"),
        image_token_index=token_id("<image>"),
        video_token_index=token_id("<video>"),
        image_grid_pinpoints=pinpoints,
        spatial_pool_stride=2,
        image_seq_length=196,
        video_seq_length=49,
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _blip2(card: ModelCard, folder: Path) -> None:
    """BLIP-2 (OPT): a ViT at 56 px, a one-layer Q-Former of 4 queries, an OPT of head size 32."""
    from transformers import Blip2Config, Blip2Processor, BlipImageProcessor

    tokenizer = train_tokenizer(
        ["<pad>", "</s>", "<unk>", "<image>"], eos="</s>", bos="</s>", pad="<pad>", unk="<unk>"
    )
    processor = Blip2Processor(
        image_processor=BlipImageProcessor(size={"height": 56, "width": 56}),
        tokenizer=tokenizer,
        num_query_tokens=4,
    )
    config = Blip2Config(
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 56,
            "patch_size": 14,
        },
        qformer_config={
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "encoder_hidden_size": 64,
        },
        text_config={
            "model_type": "opt",
            "vocab_size": len(tokenizer),
            "hidden_size": HIDDEN,
            "ffn_dim": HIDDEN * 2,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "word_embed_proj_dim": HIDDEN,
            "max_position_embeddings": 2048,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        num_query_tokens=4,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


def _glm4_1v(card: ModelCard, folder: Path) -> None:
    """GLM-4.1V: the ViT (depth 2) with 2x2 merge and a GLM-4 text model with partial M-RoPE."""
    from transformers import Glm4vConfig, Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

    media = [
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|image|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
        "<|video|>",
    ]
    tokenizer = train_tokenizer(
        ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", *media],
        eos="<|endoftext|>",
        pad="<|endoftext|>",
    )
    processor = Glm4vProcessor(
        image_processor=Glm4vImageProcessor(), video_processor=Glm4vVideoProcessor(), tokenizer=tokenizer
    )
    token_id = tokenizer.convert_tokens_to_ids
    config = Glm4vConfig(
        text_config=text_config(
            tokenizer,
            model_type="glm4v_text",
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
                "partial_rotary_factor": 0.5,
            },
        ),
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": HIDDEN,
            "num_heads": 2,
            "out_hidden_size": HIDDEN,
        },
        image_token_id=token_id("<|image|>"),
        video_token_id=token_id("<|video|>"),
        image_start_token_id=token_id("<|begin_of_image|>"),
        image_end_token_id=token_id("<|end_of_image|>"),
        video_start_token_id=token_id("<|begin_of_video|>"),
        video_end_token_id=token_id("<|end_of_video|>"),
        architectures=[card.architecture],
    )
    save(folder, config, processor, tokenizer)


# Card key -> builder writing the twin's files into a folder.
BUILDERS: dict[str, Builder] = {
    "llava": _llava,
    "llava-next": _llava_next,
    "llava-onevision": _llava_onevision,
    "qwen2_vl": _qwen2_vl,
    "qwen2_5_vl": _qwen2_5_vl,
    "paligemma": _paligemma,
    "paligemma2": _paligemma2,
    "gemma3": _gemma3,
    "qwen3_vl": _qwen3_vl,
    "idefics3": _idefics3,
    "pixtral_hf": _pixtral_hf,
    "llava-next-video": _llava_next_video,
    "blip-2": _blip2,
    "glm4_1v": _glm4_1v,
    "smolvlm": _smolvlm,
}

# Cards that cannot have a twin here, and precisely why.
WHY_NOT: dict[str, str] = {
    **{
        key: f"vLLM 0.32.0's model registry has no {architecture}: no engine to run a twin on"
        for key, architecture in {
            "aya_vision": "AyaVisionForConditionalGeneration",
            "chameleon": "ChameleonForConditionalGeneration",
            "florence2": "Florence2ForConditionalGeneration",
            "fuyu": "FuyuForCausalLM",
            "hyperclovax_seed_vision": "HCXVisionForCausalLM",
            "mantis": "MantisForConditionalGeneration",
            "minimax_vl_01": "MiniMaxVL01ForConditionalGeneration",
            "mllama": "MllamaForConditionalGeneration",
            "phi4_multimodal": "Phi4MultimodalForCausalLM",
            "qwen_vl": "QwenVLForConditionalGeneration",
            "tarsier": "TarsierForConditionalGeneration",
            "tarsier2": "Tarsier2ForConditionalGeneration",
        }.items()
    },
}
