# lightning_per — every target sets itself up (creates .venv and installs what it needs).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/dqn_cartpole.yaml
ARGS ?=

.PHONY: train test test-gpu bench lint clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, so that a torch wheel found locally (pip's --find-links / PIP_FIND_LINKS) is the one used.
	$(BIN)/python -m pip install -q "torch>=2.11"
	$(BIN)/python -m pip install -q -e ".[test,dev]"
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/lightning-per fit --config $(CONFIG) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks run replay --quick --out runs/bench $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check lightning_per ext tests benchmarks examples
	$(BIN)/lint-imports  # the layering contracts of pyproject.toml ([tool.importlinter])

clean-venv:
	rm -rf $(VENV)
