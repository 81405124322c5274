# The few commands people run. `make demo` and `make test` work on a fresh machine:
# they install what they need (Debian packages when missing, then a virtualenv).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The compiled filter index (router/core/_filter_index.c), rebuilt in place when it changes.
EXT    := $(VENV)/.compiled
# The dashboard's JavaScript libraries (router/web/assets.py pins them), fetched from the npm
# registry and checked against their published digests; never kept in the repository.
ASSETS := router/web/static/vendor/.fetched

.PHONY: demo test conformance check lint typecheck model web-assets system-deps clean

demo: $(STAMP) $(EXT) $(ASSETS)
	$(BIN)/router demo

# Test worker processes: each starts its own Redis servers (and Spark), so two fit the
# 2-core machines CI runs on (15 -> 8 minutes); TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2

test: system-deps $(STAMP) $(EXT) $(ASSETS) check
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 -n $(TEST_WORKERS)

# Suites written by others (../shared/conformance/*: zMQTT's broker tests, gmqtt's own
# suite), each against one node, two nodes and two nodes on a Redis Cluster; their code
# stays outside the repository (tests/conformance/suites.py starts the nodes and judges).
conformance: system-deps $(STAMP) $(EXT)
	$(BIN)/python -m tests.conformance.suites

check: lint typecheck

# The model-based session test (tests/cluster/test_session_model.py) searching longer than
# in `make test`: 200 random interleavings instead of a few.
model: $(STAMP) $(EXT)
	ROUTER_MODEL_EXAMPLES=200 $(BIN)/python -m pytest -q -p no:cacheprovider tests/cluster/test_session_model.py

lint: $(STAMP)
	$(BIN)/ruff check router cli tests examples
	$(BIN)/ruff format --check router cli tests examples

typecheck: $(STAMP)
	$(BIN)/mypy

web-assets: $(ASSETS)

# Debian packages the tests use for real: redis-server (standalone and cluster),
# redis-tools (redis-cli --cluster create), redis-sentinel (Redis behind Sentinel: the
# failover tests start three), libmosquitto1 (the reference matcher),
# mosquitto-clients (mosquitto_pub/_sub: real MQTT clients for the listener tests),
# mosquitto (mosquitto_passwd writes the password files the tests read), openssl (test certificates),
# a Java 17+ runtime for the Spark pipeline when `java` is missing or older,
# a C compiler and the Python headers for the compiled filter index,
# chromium (the dashboard's browser tests drive it through Playwright, which downloads no browser),
# curl (the docs' examples of /healthz and /metrics run in tests/system/test_doc_blocks.py),
# haproxy and nginx (load balancers in front of a node: the PROXY protocol and forwarded-address
# tests start them from a temporary config, never as services).
system-deps:
	@missing=""; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc"; \
	$(PYTHON) -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' || missing="$$missing python3-dev"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	command -v redis-sentinel >/dev/null 2>&1 || missing="$$missing redis-sentinel"; \
	ldconfig -p | grep -q 'libmosquitto\.so\.1' || missing="$$missing libmosquitto1"; \
	command -v mosquitto_sub >/dev/null 2>&1 || missing="$$missing mosquitto-clients"; \
	command -v openssl >/dev/null 2>&1 || missing="$$missing openssl"; \
	command -v mosquitto_passwd >/dev/null 2>&1 || missing="$$missing mosquitto"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v curl >/dev/null 2>&1 || missing="$$missing curl"; \
	command -v haproxy >/dev/null 2>&1 || missing="$$missing haproxy"; \
	command -v nginx >/dev/null 2>&1 || missing="$$missing nginx"; \
	java=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1); \
	[ "$${java:-0}" -ge 17 ] 2>/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench,spark,channels,socketio,broadcaster]'
	touch $(STAMP)

$(EXT): $(STAMP) setup.py router/core/_filter_index.c
	$(BIN)/python setup.py -q build_ext --inplace
	touch $(EXT)

# Fetched again when the pins change; the module itself skips files already as recorded.
$(ASSETS): $(STAMP) router/web/assets.py
	$(BIN)/python -m router.web.assets
	touch $(ASSETS)

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
	rm -f router/core/_filter_index.*.so
	rm -rf router/web/static/vendor
