# Developer and CI commands. `make demo` and `make test` are the README's two commands.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv test check demo bench

$(VENV)/.stamp: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.stamp

test: venv
	$(BIN)/python -m pytest -q -m "not soak" -p no:cacheprovider
	./scripts/check

check: venv
	./scripts/check

demo: venv
	$(BIN)/python examples/signup/run.py

bench: venv
	$(BIN)/python benchmarks/run.py
