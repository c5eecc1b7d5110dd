# elastic-ctr: the two commands a fresh machine needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Triton's clients, for the serving tests, in their own venv (they need protobuf >= 6)
TRITON_VENV ?= .venv-tritonclient
# KServe, the peer of make bench-serving-peers, in its own venv (it needs protobuf >= 6)
KSERVE_VENV ?= .venv-kserve
# network-config-analyzer, for the NetworkPolicies' connectivity test, in its own venv (it pins old releases)
NCA_VENV ?= .venv-nca
NCA_PYTHON ?= python3.11
# checkov, run by the test suite on the dev and prod renderings, in its own venv (its own pins)
CHECKOV_VENV ?= .venv-checkov
PYTEST_ARGS ?=

.PHONY: bench-http-roles bench-http-overhead bench-soak bench-lifecycle bench-table-bytes bench-manifest install install-all prereqs prereqs-all optional-tools browser prometheus constraints demo test test-fast docs layout bench-train bench-cube bench-rollout bench-serving bench-dense bench-serving-image bench-serving-peers bench-storage bench-tracking bench-metrics bench-online bench-fresh bench render golden pulumi-yaml pulumi-schema clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Re-installs only when a requirements file or pyproject.toml changed.
$(STAMP): $(BIN)/python pyproject.toml $(filter-out requirements/kserve.txt,$(wildcard requirements/*.txt)) runtime/cube/kernel.c runtime/cube/kernel_client.c runtime/cube/kernel.h runtime/trainer/_signals.c runtime/serving/proto/open_inference.proto setup.py
	$(BIN)/pip install -q -c requirements/constraints.txt -e ".[trainer,serving,cube,infra,dev,s3,tracking-server]"
	touch $(STAMP)

$(TRITON_VENV)/.installed: requirements/tritonclient.txt
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install -q --upgrade pip
	$(TRITON_VENV)/bin/pip install -q -r requirements/tritonclient.txt
	touch $@

$(NCA_VENV)/.installed: requirements/nca.txt
	$(NCA_PYTHON) -m venv $(NCA_VENV)
	$(NCA_VENV)/bin/pip install -q --upgrade pip
	$(NCA_VENV)/bin/pip install -q -r requirements/nca.txt
	touch $@

$(CHECKOV_VENV)/.installed: requirements/checkov.txt
	$(NCA_PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/pip install -q -r requirements/checkov.txt
	touch $@

## Headless Chromium + chromedriver (Debian packages) for the browser test of the MLflow UI.
browser:
	bash scripts/install-browser.sh

## Prometheus and promtool (Debian's `prometheus` package): the alert rules' unit tests, the
## live monitoring test and `make demo DEMO_ARGS=--prometheus` (scripts/install-prometheus.sh).
prometheus:
	bash scripts/install-prometheus.sh

## What make install needs, checked first: one line per missing piece (scripts/check-prereqs.sh);
## prereqs-all: also what only the test suite needs (root for Debian's packages, Python 3.11).
prereqs:
	@PYTHON=$(PYTHON) NCA_PYTHON=$(NCA_PYTHON) bash scripts/check-prereqs.sh

prereqs-all:
	@PYTHON=$(PYTHON) NCA_PYTHON=$(NCA_PYTHON) bash scripts/check-prereqs.sh --all

## The Python environments, and what needs root or Python 3.11 where this machine has them: a piece
## left out is said in one line, and the tests that need it skip (make test installs everything).
install: prereqs $(STAMP) $(TRITON_VENV)/.installed optional-tools

optional-tools: $(STAMP)
	@if command -v $(NCA_PYTHON) >/dev/null 2>&1; then \
		$(MAKE) -s --no-print-directory $(NCA_VENV)/.installed $(CHECKOV_VENV)/.installed; \
	else echo "make install: left out .venv-nca and .venv-checkov (no $(NCA_PYTHON)): their tests skip"; fi
	@if [[ $$(id -u) -eq 0 ]] || sudo -n true 2>/dev/null || \
	    [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver && -x /usr/bin/prometheus && -x /usr/bin/promtool ]]; then \
		bash scripts/install-browser.sh && bash scripts/install-prometheus.sh; \
	else echo "make install: left out Chromium and Prometheus (Debian packages: needs root or sudo): their tests skip"; fi

## Everything the test suite uses, required: what make install leaves out fails here.
install-all: prereqs-all $(STAMP) $(TRITON_VENV)/.installed $(NCA_VENV)/.installed $(CHECKOV_VENV)/.installed browser prometheus

## Re-pins requirements/constraints.txt to what .venv holds (after changing a range).
constraints: $(BIN)/python
	$(BIN)/pip install -q -e ".[trainer,serving,cube,infra,dev,s3,tracking-server]"
	{ sed -n '1,/^# Refresh/p' requirements/constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -viE '^(py-spy|elastic-ctr)=='; } > requirements/constraints.txt.new
	mv requirements/constraints.txt.new requirements/constraints.txt

## The whole pipeline, locally, on generated data (see README).
demo: install
	$(BIN)/elastic-ctr local $(DEMO_ARGS)

## The test suite (unit, component, rendered manifests, local end-to-end): the parallel phase
## on TEST_WORKERS xdist workers, then the serial phase (scripts/run-tests.sh).
TEST_WORKERS ?= 2
test: install-all
	ELASTIC_CTR_REQUIRE_TOOLS=1 PYTHON=$(BIN)/python TEST_WORKERS=$(TEST_WORKERS) bash scripts/run-tests.sh $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

## The documentation site (mkdocs.yml, docs/) into site/; the reference pages are generated by
## docs/hooks/reference.py. A broken page, link or anchor fails the build. Needs only the docs'
## own packages (docs/requirements.txt, in $(DOCS_VENV)); the hooks read the checkout itself.
DOCS_VENV ?= .venv-docs
$(DOCS_VENV)/.installed: docs/requirements.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q --upgrade pip
	$(DOCS_VENV)/bin/pip install -q -c requirements/constraints.txt -r docs/requirements.txt
	touch $@

## docs/layout.md from the packages' docstrings (tests/docs/test_layout.py checks it is up to date).
layout:
	$(PYTHON) tools/layout.py

docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(CURDIR) $(DOCS_VENV)/bin/mkdocs build --strict

bench-train: install
	$(BIN)/python bench/bench_train.py

bench-cube: install
	bash bench/ensure_redis.sh
	$(BIN)/python bench/bench_cube.py

bench-rollout: install
	$(BIN)/python bench/bench_rollout.py

## Serving per transport and batch size, Paddle Inference and ONNX Runtime side by side (bench/bench_serving.py).
bench-serving: install
	$(BIN)/python bench/bench_serving.py

## The dense network alone: ONNX Runtime against Paddle Inference, and the session options (bench/bench_dense.py).
bench-dense: install
	$(BIN)/python bench/bench_dense.py

## The serving images' sizes and cold starts (bench/bench_serving_image.py; make images first).
bench-serving-image: install
	$(BIN)/python bench/bench_serving_image.py

## An optional extra, not part of install or test: serve vs a KServe ModelServer over the same
## data plane, load from wrk (Debian's package, scripts/install-wrk.sh); KServe in $(KSERVE_VENV).
$(KSERVE_VENV)/.installed: requirements/kserve.txt
	$(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/pip install -q --upgrade pip
	$(KSERVE_VENV)/bin/pip install -q -r requirements/kserve.txt
	touch $@

bench-serving-peers: install $(KSERVE_VENV)/.installed
	bash scripts/install-wrk.sh
	$(BIN)/python bench/bench_serving_peers.py --kserve-python $(KSERVE_VENV)/bin/python

bench-tracking: install
	$(BIN)/python bench/bench_tracking.py

## What serving's per-request metric updates and a cube server's scrape cost (bench/bench_metrics.py).
bench-metrics: install
	$(BIN)/python bench/bench_metrics.py

## The online loop at production shape (bench/bench_online.py). BENCH_ONLINE_ARGS="--table-scale 0.2": a 5x
## smaller table; "--hours 2 --rows-per-hour 200000": a quick try; "--rollout-check": patches on a 10M-key base.
bench-online: install
	$(BIN)/python bench/bench_online.py $(BENCH_ONLINE_ARGS)

## Freshness at 1-minute partitions (bench/bench_fresh.py): 1M rows/hour on a table of millions of rows, landed-to-
## served per partition, the cube's RSS while patching. BENCH_FRESH_ARGS="--partitions 5 --warmup-rows 20000": a quick try.
bench-manifest: install
	$(BIN)/python bench/bench_manifest.py

bench-fresh: install
	$(BIN)/python bench/bench_fresh.py $(BENCH_FRESH_ARGS)

## The feature lifecycle over days (bench/bench_soak.py): 48 simulated hours of the long-tail stream through the
## whole pipeline, lifecycle on and off. BENCH_SOAK_ARGS="--hours 6 --day 3 --rows-per-hour 20000": a quick try.
bench-soak: install
	$(BIN)/python bench/bench_soak.py $(BENCH_SOAK_ARGS)

## The control roles' HTTP servers under slow clients, load and SIGTERM (bench/bench_http_roles.py);
## BENCH_HTTP_ARGS="--tree DIR": another checkout's roles, to compare two in one sitting.
bench-http-roles: install
	$(BIN)/python bench/bench_http_roles.py $(BENCH_HTTP_ARGS)

## Serving's HTTP layer alone, server CPU per request (bench/bench_http_overhead.py); BENCH_HTTP_ARGS="--tree A --tree B".
bench-http-overhead: install
	$(BIN)/python bench/bench_http_overhead.py $(BENCH_HTTP_ARGS)

## The lifecycle's settings: next-hour AUC against table size per setting (bench/bench_lifecycle.py).
bench-lifecycle: install
	$(BIN)/python bench/bench_lifecycle.py $(BENCH_LIFECYCLE_ARGS)

## Bytes of a parameter-server row, admitted or not (bench/bench_table_bytes.py): sizing pserverMemory.
bench-table-bytes: install
	$(BIN)/python bench/bench_table_bytes.py $(BENCH_TABLE_BYTES_ARGS)

bench-storage: install
	$(BIN)/python bench/bench_storage.py

bench: bench-cube bench-rollout bench-serving bench-train

render: install
	$(BIN)/elastic-ctr render --stack dev --out rendered/dev

golden: install
	$(BIN)/elastic-ctr render --stack dev --out tests/golden/dev

## Regenerates Pulumi.yaml's config block from infra/config.py (the keys' one definition).
pulumi-yaml: install
	$(BIN)/python -m infra.pulumi_yaml > Pulumi.yaml.new && mv Pulumi.yaml.new Pulumi.yaml

## Regenerates provider/schema.json, the component package's schema, from the components' annotations
## and the stack keys (provider/schema.py): after changing an input or output of provider/ or a key.
pulumi-schema: install
	$(BIN)/python -m provider.schema

clean:
	rm -rf $(VENV) $(TRITON_VENV) $(KSERVE_VENV) $(NCA_VENV) $(CHECKOV_VENV) $(DOCS_VENV) runs rendered .pytest_cache site

## Container images elastic-ctr-{trainer,cube,serving,tracking}:$(IMAGE_TAG) and elastic-ctr-serving-paddle (serving
## with Paddle Inference) from the Dockerfile's targets, with
## a local engine (scripts/engine.sh start: the running daemon, else a private one under .cache/;
## it is left running) and a local base image where no registry answers (scripts/build-images.sh).
IMAGE_TAG ?= dev
.PHONY: images engine-stop
images:
	IMAGE_TAG=$(IMAGE_TAG) scripts/build-images.sh trainer cube serving tracking serving-paddle

## Stops the engine, only if scripts/engine.sh started it (images stay in .cache/containers).
engine-stop:
	scripts/engine.sh stop
