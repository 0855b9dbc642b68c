# Nebula — `make up` runs the platform, `make test` tests it.
PYTHON ?= python3
# pytest-xdist workers: tests wait on servers, switches and outages as much as they compute;
# --dist loadfile keeps a file's tests on one worker (their module fixtures, a whole
# platform say, are made once, and the browser tests' story runs in order)
PYTEST_WORKERS ?= 2
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

FRONTEND_DEPS := frontend/node_modules/.installed
FRONTEND_DIST := frontend/dist/index.html
FRONTEND_SOURCES := $(shell find frontend/src -type f 2>/dev/null) frontend/index.html \
	frontend/vite.config.ts frontend/tsconfig.json frontend/package.json

.PHONY: up test lint typecheck pytest frontend frontend-test api-types api-types-check screenshots bench clean gpu-check

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned, so that nothing pulls a CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

$(FRONTEND_DEPS): frontend/package-lock.json
	cd frontend && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The web UI's API types are generated from the server's OpenAPI document (openapi-typescript):
# `make api-types` writes them, and the web UI's build fails while the committed ones drift.
API_TYPES := frontend/src/api/schema.d.ts
API_CACHE := frontend/node_modules/.cache/nebula-api

api-types: $(STAMP) $(FRONTEND_DEPS)
	mkdir -p $(API_CACHE)
	$(BIN)/python -m app.openapi > $(API_CACHE)/openapi.json
	cd frontend && npx --no-install openapi-typescript node_modules/.cache/nebula-api/openapi.json \
		--output src/api/schema.d.ts

api-types-check: $(STAMP) $(FRONTEND_DEPS)
	mkdir -p $(API_CACHE)
	$(BIN)/python -m app.openapi > $(API_CACHE)/openapi.json
	cd frontend && npx --no-install openapi-typescript node_modules/.cache/nebula-api/openapi.json \
		--output node_modules/.cache/nebula-api/schema.d.ts
	@cmp -s $(API_CACHE)/schema.d.ts $(API_TYPES) || { \
		echo "$(API_TYPES) differs from the server's OpenAPI document: run make api-types"; \
		exit 1; }

# the web UI is rebuilt whenever a source is newer than the build
$(FRONTEND_DIST): $(FRONTEND_DEPS) $(FRONTEND_SOURCES)
	cd frontend && npm run build --silent

frontend: api-types-check $(FRONTEND_DIST)

frontend-test: $(FRONTEND_DEPS)
	cd frontend && npm test --silent

up: $(STAMP) frontend
	$(BIN)/nebula up

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports  # the arrows between the parts: [tool.importlinter] in pyproject.toml

typecheck: $(STAMP)
	$(BIN)/mypy app cli common contract workers

pytest: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile

test: lint typecheck frontend-test frontend pytest

screenshots: $(STAMP) frontend
	NEBULA_SCREENSHOTS_DIR=docs/screenshots $(BIN)/pytest -q tests/e2e

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

# bench/api_load.py drives the server with wrk (Debian's package)
bench: $(BENCH_STAMP)
	command -v wrk >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache

# ELECTRA and ABNet with every role on CUDA against the CPU run (tests/workers/training/test_gpu.py);
# where torch sees no CUDA device the tests are skipped and pytest prints the reason
gpu-check: $(STAMP)
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider tests/workers/training/test_gpu.py
