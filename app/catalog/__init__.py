"""The model catalog: strict model cards and the prompt adapters they name."""
