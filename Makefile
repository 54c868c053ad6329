# Spillway developer entry points. `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
CHECKOV_STAMP := $(VENV)/checkov/.setup-stamp
RUNTIME_LOCK := images/operator/requirements.txt

.PHONY: setup demo test test-fast bench images lint generate vllm-src coverage-truth clean connector-wheel
# Podman's runtime settings for machines like CI's, where root cannot raise rlimits past 20000 open files and
# crun refuses the cgroup setup: `make images` and the image tests run with them unless told otherwise.
export CONTAINERS_CONF ?= $(CURDIR)/images/containers.conf

setup: $(STAMP) $(CHECKOV_STAMP) $(BIN)/helm

# The operator image's lock constrains the test venv: the packages both hold are the same versions, so a
# release on PyPI between two runs changes neither the tests' dependencies nor the lock that `make generate`
# writes from this venv (tests/test_generated_files.py). To move one, edit its line in the lock, then make setup.
$(STAMP): requirements-test.txt operator/pyproject.toml connector/pyproject.toml $(RUNTIME_LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c $(RUNTIME_LOCK) -r requirements-test.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -c $(RUNTIME_LOCK) -e connector -e operator
	# PyPI's torchvision/torchaudio/torchcodec do not import beside the CPU torch wheel; vLLM runs without them.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

$(CHECKOV_STAMP): requirements-checkov.txt
	test -x $(VENV)/checkov/bin/python || $(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	touch $@

$(BIN)/helm: operator/tools/install_kube_binaries.py | $(STAMP)
	$(BIN)/python operator/tools/install_kube_binaries.py $(BIN)

# The demo needs the two packages and their runtime dependencies only (no vLLM, torch or checkov): a venv
# of its own with exactly the operator image's locked set (make generate keeps it current), so pip resolves
# nothing; bytecode is compiled on import for the few modules the demo reads. The packages run from the
# source tree: building them (editable installs) would double the setup time.
DEMO_VENV := $(VENV)/demo
DEMO_STAMP := $(DEMO_VENV)/.setup-stamp
DEMO_SPILLWAY := PYTHONPATH=$(CURDIR)/operator:$(CURDIR)/connector $(DEMO_VENV)/bin/python -m spillway.cli
DEMO_PLAN := plan --model meta-llama/Llama-3.1-8B-Instruct --node-memory 2Ti --gpus-per-node 8 --node-cpus 128 --offload-size auto
DEMO_RENDER := render -f docs/examples/modelserver.yaml --node-memory 2Ti --gpus-per-node 8 --node-cpus 128

$(DEMO_STAMP): $(RUNTIME_LOCK)
	test -x $(DEMO_VENV)/bin/python || $(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install --quiet --disable-pip-version-check --no-compile --no-deps -r $(RUNTIME_LOCK)
	touch $@

demo: $(DEMO_STAMP)
	@echo '$$ spillway $(DEMO_PLAN)'; $(DEMO_SPILLWAY) $(DEMO_PLAN)
	@echo; echo '$$ spillway $(DEMO_RENDER)'; $(DEMO_SPILLWAY) $(DEMO_RENDER)

# The Python sources of the other vLLM releases the planner and the connector support (0.34 in our image,
# 0.33 beside it, 0.26 on the GPU machines; 0.32 is the CPU engine in .venv): their wheels from PyPI, Python files only.
# The ground-truth tests (tests/planner/test_groups_vllm.py, tests/connector/test_vllm_sources.py) run
# vLLM's own offloading configuration from them.
VLLM_SRC_VERSIONS := 0.34.0 0.33.0 0.26.0
VLLM_SRC := $(VENV)/vllm-src
VLLM_SRC_STAMPS := $(foreach v,$(VLLM_SRC_VERSIONS),$(VLLM_SRC)/$(v)/vllm/__init__.py)
SPILLWAY_VLLM_TREES := $(subst $(eval) ,:,$(foreach v,$(VLLM_SRC_VERSIONS),$(CURDIR)/$(VLLM_SRC)/$(v)))

$(VLLM_SRC)/%/vllm/__init__.py: | $(STAMP)
	rm -rf $(VLLM_SRC)/$* && mkdir -p $(VLLM_SRC)/$*/wheel
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps "vllm==$*" -d $(VLLM_SRC)/$*/wheel
	unzip -q $(VLLM_SRC)/$*/wheel/*.whl '*.py' '*.json' -d $(VLLM_SRC)/$*
	rm -rf $(VLLM_SRC)/$*/wheel
	touch $@

vllm-src: $(VLLM_SRC_STAMPS)

# The spillway-connector wheel, the one thing Spillway adds to a stock vLLM (docs/connector.md: in another vLLM
# image). Built from the source tree without a build-isolation venv (setuptools is the test venv's), so offline.
CONNECTOR_WHEEL_DIR ?= $(VENV)/wheels
connector-wheel: $(STAMP)
	rm -rf $(CONNECTOR_WHEEL_DIR) && mkdir -p $(CONNECTOR_WHEEL_DIR)
	$(BIN)/pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
		--wheel-dir $(CONNECTOR_WHEEL_DIR) ./connector
	rm -rf connector/build
	@ls $(CONNECTOR_WHEEL_DIR)/spillway_connector-*.whl

TEST_ENV := PATH=$(CURDIR)/$(BIN):$$PATH SPILLWAY_VLLM_TREES=$${SPILLWAY_VLLM_TREES:-$(SPILLWAY_VLLM_TREES)}
# The 30 slowest tests and fixtures, so the suite's cost is read off every run (CI's budget is 30 min).
PYTEST_DURATIONS := --durations=30
# Test files run on PYTEST_WORKERS processes (pytest-xdist). Most tests spend their time waiting on a
# subprocess (kopf against kmock, a vLLM engine, podman, helm), so more workers than the two cores of a CI
# machine still pay. loadfile keeps a file on one worker: module fixtures (a cluster, an engine, an image)
# are built once, as without workers. PYTEST_WORKERS=0 runs in this process (a debugger, -x, -s).
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: setup vllm-src
	$(TEST_ENV) $(BIN)/python -m pytest tests $(PYTEST_PARALLEL) $(PYTEST_DURATIONS)

test-fast: setup vllm-src
	$(TEST_ENV) $(BIN)/python -m pytest tests -m "not engine" $(PYTEST_PARALLEL) $(PYTEST_DURATIONS)

# The questions in bench/ that run on any machine (the GPU questions run through bench/gpu/run_engines.sh).
BENCH := bench/planner/plan.py bench/fleet/fleet.py bench/connector-overhead/connector_overhead.py \
	bench/loadgen/loadgen_capacity.py bench/scheduler-side/scheduler_reservation.py bench/scheduler-side/scheduler_side.py \
	bench/routing/routing_policies.py bench/router-overhead/router_overhead.py bench/tail/json_body.py \
	bench/tail/ttft_phases.py bench/tail/detokenizer_window.py bench/startup-bytecode/bytecode_imports.py

bench: setup
	@for script in $(BENCH); do echo "== $$script"; PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python $$script || exit 1; echo; done

lint: setup
	$(BIN)/ruff check operator connector tests bench
	$(BIN)/lint-imports

# IMAGES="operator vllm-cpu" builds some of them (default: operator, vllm, vllm-cpu).
images:
	@bash images/build.sh $(IMAGES)

# Every generated file (dashboards, rules, the chart's values schema and table, the image lock);
# tests/test_generated_files.py fails when a committed one is stale.
generate: setup
	$(BIN)/python operator/tools/generate.py

# vLLM 0.33's own KV-cache answer for every architecture of its registry (tests/planner/coverage/truth.json), then
# the planner's table (docs/coverage.md, operator/spillway/core/vllm_coverage.py). Minutes: it builds ~250 models.
coverage-truth: setup vllm-src
	$(TEST_ENV) PYTHONPATH=$(CURDIR)/operator:$(CURDIR)/connector $(BIN)/python tests/planner/coverage/generate.py
	PYTHONPATH=$(CURDIR)/operator:$(CURDIR)/connector $(BIN)/python tests/planner/coverage/render.py

clean:
	rm -rf $(VENV)
