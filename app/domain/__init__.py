"""What users do, without Gradio: conversations and the prompt that fits the model
(`conversation`), answers (`replies`), compare, the blind arena, prompt sets and grids,
the leaderboard, per-tab sessions, safe exports.

May import: `app.storage` and every layer below it.
Checked by `make lint` (import-linter, `pyproject.toml`)."""
