"""The real models' classes for app.demo.twins.native_more: architecture, config model_type, processor,
image processor (None, None where vLLM carries the processor itself). Image processors are named
as transformers 5 loads them (a `...Fast` name in an older preprocessor_config.json loads as the
class without the suffix)."""

REAL: dict[str, tuple[str, str, str | None, str | None]] = {
    "mistral3": ("Mistral3ForConditionalGeneration", "mistral3", "PixtralProcessor", "PixtralImageProcessor"),
    "lightonocr": (
        "LightOnOCRForConditionalGeneration",
        "mistral3",
        "PixtralProcessor",
        "PixtralImageProcessor",
    ),
    "command_a_vision": (
        "Cohere2VisionForConditionalGeneration",
        "cohere2_vision",
        "Cohere2VisionProcessor",
        "Cohere2VisionImageProcessor",
    ),
    "aria": ("AriaForConditionalGeneration", "aria", "AriaProcessor", "AriaImageProcessor"),
    "llama4": ("Llama4ForConditionalGeneration", "llama4", "Llama4Processor", "Llama4ImageProcessor"),
    "gemma3n": ("Gemma3nForConditionalGeneration", "gemma3n", "Gemma3nProcessor", "SiglipImageProcessor"),
}
