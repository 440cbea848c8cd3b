# Claimcheck — `make help` lists the targets.
SHELL := /bin/bash
PY := .venv/bin/python
# The test run uses the two-role setup (README, "Database roles"): pytest-django
# creates and migrates the test database as TEST_DB_OWNER; the code under test
# and the Celery processes connect as TEST_DB_APP. `make test` creates both roles.
TEST_DB_OWNER ?= claimcheck_owner
TEST_DB_APP ?= claimcheck_app
TEST_DATABASE_URL ?= postgres://$(TEST_DB_OWNER)@127.0.0.1:5432/claimcheck
TEST_BROKER_URL ?= redis://127.0.0.1:6379/15
PG_SUPERUSER_URL ?= postgres://postgres@127.0.0.1:5432/postgres
# pytest-xdist workers for `make test`: each has its own test database
# (test_claimcheck_gw0, ...) and Redis database (tests/conftest.py); a test
# file stays on one worker. TEST_WORKERS=0 runs in one process. Three on
# two cores: the suite is bound by CPU, so a fourth process adds no speed,
# only contention that makes the timing-bound fault tests miss their
# deadlines. The slowest files start first (tests/file_seconds.json).
TEST_WORKERS ?= 3
# A Debian package a target needs, installed only when its command is
# missing, with one line naming it first: a fresh machine's `make test`
# says what it is about to install rather than going quiet for a minute.
# $(1) the command, $(2) the package, $(3) what it is for.
define apt-need
@command -v $(1) >/dev/null || test -x /usr/sbin/$(1) || { \
	echo "make: installing the Debian package $(2) ($(3))" && \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y -qq $(2) >/dev/null; }
endef
# pytest-django's name for the test database (test_ + the URL's database name).
TEST_DB_NAME = test_$(lastword $(subst /, ,$(firstword $(subst ?, ,$(TEST_DATABASE_URL)))))

.PHONY: help install run soak test test-fast faults multihost lint fmt services browser pgbouncer proxy bench bench-install bench-peers bench-http bench-scale bench-all bench-compare bench-costs bench-concurrency bench-prune clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

.venv/.installed: pyproject.toml uv.lock
	@command -v uv >/dev/null || { echo "make: installing uv (pip) to build .venv/"; \
		python3 -m pip install --quiet 'uv>=0.9,<1'; }
	@# Bytecode now, once: where the environment sets PYTHONDONTWRITEBYTECODE
	@# (this machine's shells do), every process the tests and `make run`
	@# start would otherwise compile Django and Celery from source again,
	@# which costs more than the rest of its start (and the suite starts
	@# over a hundred).
	uv sync --frozen --python python3 --compile-bytecode --all-extras
	@touch $@

install: .venv/.installed ## the virtual environment at .venv/ from the lock file

# The agent frameworks `make run` installs (optional dependency groups of
# pyproject.toml): demo.agent and examples/ need them; `make run EXTRAS=` for none.
EXTRAS ?= pydantic-ai openai-agents langgraph

run: ## install what running needs, start embedded PostgreSQL + Redis, migrate, seed, web + workers + beat
	@EXTRAS="$(EXTRAS)" python3 scripts/run.py

soak: install ## N minutes (SOAK_MINUTES, default 30) of mixed demo traffic on a `make run` of its own (var/soak/); figures
	$(PY) bench/soak.py

services: ## start the machine's PostgreSQL and Redis if they are stopped
	@scripts/services.sh

browser: ## install Debian's chromium for the console tests
	$(call apt-need,chromium,chromium,the console's browser tests)

pgbouncer: ## install Debian's pgbouncer for the pooler test (tests/test_pgbouncer.py)
	$(call apt-need,pgbouncer,pgbouncer,the pooler test)

proxy: ## install Debian's nginx for the buffering-proxy test (deploy/nginx.conf)
	$(call apt-need,nginx,nginx-light,the buffering-proxy test)

test: install services browser pgbouncer proxy ## lint, the layer contracts, migrations in step, then every test against PostgreSQL and Redis
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports --no-cache
	@# Models and migrations in step: a model change without its migration fails here,
	@# not on an operator's `migrate`. --dry-run writes nothing.
	DATABASE_URL=$(PG_SUPERUSER_URL) $(PY) manage.py makemigrations --check --dry-run
	@scripts/db_roles.sh --superuser-url $(PG_SUPERUSER_URL) --createdb \
		--adopt $(TEST_DB_NAME) $(TEST_DB_OWNER) $(TEST_DB_APP)
	@# DATABASE_LISTEN_URL names a production database: the tests' listeners
	@# use the test database (tests/test_pgbouncer.py sets its own). The tests
	@# connect directly: the functions' calls run prepared, as a direct
	@# deployment's do (the PgBouncer test's pooled processes turn it off).
	@# PYTHONDONTWRITEBYTECODE cleared: pytest keeps the test modules and
	@# plugins it rewrote for its asserts, which each worker would otherwise
	@# rewrite again at its start.
	PYTHONDONTWRITEBYTECODE= DATABASE_URL=$(TEST_DATABASE_URL) DATABASE_APP_ROLE=$(TEST_DB_APP) DATABASE_LISTEN_URL= \
		DATABASE_PREPARED_CALLS=1 CELERY_BROKER_URL=$(TEST_BROKER_URL) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
		--durations 15 $(PYTEST_ARGS)

test-fast: install services ## every test that starts no process of its own (no worker, server or browser)
	@scripts/db_roles.sh --superuser-url $(PG_SUPERUSER_URL) --createdb \
		--adopt $(TEST_DB_NAME) $(TEST_DB_OWNER) $(TEST_DB_APP)
	PYTHONDONTWRITEBYTECODE= DATABASE_URL=$(TEST_DATABASE_URL) DATABASE_APP_ROLE=$(TEST_DB_APP) DATABASE_LISTEN_URL= \
		DATABASE_PREPARED_CALLS=1 CELERY_BROKER_URL=$(TEST_BROKER_URL) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
		-m "not integration and not browser and not faults and not multihost" $(PYTEST_ARGS)

faults: install services pgbouncer ## the full fault suite (private PostgreSQL + Redis it kills, PgBouncer in front; `make test` runs a reduced set)
	FAULTS_FULL=1 DATABASE_URL=$(TEST_DATABASE_URL) DATABASE_PREPARED_CALLS=1 CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(PY) -m pytest -m faults tests/faults $(PYTEST_ARGS)

multihost: install services ## hosts A and B on one machine: two webs, two turns workers, control, beat; kill B mid-turn
	MULTIHOST=1 DATABASE_URL=$(TEST_DATABASE_URL) DATABASE_PREPARED_CALLS=1 CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(PY) -m pytest -m multihost tests/faults/test_multihost.py -s -p no:cacheprovider $(PYTEST_ARGS)

.PHONY: upgrade-test
upgrade-test: install services ## the previous release (CHANGELOG.md) serving while this one migrates, starts beside it, drains it
	@scripts/db_roles.sh --superuser-url $(PG_SUPERUSER_URL) --createdb \
		--adopt $(TEST_DB_NAME) $(TEST_DB_OWNER) $(TEST_DB_APP)
	UPGRADE_TEST=1 DATABASE_URL=$(TEST_DATABASE_URL) DATABASE_APP_ROLE=$(TEST_DB_APP) DATABASE_LISTEN_URL= \
		CELERY_BROKER_URL=$(TEST_BROKER_URL) $(PY) -m pytest tests/test_rolling_upgrade.py -s -p no:cacheprovider $(PYTEST_ARGS)

lint: install ## ruff check, format check, the layer contracts (import-linter), migrations in step
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports --no-cache
	DATABASE_URL=$(PG_SUPERUSER_URL) $(PY) manage.py makemigrations --check --dry-run

fmt: install ## ruff fix and format
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

bench-install: install ## the benchmarks' optional dependency group (DBOS, Procrastinate) and wrk
	uv sync --frozen --python python3 --compile-bytecode --all-extras --group bench
	$(call apt-need,wrk,wrk,the HTTP benchmark)

bench: bench-install services ## admission and turn benchmarks, each with its ratio to a floor measured in the same run
	$(PY) bench/admission.py && $(PY) bench/turns.py

bench-peers: bench-install services ## Claimcheck against DBOS and Procrastinate: admission and end to end
	$(PY) bench/peers.py

bench-http: bench-install services ## gunicorn + wrk: POST /api/v1/tickets against a django-ninja floor
	$(PY) bench/http.py

bench-scale: bench-install services ## reads, pages and sweeps at 10k and 1M tickets; bytes per ticket
	$(PY) bench/scale.py

bench-all: bench-install services ## every benchmark at reduced size: one table of ratios and targets, JSON in bench/results/
	$(PY) bench/bench_all.py $(BENCH_ARGS)

bench-compare: install ## flag ratios that fell beyond bench/noise.json: make bench-compare A=old.json B=new.json
	@test -n "$(A)" -a -n "$(B)" || (echo "usage: make bench-compare A=bench/results/x.json B=bench/results/y.json" && exit 2)
	$(PY) bench/compare.py $(A) $(B) $(ARGS)

bench-costs: bench-install services ## statements, commits, WAL bytes, buffers and CPU per admission, turn, callback, delivery
	$(PY) bench/costs.py

bench-concurrency: bench-install services ## 1 to 64 clients: pgbench against an insert, Procrastinate and DBOS; admit_ticket from 1-32 processes, HTTP at 8-64 connections, end to end with 1-4 workers
	$(PY) bench/concurrency.py

bench-prune: bench-install services ## prune_ledger removing 1M finished tickets while admissions run
	$(PY) bench/prune.py

clean: ## remove the virtual environment and var/ (the embedded servers' data too)
	rm -rf .venv var
