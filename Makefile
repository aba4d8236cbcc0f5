PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/klaud demo --once

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/ingest.py --db postgresql --rounds 3
	$(BIN)/python bench/client.py
	$(BIN)/python bench/state.py
	$(BIN)/python bench/wave.py --scale 4
	$(BIN)/python bench/reconcile.py
	$(BIN)/python bench/abuse.py
	$(BIN)/python bench/peers.py --rounds 6
	$(BIN)/python bench/page.py

clean:
	rm -rf $(VENV) *.egg-info
