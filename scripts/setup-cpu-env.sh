#!/usr/bin/env bash
# Builds the CPU test environment in .venv: the CPU build of vLLM and what the tests need.
# Idempotent: a second run only checks. Used by `make test` and so by CI on a clean clone.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
STAMP="$VENV/.cpu-env-ready"

# The browser tests drive Debian's Chromium through Playwright (Playwright's own browser
# download is not reachable from these machines).
# SKIP_BROWSER=1 (the CPU Docker image) leaves it out.
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
APT_UPDATED=""
apt_update_once() {  # one index download for both packages below (CI installs both)
  [ -n "$APT_UPDATED" ] || $SUDO apt-get update -qq >/dev/null
  APT_UPDATED=1
}
if [ -z "${SKIP_BROWSER:-}" ] && [ ! -x /usr/bin/chromium ]; then
  apt_update_once
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  echo "Installed $(/usr/bin/chromium --version 2>/dev/null)"
fi

# The history tests start a private PostgreSQL server on loopback (tests/postgres.py) from
# Debian's package. SKIP_POSTGRES=1 (the CPU Docker image) leaves it out.
if [ -z "${SKIP_POSTGRES:-}" ] && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  apt_update_once
  # Only the server's binaries: no cluster is created or started at install.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql-common >/dev/null
  $SUDO sed -i 's/^#\?create_main_cluster.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
  echo "Installed PostgreSQL $(ls /usr/lib/postgresql)"
fi

# The stamp holds the requirements and this script: a change to either (a new fix below) rebuilds.
if [ -f "$STAMP" ] && cat requirements-cpu.txt "$SELF" | cmp -s - "$STAMP"; then
  exit 0
fi

[ -x "$PY" ] || python3 -m venv "$VENV"
# uv installs the environment in well under a minute where pip takes over 2 (measured on a
# 2-core machine); pip is kept as the fallback. Both compile every file to bytecode at install:
# where PYTHONDONTWRITEBYTECODE is set (as on these machines), nothing compiled later is kept,
# and every process the tests start would compile vLLM and torch's Python again. uv does not
# read pip's configuration, so what in it changes what gets installed is handed on: wheel
# folders (`find-links`: where a machine keeps its CPU build of torch) and a constraints file.
# pip's find-links set-up prints a warning per missing index folder; keep the rest.
pip_setting() {  # `pip config get` misses some files that `pip config list` reads
  "$PY" -m pip config list 2>/dev/null | sed -n "s/^global\.$1='\(.*\)'\$/\1/p" | head -1
}
UV_OPTIONS=()
read -ra LINKS <<< "${PIP_FIND_LINKS:-$(pip_setting find-links)}"
for folder in "${LINKS[@]}"; do
  UV_OPTIONS+=(--find-links "$folder")
done
CONSTRAINT=${PIP_CONSTRAINT:-$(pip_setting constraint)}
if [ -n "$CONSTRAINT" ] && [ -f "$CONSTRAINT" ]; then
  UV_OPTIONS+=(--constraint "$CONSTRAINT")
fi
if "$PY" -m pip install --quiet --disable-pip-version-check uv==0.13.9 2> "$VENV/pip-stderr.log" \
  && "$VENV/bin/uv" pip install --quiet --compile-bytecode --python "$PY" "${UV_OPTIONS[@]}" -r requirements-cpu.txt; then
  :
else
  echo "uv could not install the environment; installing with pip (a few minutes)" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check -r requirements-cpu.txt 2> "$VENV/pip-stderr.log" \
    || { grep -v "is ignored: it is neither a file nor a directory" "$VENV/pip-stderr.log" >&2; exit 1; }
fi

# PyPI has only CUDA builds of these; on a CPU machine they raise OSError at import,
# which vLLM and transformers do not catch. vLLM's image and video paths work without them.
"$PY" -m pip uninstall --quiet --yes torchaudio torchcodec >/dev/null 2>&1 || true

# The CUDA torchvision wheel's compiled ops do not load on CPU, and two unguarded fake-op
# registrations then make `import torchvision` fail. Guarding them leaves pure-Python
# torchvision working, which transformers' Qwen2-VL processors need. vLLM spawns its engine
# processes, so the fix has to live in the installed file, not in a test-time monkeypatch.
META=$("$PY" -c "import importlib.util as u; print(u.find_spec('torchvision').submodule_search_locations[0])")/_meta_registrations.py
for op in nms qnms; do
  sed -i "s|^@torch.library.register_fake(\"torchvision::$op\")\$|@(torch.library.register_fake(\"torchvision::$op\") if torchvision.extension._has_ops() else (lambda fn: fn))|" "$META"
done

# vLLM's CPU linear layers hand their input to oneDNN (ops.onednn_mm), which requires a unit
# stride in the last dimension; a model that feeds a Linear a permuted tensor (HunyuanOCR's
# vision patch merger, through the Transformers backend) fails with "Expected a.stride(-1) == 1".
# GPU kernels accept such tensors, so the CPU build gets the copy torch's own linear would make.
GEMM=$("$PY" -c "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])")/model_executor/layers/utils.py
sed -i 's|^    return layer.cpu_linear(x, weight, bias)$|    return layer.cpu_linear(x if x.stride(-1) == 1 else x.contiguous(), weight, bias)|' "$GEMM"
grep -q "x if x.stride(-1) == 1 else x.contiguous()" "$GEMM" || { echo "vLLM's CPU gemm changed: update the stride fix in $0" >&2; exit 1; }
"$PY" -c "import torchvision, vllm"

cat requirements-cpu.txt "$SELF" > "$STAMP"
echo "CPU environment ready in $VENV"
