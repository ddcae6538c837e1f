# Every target does its own setup: a virtualenv with the pinned packages and the Java jars from
# Maven Central (cached under .cairn/jars, where include/cairn_stack/settings.py looks). Re-runs skip whatever is already in place.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
JARS    := $(CURDIR)/.cairn/jars
# The executors' Python of the local Spark cluster: requirements-cluster.txt only, no Cairn.
CLUSTER_PY := .cairn/cluster-python

.PHONY: demo test unit up down status lint jars setup chromium redis

demo: setup  ## start the stack and archive the demo topic end to end
	$(BIN)/python -m cairn_stack demo

test: setup chromium redis  ## the whole suite: the checks, then unit and integration tests (against real services) on two workers
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 --dist loadgroup  # two workers (tests/conftest.py AIRFLOW_GROUP)

unit: setup
	$(BIN)/python -m pytest tests/unit

# `make up CLUSTER=1`: the distributed shape (Celery workers with Redis, a Spark standalone cluster).
up: setup $(if $(CLUSTER),redis)
	$(if $(CLUSTER),CAIRN_CLUSTER=1) $(BIN)/python -m cairn_stack up

down status: setup
	$(BIN)/python -m cairn_stack $@

# lint-imports checks the layers written down in pyproject.toml ([tool.importlinter]); mypy
# type-checks the core ([tool.mypy]).
lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports && $(BIN)/mypy

setup: $(VENV)/.installed $(CLUSTER_PY)/.installed jars

# The overview page's test drives a real headless Chromium: Debian's package, installed as root.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		{ echo "chromium is missing: run 'apt-get install chromium' as root" >&2; exit 1; }

# The distributed shape's broker: Debian's Redis, installed as root.
redis:
	@command -v redis-server >/dev/null || { [ "$$(id -u)" = 0 ] && \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; } || \
		{ echo "redis-server is missing: run 'apt-get install redis-server' as root" >&2; exit 1; }

$(CLUSTER_PY)/.installed: requirements-cluster.txt
	rm -rf $(CLUSTER_PY)
	$(PY) -m venv $(CLUSTER_PY)
	$(CLUSTER_PY)/bin/pip install --quiet -r requirements-cluster.txt
	touch $@

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

jars: $(JARS)/kafka/.fetched $(JARS)/spark/.fetched

$(JARS)/%/.fetched: jars/%/pom.xml
	rm -rf $(JARS)/$*
	mvn --batch-mode --quiet -f jars/$*/pom.xml dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory=$(JARS)/$*
	touch $@
