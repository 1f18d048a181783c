# The two commands of the README: `make demo` runs the main job, `make test` runs every check.
# Both build their own virtual environment first; nothing is installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest bench clean schema-snapshot

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/oncebox demo

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/core.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache oncebox-demo.db*

schema-snapshot: $(STAMP)
	PYTHONPATH=tests $(BIN)/python tests/support/schema_dump.py --write
