VENV ?= .venv
PY := $(VENV)/bin/python
# `make run` on a machine with an NVIDIA GPU uses vLLM's CUDA build, in its own environment.
GPU := $(shell ls /dev/nvidia[0-9]* >/dev/null 2>&1 && echo 1)

.PHONY: env run test check lint format screenshots

env:
	bash scripts/setup-cpu-env.sh

run:
ifeq ($(GPU),1)
	bash scripts/setup-gpu-env.sh
	.venv-gpu/bin/python -m app
else
	bash scripts/setup-cpu-env.sh
	$(PY) -m app
endif

# Everything, as CI runs it: the linters, then every test (the real engine and Chromium too), on
# two workers that each take a whole module (or one twin) at a time, the longest first
# (tests/conftest.py). `pytest tests/test_x.py` runs one module in one process.
PARALLEL := -n 2 --dist loadscope --no-loadscope-reorder
test: lint
	$(PY) -m pytest $(PARALLEL) --durations=15

# Before each change: the linters and the tests that need no engine and no browser (under 2
# minutes). `make test` before a push.
check: lint
	$(PY) -m pytest -n 2 -m "not slow and not vllm" -q

# Refreshes the README's screenshots (docs/screenshots/) from the browser tests; `make test`
# writes its own to test-artifacts/ and leaves the tracked tree clean.
screenshots: env
	UPDATE_SCREENSHOTS=1 $(PY) -m pytest $(PARALLEL) tests/test_ui_chat.py tests/test_ui_views.py

# ruff, the layers of app/ (import-linter: the contract in pyproject.toml), hadolint.
lint: env
	$(PY) -m ruff check app tests bench scripts
	$(PY) -m ruff format --check app tests bench scripts
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Dockerfile Dockerfile.cpu

format: env
	$(PY) -m ruff check --fix app tests bench scripts
	$(PY) -m ruff format app tests bench scripts
