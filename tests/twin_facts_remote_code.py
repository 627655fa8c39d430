"""The real models' classes for app.demo.twins.remote_code: architecture, config model_type, processor,
image processor (None, None where vLLM carries the processor itself)."""

REAL: dict[str, tuple[str, str, str | None, str | None]] = {
    # rednote-hilab/dots.ocr: config.json names DotsOCRForCausalLM / dots_ocr (configuration_dots.py).
    # vLLM's dots_ocr.py picks transformers' Qwen2VLProcessor itself (get_hf_processor passes the
    # class), whatever processor class the repository's files name.
    "dots_ocr": ("DotsOCRForCausalLM", "dots_ocr", None, None),
}
