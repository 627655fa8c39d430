"""The model catalog: strict, frozen model cards (`cards.load_cards`, one YAML file each in
`model_cards/`) and the prompt adapters they name (`adapters.render`).

May import: `app.config` only.
Checked by `make lint` (import-linter, `pyproject.toml`)."""
