# Claimcheck — `make help` lists the targets.
SHELL := /bin/bash
PY := .venv/bin/python
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/claimcheck
TEST_BROKER_URL ?= redis://127.0.0.1:6379/15

.PHONY: help install run test test-fast lint fmt services browser bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

.venv/.installed: pyproject.toml uv.lock
	@command -v uv >/dev/null || python3 -m pip install --quiet 'uv>=0.9,<1'
	uv sync --frozen --python python3
	@touch $@

install: .venv/.installed ## the virtual environment at .venv/ from the lock file

run: install ## migrate, seed the demo, start web + worker + beat on the embedded default
	$(PY) manage.py migrate --no-input -v0
	$(PY) manage.py seed_demo
	@echo "Starting web (http://127.0.0.1:8000), workers and beat; Ctrl-C stops all of them."
	.venv/bin/honcho start -f Procfile

services: ## start the machine's PostgreSQL and Redis if they are stopped
	@scripts/services.sh

browser: ## install Debian's chromium for the console tests
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

test: install services browser ## every test against PostgreSQL and Redis
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(PY) -m pytest $(PYTEST_ARGS)

lint: install ## ruff check and format check
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

fmt: install ## ruff fix and format
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

bench: install services ## benchmarks, each with its ratio to a floor measured in the same run
	$(PY) bench/admission.py && $(PY) bench/turns.py

clean: ## remove the virtual environment and var/
	rm -rf .venv var
