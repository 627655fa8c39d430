"""Pictures and videos made safe: images checked and downscaled, videos decoded in killable
worker processes (`loading`), grounding boxes read from answers and drawn (`grounding`).

May import: `app.catalog` and `app.config`.
Checked by `make lint` (import-linter, `pyproject.toml`)."""
