"""The real models' classes for app.demo.twins.mrope: architecture, config model_type, processor,
image processor (None, None where vLLM carries the processor itself)."""

REAL: dict[str, tuple[str, str, str | None, str | None]] = {
    # Qwen/Qwen3-VL-30B-A3B-Instruct: Qwen3-VL's processor over a Qwen3-MoE text model.
    "qwen3_vl_moe": (
        "Qwen3VLMoeForConditionalGeneration",
        "qwen3_vl_moe",
        "Qwen3VLProcessor",
        "Qwen2VLImageProcessor",
    ),
    # zai-org/GLM-4.5V: GLM-4.1V's processor over a GLM-4.5 MoE text model.
    "glm4_5v": ("Glm4vMoeForConditionalGeneration", "glm4v_moe", "Glm4vProcessor", "Glm4vImageProcessor"),
    # Qwen/Qwen2.5-Omni-7B: the Omni processor (Qwen2-VL image processor, Whisper features).
    "qwen2_5_omni": ("Qwen2_5OmniModel", "qwen2_5_omni", "Qwen2_5OmniProcessor", "Qwen2VLImageProcessor"),
    # tencent/HunyuanOCR: transformers' own HunYuan-VL classes (vLLM's Transformers backend).
    "hunyuan_vl": (
        "HunYuanVLForConditionalGeneration",
        "hunyuan_vl",
        "HunYuanVLProcessor",
        "HunYuanVLImageProcessor",
    ),
}
