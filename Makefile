# The two commands of README.md, plus the checks. Each creates .venv on first use.
#   make run    the whole fleet on this machine (tffleet up): SQLite, a private Redis, example model
#   make test   the test suite (needs PostgreSQL and Redis on 127.0.0.1, see README)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast lint typecheck check clean docs docs-build

$(BIN)/tffleet: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --progress-bar off -q --upgrade pip
	$(BIN)/python -m pip install --progress-bar off -q -e '.[worker,dev]'
	touch $@

run: $(BIN)/tffleet
	@echo 'tffleet: to run its commands by name in another terminal: export PATH="$(abspath $(BIN)):$$PATH"'
	$(BIN)/tffleet up

# Two processes (pytest-xdist), a module whole in one of them, the end-to-end ones first (tests/conftest.py).
test: $(BIN)/tffleet
	$(BIN)/python -m pytest -n 2 --dist loadfile

# The unit tests: no TensorFlow, no process started (the tests marked slow are left out).
test-fast: $(BIN)/tffleet
	$(BIN)/python -m pytest -m 'not slow'

lint: $(BIN)/tffleet
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/tffleet
	$(BIN)/mypy

check: lint typecheck test

# The documentation site (mkdocs.yml): served with live reload on 127.0.0.1:8001 (the API has
# 8000), or built into site/ as CI builds it, --strict (a broken link or anchor fails it).
docs: $(BIN)/tffleet
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

docs-build: $(BIN)/tffleet
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .tffleet .pytest_cache .mypy_cache .ruff_cache site
