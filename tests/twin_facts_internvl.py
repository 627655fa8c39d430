"""The real models' classes for app.demo.twins.internvl: architecture, config model_type, processor,
image processor (None, None where vLLM carries the processor itself).

The original-format models name no processor: vLLM builds InternVLProcessor, H2OVLProcessor or
NVLMProcessor itself from the config. Intern-S1-mini's processor_config.json names the
repository's InternS1Processor (remote code), which vLLM does not use: it loads transformers'
InternVLProcessor by name."""

REAL: dict[str, tuple[str, str, str | None, str | None]] = {
    "internvl_chat": ("InternVLChatModel", "internvl_chat", None, None),
    "h2ovl_chat": ("H2OVLChatModel", "h2ovl_chat", None, None),
    "NVLM_D": ("NVLM_D", "NVLM_D", None, None),
    "skywork_chat": ("SkyworkR1VChatModel", "skywork_chat", None, None),
    "interns1": ("InternS1ForConditionalGeneration", "interns1", None, None),
}
