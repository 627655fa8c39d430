#!/usr/bin/env bash
# Builds the GPU environment in .venv-gpu: vLLM's CUDA build and the app's pinned libraries
# (requirements.txt), the same step as the Dockerfile's. Idempotent: a second run only checks.
# Kept apart from the CPU test environment (.venv): both vllm packages install the `vllm` module.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV_GPU:-.venv-gpu}
PY="$VENV/bin/python"
STAMP="$VENV/.gpu-env-ready"

if [ -f "$STAMP" ] && cmp -s requirements.txt "$STAMP"; then
  exit 0
fi
[ -x "$PY" ] || python3 -m venv "$VENV"
"$PY" -m pip install --quiet --disable-pip-version-check -r requirements.txt
"$PY" -c "import vllm, gradio"
cp requirements.txt "$STAMP"
echo "GPU environment ready in $VENV"
