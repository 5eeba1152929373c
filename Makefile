# The README's two commands: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two pytest-xdist workers (tests/conftest.py says how tests are spread over them): 23-37 min on
# 2 cores instead of ~38 in one process
# (PYTEST_ARGS= for one process). The hang that kept this off was Python 3.11's wait_for
# swallowing a cancellation (core/deadlines.py).
PYTEST_ARGS ?= -n 2 --dist loadgroup --no-loadscope-reorder

.PHONY: run test check fuzz bench bench-quick dashboard-bench dashboard-screenshots clean spark-demo spark-bench proto cluster cluster-down

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Installed-marker files re-run pip only when pyproject.toml changes.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

## Start the service: gRPC on 127.0.0.1:8085, HTTP (health, metrics) on 8086, storage in ./data.
run: $(VENV)/.installed
	$(BIN)/pubsubd serve $(ARGS)

## ZooKeeper from Debian when it is missing (cluster coordination; the tests start their own
## nodes from its jars). The package `zookeeper` starts nothing; never `zookeeperd`.
ZOOKEEPER_JAR ?= /usr/share/java/zookeeper.jar
ZOOKEEPER_INSTALL := apt-get update && apt-get install -y --no-install-recommends zookeeper
$(ZOOKEEPER_JAR):
	@if [ "$$(id -u)" != 0 ]; then echo "ZooKeeper is not installed ($@ missing). Install it as root: $(ZOOKEEPER_INSTALL)" >&2; exit 1; fi
	export DEBIAN_FRONTEND=noninteractive && $(ZOOKEEPER_INSTALL)
	@test -f $@ || { echo "ZooKeeper installed, but $@ is still missing" >&2; exit 1; }

## A local cluster under ./cluster (ZooKeeper x3, 3 storage nodes in 3 zones, one `pubsubd serve
## --cluster`); it prints PUBSUB_EMULATOR_HOST. `make cluster-down` stops exactly its processes.
CLUSTER_DIR ?= cluster
cluster: $(VENV)/.installed $(ZOOKEEPER_JAR)
	$(BIN)/pubsubd cluster up --data-dir $(CLUSTER_DIR) $(ARGS)

cluster-down: $(VENV)/.installed
	$(BIN)/pubsubd cluster down --data-dir $(CLUSTER_DIR)

## nftables and iproute2 from Debian when missing: the partition test cuts a storage node off
## with nft inside a network namespace it creates with ip.
NFT ?= /usr/sbin/nft
IP ?= /usr/sbin/ip
NET_INSTALL := apt-get update && apt-get install -y --no-install-recommends nftables iproute2
$(NFT) $(IP):
	@if [ "$$(id -u)" != 0 ]; then echo "$@ is missing. Install it as root: $(NET_INSTALL)" >&2; exit 1; fi
	export DEBIAN_FRONTEND=noninteractive && $(NET_INSTALL)

## promtool from Debian when missing: the SLO tests check the exported Prometheus rules with it
## (`promtool check rules`, `promtool test rules`). Only the binary is taken out of Debian's
## `prometheus` package (apt-get download + dpkg-deb -x into .tools/): installing the package
## could start a Prometheus server listening on every interface.
PROMTOOL ?= $(shell command -v promtool || echo $(CURDIR)/.tools/promtool)
export PROMTOOL
$(CURDIR)/.tools/promtool:
	@if [ "$$(id -u)" = 0 ]; then apt-get update -qq; fi
	rm -rf .tools/deb && mkdir -p .tools/deb
	cd .tools/deb && apt-get download prometheus
	dpkg-deb -x .tools/deb/prometheus_*.deb .tools/deb/root
	cp .tools/deb/root/usr/bin/promtool $@ && rm -rf .tools/deb
	$@ --version

## Chromium from Debian when missing: the dashboard tests load every page in it, headless
## (tests/integration/test_dashboard.py); `make dashboard-screenshots` and the page-load
## benchmark use it too.
CHROMIUM ?= /usr/bin/chromium
export CHROMIUM
CHROMIUM_INSTALL := apt-get update && apt-get install -y --no-install-recommends chromium
$(CHROMIUM):
	@if [ "$$(id -u)" != 0 ]; then echo "Chromium is not installed ($@ missing). Install it as root: $(CHROMIUM_INSTALL)" >&2; exit 1; fi
	export DEBIAN_FRONTEND=noninteractive && $(CHROMIUM_INSTALL)
	@test -x $@ || { echo "Chromium installed, but $@ is still missing" >&2; exit 1; }

## Node.js and npm from Debian when missing, then the official Node client
## (@google-cloud/pubsub, pinned by tests/node/package-lock.json) into tests/node/node_modules
## with `npm ci` (no install scripts: its one, protobufjs's, only prints warnings), again only
## when the lock changes; tests/integration/test_node_client.py drives it against a real server.
NODE ?= $(shell command -v node || echo /usr/bin/node)
NPM ?= $(shell command -v npm || echo /usr/bin/npm)
export NODE
NODE_INSTALL := apt-get update && apt-get install -y --no-install-recommends nodejs npm
$(NODE) $(NPM):
	@if [ "$$(id -u)" != 0 ]; then echo "$@ is missing. Install Node.js and npm as root: $(NODE_INSTALL)" >&2; exit 1; fi
	export DEBIAN_FRONTEND=noninteractive && $(NODE_INSTALL)
	@test -x $@ || { echo "nodejs and npm installed, but $@ is still missing" >&2; exit 1; }

NODE_CLIENT := tests/node/node_modules/.installed
$(NODE_CLIENT): tests/node/package.json tests/node/package-lock.json | $(NODE) $(NPM)
	cd tests/node && $(NPM) ci --no-audit --no-fund --ignore-scripts
	touch $@

## Run the whole suite (unit, property, integration, crash, cluster).
test: $(VENV)/.installed-test $(ZOOKEEPER_JAR) $(NFT) $(IP) $(PROMTOOL) $(CHROMIUM) $(NODE_CLIENT)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## Fuzz every decoder that reads outside input (tests/fuzz/targets.py) with atheris: ten
## million inputs in all, split evenly across the targets, two targets at a time, each stopped
## after FUZZ_MAX_SECONDS at the latest. Prints inputs run and crashes per target; a crash's
## input is left in FUZZ_WORK/TARGET/ (turn it into tests/fuzz/corpus/TARGET/NAME once fixed).
FUZZ_INPUTS ?= 10000000
FUZZ_JOBS ?= 2
FUZZ_MAX_SECONDS ?= 1800
FUZZ_WORK ?= $(CURDIR)/.fuzz
fuzz: $(VENV)/.installed-test
	$(BIN)/python -m tests.fuzz.campaign --inputs $(FUZZ_INPUTS) --jobs $(FUZZ_JOBS) --max-seconds $(FUZZ_MAX_SECONDS) --work $(FUZZ_WORK) $(ARGS)

## Lint, type-check, and check the layering of ARCHITECTURE.md (import-linter contracts in
## pyproject.toml).
check: $(VENV)/.installed-test
	$(BIN)/ruff format --check src tests bench
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

## Benchmarks against pubsubd and Google's emulator; results printed and saved under bench/results.
bench: $(VENV)/.installed-test
	$(BIN)/python -m bench.run $(ARGS)

## Dashboard page load time in headless Chromium against a server with 100 topics
## (BENCHMARKS.md, "Dashboard page load"), and the README's screenshots (docs/screenshots/).
dashboard-bench: $(VENV)/.installed-test $(CHROMIUM)
	flock /tmp/pubsubd-bench.lock $(BIN)/python -m bench.dashboard_load $(ARGS)

dashboard-screenshots: $(VENV)/.installed-test $(CHROMIUM)
	$(BIN)/python -m bench.dashboard_load --runs 0 --screenshots docs/screenshots $(ARGS)

## Regenerate src/pubsubd/_gen from proto/ (committed; needs grpcio-tools in a separate venv so
## the project's protobuf runtime is left alone).
PROTOC_VENV ?= .venv-protoc
proto:
	test -x $(PROTOC_VENV)/bin/python || ($(PYTHON) -m venv $(PROTOC_VENV) && $(PROTOC_VENV)/bin/pip install --quiet 'grpcio-tools>=1.85,<2')
	rm -rf src/pubsubd/_gen && mkdir -p src/pubsubd/_gen
	$(PROTOC_VENV)/bin/python -m grpc_tools.protoc -Iproto --python_out=src/pubsubd/_gen --pyi_out=src/pubsubd/_gen proto/pubsubd/v1/replay.proto proto/pubsubd/v1/admin.proto proto/pubsubd/internal/v1/storage.proto proto/pubsubd/internal/v1/routing.proto proto/pubsubd/internal/v1/forwarder.proto proto/pubsubd/internal/v1/sources.proto proto/pubsubd/pulsar/api.proto
	$(PYTHON) proto/postprocess.py src/pubsubd/_gen

## Example Spark pipeline (pubsubd[spark], Java 17+): topic -> transform -> topic on local[*];
## ARGS=--cluster on a throwaway standalone cluster, ARGS=--connect from a Spark Connect client.
## Starts a throwaway pubsubd unless PUBSUB_EMULATOR_HOST is set; ARGS=--pubsubd-cluster starts a
## throwaway pubsubd cluster (ZooKeeper, storage nodes, a router, 2 frontends) instead.
spark-demo: $(VENV)/.installed-test
	$(BIN)/python examples/spark_demo.py $(ARGS)

## Spark connector throughput (rows/s server -> Spark, Spark -> server, beside the raw replay API
## and the null server)
## on local[2]; waits for /tmp/pubsubd-bench.lock so it never overlaps another benchmark.
spark-bench: $(VENV)/.installed-test
	flock /tmp/pubsubd-bench.lock $(BIN)/python -m bench.spark_bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
