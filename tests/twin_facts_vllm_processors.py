"""The real models' classes for app.demo.twins.vllm_processors: architecture, config model_type, processor,
image processor (None, None where vLLM carries the processor itself)."""

REAL: dict[str, tuple[str, str, str | None, str | None]] = {
    # deepseek-ai/deepseek-vl2-tiny: processor_config.json names DeepseekVLV2Processor, which vLLM carries.
    "deepseek_vl_v2": ("DeepseekVLV2ForCausalLM", "deepseek_vl_v2", None, None),
    # deepseek-ai/DeepSeek-OCR: config.json keeps DeepSeek-VL2's model_type (vLLM renames it
    # deepseek_ocr when it loads the config); vLLM builds its DeepseekOCRProcessor itself.
    "deepseek_ocr": ("DeepseekOCRForCausalLM", "deepseek_vl_v2", None, None),
    # AIDC-AI/Ovis2-1B: vLLM's OvisConfig and OvisProcessor stand for the repository's remote code.
    "ovis": ("Ovis", "ovis", None, None),
    # AIDC-AI/Ovis2.5-2B: the repository's Ovis2_5_Config (remote code), vLLM's Ovis2_5Processor.
    "ovis2_5": ("Ovis2_5", "ovis2_5", None, None),
    # zai-org/glm-4v-9b: config.json is ChatGLMConfig's (model_type chatglm, remote code that vLLM
    # carries); its architectures say ChatGLMModel, which the card's hf_overrides (as vLLM's example
    # does) turn into GLM4VForCausalLM. No processor files: vLLM builds GLM4VProcessor itself.
    "glm4v": ("GLM4VForCausalLM", "chatglm", None, None),
}
