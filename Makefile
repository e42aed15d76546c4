# Developer and CI commands. `make demo` and `make test` are the README's two commands.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv test check demo bench bench-anchors

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

bench: venv bench-anchors
	$(BIN)/python benchmarks/run.py

# The benchmarks' optional non-Python anchors (never needed by the tests): the Python
# peers, and BullMQ from npm when node is here; Sidekiq is Debian's ruby-sidekiq.
bench-anchors: venv
	$(BIN)/pip install -q -e '.[test,bench]'
	if command -v npm >/dev/null; then cd benchmarks/anchors && npm install --no-audit --no-fund; \
	else echo "npm not found: BullMQ will be skipped"; fi
