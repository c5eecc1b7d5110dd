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
PYTEST_ARGS ?=

.PHONY: install browser constraints demo test test-fast bench-train bench-cube bench-rollout bench-serving bench-serving-peers bench-storage bench-tracking bench-online bench render golden pulumi-yaml clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Re-installs only when a requirements file or pyproject.toml changed.
$(STAMP): $(BIN)/python pyproject.toml $(filter-out requirements/kserve.txt,$(wildcard requirements/*.txt)) runtime/cube/kernel.c runtime/trainer/_signals.c runtime/serving/proto/open_inference.proto setup.py
	$(BIN)/pip install -q -c requirements/constraints.txt -e ".[trainer,serving,cube,infra,dev,s3,tracking-server]"
	touch $(STAMP)

$(TRITON_VENV)/.installed: requirements/tritonclient.txt
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install -q --upgrade pip
	$(TRITON_VENV)/bin/pip install -q -r requirements/tritonclient.txt
	touch $@

## Headless Chromium + chromedriver (Debian packages) for the browser test of the MLflow UI.
browser:
	bash scripts/install-browser.sh

install: $(STAMP) $(TRITON_VENV)/.installed browser

## Re-pins requirements/constraints.txt to what .venv holds (after changing a range).
constraints: $(BIN)/python
	$(BIN)/pip install -q -e ".[trainer,serving,cube,infra,dev,s3,tracking-server]"
	{ sed -n '1,/^# Refresh/p' requirements/constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -viE '^(py-spy|elastic-ctr)=='; } > requirements/constraints.txt.new
	mv requirements/constraints.txt.new requirements/constraints.txt

## The whole pipeline, locally, on generated data (see README).
demo: install
	$(BIN)/elastic-ctr local $(DEMO_ARGS)

## The test suite (unit, component, rendered manifests, local end-to-end).
test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

test-fast: install
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

bench-train: install
	$(BIN)/python bench/bench_train.py

bench-cube: install
	bash bench/ensure_redis.sh
	$(BIN)/python bench/bench_cube.py

bench-rollout: install
	$(BIN)/python bench/bench_rollout.py

bench-serving: install
	$(BIN)/python bench/bench_serving.py

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

## The online loop at production shape (bench/bench_online.py). BENCH_ONLINE_ARGS="--table-scale 0.2": a 5x
## smaller table; "--hours 2 --rows-per-hour 200000": a quick try; "--rollout-check": patches on a 10M-key base.
bench-online: install
	$(BIN)/python bench/bench_online.py $(BENCH_ONLINE_ARGS)

bench-storage: install
	$(BIN)/python bench/bench_storage.py

bench: bench-cube bench-rollout bench-serving bench-train

render: install
	$(BIN)/elastic-ctr render --stack dev --out rendered/dev

golden: install
	$(BIN)/elastic-ctr render --stack dev --out tests/golden/dev

## Regenerates Pulumi.yaml's config block from infra/config.py (the keys' one definition).
pulumi-yaml: install
	$(BIN)/python -m infra.config > Pulumi.yaml.new && mv Pulumi.yaml.new Pulumi.yaml

clean:
	rm -rf $(VENV) $(TRITON_VENV) $(KSERVE_VENV) runs rendered .pytest_cache

## Container images elastic-ctr-{trainer,cube,serving}:$(IMAGE_TAG) from the Dockerfile's targets, with
## a local engine (scripts/engine.sh start: the running daemon, else a private one under .cache/;
## it is left running) and a local base image where no registry answers (scripts/build-images.sh).
IMAGE_TAG ?= dev
.PHONY: images engine-stop
images:
	IMAGE_TAG=$(IMAGE_TAG) scripts/build-images.sh

## Stops the engine, only if scripts/engine.sh started it (images stay in .cache/containers).
engine-stop:
	scripts/engine.sh stop
