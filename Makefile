VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: env run test lint format

env:
	bash scripts/setup-cpu-env.sh

run: env
	$(PY) -m app

test: env
	$(PY) -m ruff check app tests bench scripts
	$(PY) -m ruff format --check app tests bench scripts
	$(PY) -m pytest

lint: env
	$(PY) -m ruff check app tests bench scripts
	$(PY) -m ruff format --check app tests bench scripts

format: env
	$(PY) -m ruff check --fix app tests bench scripts
	$(PY) -m ruff format app tests bench scripts
