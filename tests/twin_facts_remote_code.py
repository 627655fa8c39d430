"""The real models' classes for app.twins.remote_code: architecture, config model_type, processor,
image processor (None, None where vLLM carries the processor itself)."""

REAL: dict[str, tuple[str, str, str | None, str | None]] = {}
