"""Engines and their manager: what an engine is (`base`: protocols, sampling, stream events,
errors meant for users), the manager that builds, shares and time-shares them (`manager`),
the scheduler's policy (`scheduler`, no vLLM: tested by simulation), memory shares
(`memory`), vLLM in this process (`vllm_engine`, imported lazily) and remote servers
(`remote_engine`), prompt counting (`tokens`).

May import: `app.media`, `app.catalog`, `app.config`.
Checked by `make lint` (import-linter, `pyproject.toml`)."""
