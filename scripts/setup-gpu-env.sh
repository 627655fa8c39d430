#!/usr/bin/env bash
# Builds the GPU environment in .venv-gpu: vLLM's CUDA build and the app's pinned libraries
# (requirements.txt), the same step as the Dockerfile's. Idempotent: a second run only checks.
# Kept apart from the CPU test environment (.venv): both vllm packages install the `vllm` module.
#
# It cannot half-fail: what vLLM's CUDA 13 build needs is checked before anything is downloaded
# (Python 3.11 or newer with venv and its headers, a C compiler for Triton, NVIDIA driver 580
# or newer), each missing piece named in one line; the environment is built in a folder beside
# it and moved in place only once `import vllm, gradio` works, so a failed or interrupted
# build is never taken for a built one. With uv (https://docs.astral.sh/uv/) on the PATH it
# builds with uv, which also brings its own Python where the machine has none new enough.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."

VENV=${VENV_GPU:-.venv-gpu}
PARTIAL="$VENV.partial"
STAMP="$VENV/.gpu-env-ready"
MIN_DRIVER=580 # CUDA 13, which vLLM 0.32's torch 2.13 is built for
WANT_PYTHON=3.12

if [ -f "$STAMP" ] && cat requirements.txt "$SELF" | cmp -s - "$STAMP"; then
  exit 0
fi

fail() {
  echo "GPU set-up: $*" >&2
  exit 1
}

# --- checks, before any download --------------------------------------------------------------

command -v nvidia-smi >/dev/null 2>&1 || fail "no NVIDIA driver found (nvidia-smi): install driver $MIN_DRIVER or newer."
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
[[ "$DRIVER" =~ ^[0-9]+ ]] || fail "nvidia-smi did not report a driver version: check that the NVIDIA driver works (nvidia-smi)."
[ "${DRIVER%%.*}" -ge "$MIN_DRIVER" ] \
  || fail "NVIDIA driver $DRIVER is too old for vLLM's CUDA 13 build: install driver $MIN_DRIVER or newer."

command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 \
  || fail "no C compiler: Triton compiles kernels at start; install one (Debian/Ubuntu: sudo apt install build-essential)."

# One look at a Python: its version, where its headers are, whether it can make a venv.
PROBE='import importlib.util as u, sysconfig, sys; print("%d.%d" % sys.version_info[:2], int(bool(u.find_spec("ensurepip"))), sysconfig.get_paths()["include"])'
PYTHON=""
for candidate in ${PYTHON_GPU:-} python3.13 python3.12 python3.11 python3; do
  command -v "$candidate" >/dev/null 2>&1 || continue
  read -r version has_venv include < <("$candidate" -c "$PROBE" 2>/dev/null) || continue
  if [ "${version%%.*}" -eq 3 ] && [ "${version#*.}" -ge 11 ]; then
    PYTHON=$candidate
    break
  fi
done

UV=$(command -v uv || true)
if [ -n "$UV" ]; then
  # uv makes the environment with a Python of its own where the machine has none new enough;
  # its Pythons carry their headers.
  PYTHON_FOR_UV=${PYTHON:-$WANT_PYTHON}
elif [ -z "$PYTHON" ]; then
  fail "vLLM needs Python 3.11 or newer, and this machine's python3 is older: install python3.12 (with python3.12-venv and python3.12-dev), or uv (https://docs.astral.sh/uv/), then run make run again."
else
  [ "$has_venv" = 1 ] || fail "$PYTHON cannot make an environment (no ensurepip): install python$version-venv (Debian/Ubuntu), then run make run again."
  [ -f "$include/Python.h" ] || fail "$PYTHON has no headers (Python.h), which Triton needs: install python$version-dev (Debian/Ubuntu), then run make run again."
fi

# --- the build, beside the environment ---------------------------------------------------------

rm -rf "$PARTIAL"
if [ -n "$UV" ]; then
  echo "Building the GPU environment with uv (Python $PYTHON_FOR_UV; vLLM's CUDA build is several GB)"
  "$UV" venv --quiet --relocatable --python "$PYTHON_FOR_UV" "$PARTIAL"
  "$UV" pip install --python "$PARTIAL/bin/python" -r requirements.txt
else
  echo "Building the GPU environment with $PYTHON ($version; vLLM's CUDA build is several GB)"
  "$PYTHON" -m venv "$PARTIAL"
  "$PARTIAL/bin/python" -m pip install --disable-pip-version-check --progress-bar on -r requirements.txt
fi
"$PARTIAL/bin/python" -c "import vllm, gradio" \
  || fail "the environment was built but does not import vllm and gradio (above); it is left in $PARTIAL to look at."

# In place: scripts in bin/ name the folder they were made in.
rm -rf "$VENV"
mv "$PARTIAL" "$VENV"
HERE=$(pwd)
{ grep -rlI --null "$HERE/$PARTIAL" "$VENV/bin" 2>/dev/null || true; } | xargs -0 -r sed -i "s|$HERE/$PARTIAL|$HERE/$VENV|g"
cat requirements.txt "$SELF" > "$STAMP"
echo "GPU environment ready in $VENV"
