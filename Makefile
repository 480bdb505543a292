# EventBus: `make demo` runs the platform on its embedded default stack; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SITE ?= $(VENV)-torch
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_USAGE_STATS_ENABLED := 0
export NO_MKDOCS_2_WARNING := 1

.PHONY: system-deps setup lock kafka demo docs docs-build lint test test-unit test-integration bench bench-brokers bench-peers proto schema down clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt examples/plugin/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned (an unpinned torch pulls whatever build is newest), into a folder of
	# its own that the venv reads through a .pth file: a pipeline's `runtime_env: {pip: ...}`
	# makes Ray clone the whole venv, and PyPI's torch build brings ~4.6 GB of CUDA libraries
	# that every clone would copy (docs/concepts/control-plane.md, Isolation)
	test -d $(TORCH_SITE)/torch || $(PY) -m pip install -q -c constraints.txt --target $(TORCH_SITE) torch==2.13.0
	$(PY) -c "import os, sysconfig; open(os.path.join(sysconfig.get_paths()['purelib'], 'eventbus-torch.pth'), 'w').write(os.path.abspath('$(TORCH_SITE)') + '\\n')"
	$(PY) -c "import torch" || { echo "torch does not import from $(TORCH_SITE)"; exit 1; }
	# every package at the version constraints.txt locks (make lock writes it)
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	# the example plugin (a step and a sink kind through entry points): the tests use it
	$(PY) -m pip install -q --no-deps -e examples/plugin
	touch $@

# constraints.txt: the exact versions of every package in the venv (not EventBus itself),
# which `make setup` installs; run after changing pyproject's dependencies
lock: setup
	$(PY) -m pip freeze --exclude-editable | grep -v -i -E "^(eventbus|pip|setuptools|wheel)[=@ ]" > constraints.txt

demo: setup
	EB=$(VENV)/bin/eventbus bash examples/demo.sh

# The documentation site (mkdocs-material, mkdocs.yml): `make docs` serves it on
# http://127.0.0.1:8000 with live reload; `make docs-build` builds it into site/ with --strict
# (a broken link or a missing page fails). The reference pages are generated from the code
# at build time (docs/gen_reference.py).
docs: setup
	$(VENV)/bin/mkdocs serve

docs-build: setup
	$(VENV)/bin/mkdocs build --strict --site-dir site

# Debian packages the tests use: docker-compose validates docker-compose.yml offline;
# chromium + chromium-driver run the dashboard's headless browser test.
system-deps:
	# Java 17+ and Maven run and resolve Apache Kafka (make kafka)
	{ command -v java >/dev/null && command -v mvn >/dev/null; } || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null; }
	command -v docker-compose >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null; }
	{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }
	# redis-server with --tls-port/ACLs/cluster mode (Kafka serves its own TLS and SASL)
	{ command -v redis-server >/dev/null && command -v redis-cli >/dev/null; } || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; }

# Style, layering and types: ruff (lint + format), import-linter (the layers declared in
# pyproject), mypy --strict on src/.
lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples docs/gen_reference.py
	$(VENV)/bin/ruff format --check src tests benchmarks examples docs/gen_reference.py
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy src

# Apache Kafka's jars from Maven Central, once, into ~/.cache/eventbus (outside git); the
# tests, the benchmarks and `eventbus up --broker kafka` start the broker from them.
kafka: setup
	$(PY) -c "from eventbus._internal.kafka_broker import kafka_classpath as k; k()"

# The suite runs on Apache Kafka; then the embedded default's set (marked tansu: the demo
# flow, scale to zero, the kill tests of the embedded stack) runs again on Tansu.
test: setup system-deps kafka lint
	# the 25 slowest tests are listed at the end: the suite must stay under ~35 min
	$(PY) -m pytest -q --durations=25
	EVENTBUS_TEST_BROKER=tansu $(PY) -m pytest -q -m tansu --durations=10

test-unit: setup system-deps
	$(PY) -m pytest -q -m "not integration"

test-integration: setup system-deps kafka
	$(PY) -m pytest -q -m integration

# The Kafka benchmarks start their own broker: Apache Kafka here (--broker kafka, the default,
# named so the run says which); --broker tansu runs them on the embedded broker.
bench: setup kafka bench-peers
	command -v wrk >/dev/null || { apt-get update -q && apt-get install -y -q wrk; }
	$(PY) benchmarks/expressions.py
	$(PY) benchmarks/kafka_pipeline.py --broker kafka
	$(PY) benchmarks/avro_pipeline.py --broker kafka
	$(PY) benchmarks/kafka_path_cpu.py
	$(PY) benchmarks/http_ingress.py
	$(PY) benchmarks/peers.py --broker kafka
	$(PY) benchmarks/latency.py --broker kafka
	$(PY) benchmarks/kafka_clients.py
	$(PY) benchmarks/aggregate.py
	$(PY) benchmarks/http_sink.py
	$(PY) benchmarks/allocation_k10k.py
	$(PY) benchmarks/allocation_day.py
# issue 40 at a size of a few minutes (the full size: --models 300 --events 60000)
	$(PY) benchmarks/models_many.py --models 100 --events 20000 --rate 1000

# kafka_pipeline, peers, latency and idle on Apache Kafka, then on Tansu, side by side
bench-brokers: setup kafka bench-peers
	$(PY) benchmarks/brokers.py

# The peers of benchmarks/peers.py (Quix Streams, Bytewax, Faust, the confluent-kafka loop) and
# of benchmarks/expressions.py (jsonata-python), one
# venv each under .venv-bench: their pins (Quix's confluent-kafka 2.12, Faust's aiokafka) stay
# out of the project's dependencies and out of each other's. py-spy (peers.py --profile) goes
# into the project's venv: it is a binary, with no Python dependencies.
BENCH_VENV := .venv-bench
BENCH_PEERS := quixstreams bytewax faust confluent jsonata
bench-peers: setup $(foreach p,$(BENCH_PEERS),$(BENCH_VENV)/$(p)/.installed)
	$(PY) -m pip install -q py-spy==0.4.3

$(BENCH_VENV)/%/.installed: benchmarks/peer_apps/requirements-%.txt
	test -x $(BENCH_VENV)/$*/bin/python || $(PYTHON) -m venv $(BENCH_VENV)/$*
	$(BENCH_VENV)/$*/bin/python -m pip install -q -r $<
	touch $@

# Regenerate the protobuf/gRPC modules from src/eventbus/eventing/_proto/*.proto
proto: setup
	$(PY) -c "from pathlib import Path; from tests.unit.gateway.test_proto_stubs import regenerate, PROTO_DIR, GENERATED; import shutil, tempfile; d = Path(tempfile.mkdtemp()); regenerate(d); [shutil.copy(d / n, PROTO_DIR / n) for n in GENERATED]"

# The committed schema holds the built-in kinds only (`eventbus schema` adds installed plugins').
schema: setup
	$(PY) -c "from eventbus.pipelines._schema import pipeline_schema_json as s; open('eventbus.schema.json', 'w').write(s(plugins=False))"

down:
	$(VENV)/bin/eventbus down

clean:
	rm -rf $(VENV) $(TORCH_SITE) $(BENCH_VENV) build *.egg-info
