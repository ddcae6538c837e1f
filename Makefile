# Every target does its own setup: a virtualenv with the pinned packages and the Java jars from
# Maven Central (cached under .cairn/jars, where include/cairn_stack/settings.py looks). Re-runs skip whatever is already in place.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
JARS    := $(CURDIR)/.cairn/jars

.PHONY: demo test unit up down status lint jars setup chromium

demo: setup  ## start the stack and archive the demo topic end to end
	$(BIN)/python -m cairn_stack demo

test: setup chromium  ## the whole suite: the checks, unit tests, then integration tests against real services
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest

unit: setup
	$(BIN)/python -m pytest tests/unit

up down status: setup
	$(BIN)/python -m cairn_stack $@

# lint-imports checks the layers written down in pyproject.toml ([tool.importlinter]); mypy
# type-checks the core ([tool.mypy]).
lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports && $(BIN)/mypy

setup: $(VENV)/.installed jars

# The overview page's test drives a real headless Chromium: Debian's package, installed as root.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		{ echo "chromium is missing: run 'apt-get install chromium' as root" >&2; exit 1; }

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
