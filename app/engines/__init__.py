"""Engines and their manager: what an engine is (`base`: protocols, sampling, stream events,
errors meant for users), the manager that builds, shares and time-shares them (`manager`, a
facade over its jobs: `admission` for tickets, the line and leases; `lifecycle` for builds,
wakes, sleeps, unloads and dead engines; `coordinator` for the task that carries out the
policy's decisions, drains and reaps idle engines; `status` for what the UI reads; `slots`
for the per-model record they share), the scheduler's policy (`scheduler`, no vLLM: tested
by simulation), memory shares (`memory`), vLLM in this process (`vllm_engine`, imported
lazily) and remote servers (`remote_engine`), prompt counting (`tokens`).

May import: `app.media`, `app.catalog`, `app.config`.
Checked by `make lint` (import-linter, `pyproject.toml`)."""
