# The two commands of the README: `make demo` runs the main job, `make test` runs every check.
# Both build their own virtual environment first; nothing is installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test system-packages lint typecheck pytest install-test bench peers-env compare clean schema-snapshot doc-samples api-samples console-screenshots fences-table sim-soak

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/oncebox demo

test: $(STAMP) system-packages lint typecheck pytest install-test

# Debian packages some tests need (promtool and prometheus, for the alerting rules and a real
# scrape; chromium and its driver, for the console's end-to-end tests; PostgreSQL's client
# programs and curl, for the examples' READMEs); installed when missing, as root.
system-packages:
	@.ci/system-packages prometheus:promtool chromium:chromium chromium-driver:chromedriver \
		pgbouncer:pgbouncer curl:curl jq:jq postgresql-client:createdb

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

# Four processes on two cores: a test mostly waits (on PostgreSQL's fsync, a broker, a process it
# spawned), so the suite takes about a third of its one-process time on a 2-core machine (9.8
# minutes against 22.4, quiet, before the docs' story ran once). Each test has its own database
# and queue names; the docs' story runs once, in the background (tests/support/shared_story.py);
# `pytest` alone runs everything in one process.
pytest: $(STAMP)
	$(BIN)/pytest -n 4

# oncebox as users install it (tests/test_install.py): the sdist and the wheel built as a release
# builds them, the wheel installed by pip into a new virtual environment without extras and with
# each extra alone, and in each the first commands a newcomer runs. After the suite: the suite's
# own run leaves these tests out (marker `install`).
install-test: $(STAMP)
	$(BIN)/pytest -n 2 -m install tests/test_install.py

bench: $(STAMP)
	$(BIN)/python bench/core.py

# The peers (pgqueuer, procrastinate) in an environment of their own, for bench/compare.py only.
peers-env: .venv-peers/.installed

.venv-peers/.installed: bench/peers/requirements.txt
	$(PYTHON) -m venv .venv-peers
	.venv-peers/bin/python -m pip install --quiet --upgrade pip
	.venv-peers/bin/python -m pip install --quiet -r bench/peers/requirements.txt
	touch .venv-peers/.installed

compare: $(STAMP) peers-env
	$(BIN)/python bench/compare.py --json bench/results/latest.json

clean:
	rm -rf $(VENV) .venv-peers .mypy_cache .pytest_cache .ruff_cache oncebox-demo.db*

schema-snapshot: $(STAMP)
	PYTHONPATH=tests $(BIN)/python tests/support/schema_dump.py --write

# The table of fences in docs/guarantees.md, from the `-- fence:` lines of the store's SQL files;
# tests/test_fences.py checks it still matches.
fences-table: $(STAMP)
	PYTHONPATH=tests $(BIN)/python tests/support/fences.py

# The deterministic simulation beyond the suite's budget: worlds of varied sizes until Ctrl-C,
# each failure's case saved in sim-soak/ (docs/simulation.md). SIM_STORE=postgresql://… for
# PostgreSQL worlds, SIM_FROM=N to start past the seeds already soaked.
SIM_STORE ?= sqlite
SIM_FROM ?= 0
sim-soak: $(STAMP)
	$(BIN)/oncebox sim --soak --store $(SIM_STORE) --seed $(SIM_FROM) --found sim-soak

# The command samples in docs/cli.md and docs/runbook.md, rewritten from a real run of the operator
# story in tests/support/doc_story.py; tests/test_doc_samples.py checks they still match.
doc-samples: $(STAMP)
	$(BIN)/python tests/support/doc_story.py

# The curl samples of docs/api.md, from a real run (tests/support/api_samples.py);
# tests/test_api_doc_samples.py checks they still match.
api-samples: $(STAMP)
	PYTHONPATH=tests $(BIN)/python tests/support/api_samples.py

# The console's screenshots in docs/img/, from the demo served and photographed in headless
# Chromium (tests/support/console_screenshots.py).
console-screenshots: $(STAMP) system-packages
	PYTHONPATH=tests $(BIN)/python tests/support/console_screenshots.py
