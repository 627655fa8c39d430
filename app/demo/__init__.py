"""Models made here: the demo models offered on a machine with no GPU (`models`), the seeing
model trained on drawings of shapes (`seeing_model`, `shapes`), and random-weight twins of
real architectures for the demo and the tests (`twins`).

May import: `app.domain` and every layer below it.
Checked by `make lint` (import-linter, `pyproject.toml`)."""
