# Two commands for a new user (README): `make run` and `make test`.
# Each creates the virtualenv, installs what it needs, and installs Java for
# Spark when it is missing and we are root; `make test` also installs the
# Debian tools the group's fault tests use (test-tools).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-tools lint bench java clean

# Debian packages the tests need, by the command each provides: etcd for the
# group tests, faketime for the clock steps, fuse3 (fusermount3) for lazyfs,
# and libfuse3-dev with pkg-config so that pip can build pyfuse3 (a `test` extra).
TEST_TOOLS := etcd:etcd-server faketime:faketime fusermount3:fuse3 \
              pkg-config:pkg-config
TEST_LIBS  := fuse3:libfuse3-dev

# The client (clients/: cqsclient, cqsctl and the wire protocol) is its own
# distribution, which the server's depends on; both are installed editable.
$(STAMP): pyproject.toml clients/pyproject.toml | test-tools
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./clients -e '.[test]'
	touch $@

# Installs what is missing when we are root (as `java` does), else says what to install.
test-tools:
	@missing=""; \
	for pair in $(TEST_TOOLS); do \
	  command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; \
	done; \
	for pair in $(TEST_LIBS); do \
	  pkg-config --exists $${pair%%:*} 2>/dev/null || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing the test tools:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "the tests need these Debian packages:$$missing" >&2; exit 1; \
	  fi; \
	fi

java:
	@if ! java -version >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing a Java runtime for Spark"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
	  else \
	    echo "Spark needs Java 17 or later: install a JRE (e.g. openjdk-17-jre-headless)" >&2; exit 1; \
	  fi; \
	fi

run: $(STAMP) java
	$(BIN)/cqsd run $(if $(CONFIG),--config $(CONFIG))

# The whole suite, with branch coverage of our packages reported at the end
# ([tool.coverage] in pyproject.toml; the daemons the tests start are not traced).
test: test-tools $(STAMP) java
	$(BIN)/python -m pytest --cov --cov-report=term:skip-covered

# ruff (with the bugbear, import-order and async rules) over everything, and
# mypy --strict on the engine, the record formats, the protocol, the client,
# logstream and the examples ([tool.ruff] and [tool.mypy] in pyproject.toml).
# CI runs it first.
lint: $(STAMP)
	$(BIN)/ruff check cqsd logstream clients tests benchmarks examples
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py
	$(BIN)/python benchmarks/server.py
	$(BIN)/python benchmarks/durability.py
	$(BIN)/python benchmarks/peers.py

clean:
	rm -rf $(VENV) build *.egg-info
