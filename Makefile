# Two commands for a new user (README): `make run` and `make test`.
# Each creates the virtualenv, installs what it needs, and installs Java for
# Spark (and, for the tests, promtool) when it is missing and we are root; `make
# test` also installs the Debian tools the group's fault tests use (test-tools).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-tools lint bench java java-package promtool compiler native install clean

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

# The Java runtime for Spark: the release's own openjdk package, newest Spark
# supports first (Debian 13 and Ubuntu 24.04 offer 21, Debian 12 and Ubuntu
# 22.04 offer 17; Debian 13 no longer has 17). `make -s java-package` prints
# the one this release offers (after apt-get update).
JAVA_PACKAGES := openjdk-21-jre-headless openjdk-17-jre-headless

java-package:
	@for p in $(JAVA_PACKAGES); do \
	  if apt-cache policy "$$p" 2>/dev/null | grep -q 'Candidate: [^(]'; then echo "$$p"; exit 0; fi; \
	done; \
	echo "this release offers none of $(JAVA_PACKAGES): install Java 17 or 21 for Spark" >&2; exit 1

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
	    apt-get update -qq && pkg=$$($(MAKE) -s --no-print-directory java-package) && \
	    echo "installing $$pkg, a Java runtime for Spark" && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$$pkg"; \
	  else \
	    echo "Spark needs Java 17 or 21: install a JRE (make -s java-package names the release's)" >&2; exit 1; \
	  fi; \
	fi

# promtool (Debian's prometheus package) checks the metric names and the example
# alert rules in the tests (tests/test_alerts.py), installed when missing and root.
promtool:
	@if ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing prometheus for promtool"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	  else \
	    echo "the tests need promtool: install prometheus (Debian) or put promtool on PATH" >&2; exit 1; \
	  fi; \
	fi

run: native java
	$(BIN)/cqsd run $(if $(CONFIG),--config $(CONFIG))

# The whole suite, with branch coverage of our packages reported at the end, of
# the test process and of the daemons it starts and their Spark jobs (their
# COVERAGE_PROCESS_START is set by tests/daemon/harness.py; [tool.coverage] in
# pyproject.toml); pytest-cov combines the processes' data at the end. Below
# COVERAGE_MIN percent, the run fails (CI runs this target): 91.9 % measured on
# 2026-11-26 with every Python child traced, 79 % before the daemons were.
#
# It runs against both builds of the request path (docs/native.md): first the
# tests that drive its modules in process, and the daemon tests that cover its
# wire, contract, abuse, sharing and operator paths (SOURCE_TESTS, a minute and a
# half), on the Python source, the reference; then the whole suite on the
# compiled build, which is what `make run` starts. CQSD_BUILD makes each refuse
# the other build (and a stale one). Coverage cannot see into compiled code, so
# the first run's data is kept and the second appends to it: 88.95 % without
# those daemon tests, measured on 2026-11-27.
#
# Two pytest-xdist workers, each given whole files (their module fixtures, a Spark
# cluster or an etcd, stay in one process): the suite mostly waits on fsyncs,
# JVM starts and leases, so on two cores one worker ran 22 minutes at a third
# of the CPU. A third worker gained nothing (17:46 against 17:51 for the compiled
# part, 2026-11-27): Spark's JVMs, started by several workers at once, took the
# cores, and the tests that start them ran twice as long. Tried again once the
# jobs' JVMs started from their class archive (2026-11-27): 15:37 against 16:37,
# but a cluster test took 203 s of its 300 s timeout (67 s with two).
# The files go out in the order tests/conftest.py collects them, the long system
# tests first (not xdist's default, the files with the most tests first, which
# left the single-test fault loops and fuzz for the end). The 25 slowest tests
# are listed at the end.
COVERAGE_MIN := 90
TEST_WORKERS := 2
SOURCE_TESTS := tests/engine tests/protocol tests/logstream tests/server tests/client \
                tests/test_native.py tests/daemon/test_contract.py tests/daemon/test_wire.py \
                tests/daemon/test_abuse.py tests/daemon/test_sharing.py tests/daemon/test_ctl_ops.py
test: test-tools native java promtool
	CQSD_BUILD=source $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	    --cov --cov-report= $(SOURCE_TESTS)
	CQSD_BUILD=native $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	    --durations=25 --cov --cov-append --cov-report=term:skip-covered --cov-fail-under=$(COVERAGE_MIN)

# The request path compiled by mypyc beside its sources (tools/native.py,
# docs/native.md); it rebuilds only what changed since its last build.
native: compiler $(STAMP)
	$(BIN)/python tools/native.py build

# The service's virtualenv (docs/operations.md): the daemon, cqsctl and the SDK
# from this checkout, with the compiled build, which `pip install` copies along
# (package-data in both pyproject.toml) and each package then runs: the check
# below fails the install otherwise. A plain `pip install ./clients .` without a
# build installs the Python source alone: 130 against 111 µs of daemon CPU a
# message of the plain pattern (benchmarks/README.md, "Nineteenth session").
PREFIX ?= /opt/cqsd
SETUPTOOLS_BUILD := build/lib build/bdist.* clients/build  # pip's builds in the tree

# The build is made by the service's own interpreter (mypyc comes from its
# virtualenv and leaves it after), not with the test virtualenv `native` makes.
install: compiler
	test -x $(PREFIX)/bin/python || $(PYTHON) -m venv $(PREFIX)
	$(PREFIX)/bin/python -m pip install --quiet --upgrade pip
	$(PREFIX)/bin/python -m pip install --quiet ./clients . 'mypy>=1.15,<3' setuptools  # mypy: as the test extra
	$(PREFIX)/bin/python tools/native.py build
	$(PREFIX)/bin/python -m pip uninstall --quiet --yes mypy
	rm -rf $(SETUPTOOLS_BUILD)  # what an older install left there would go in too
	$(PREFIX)/bin/python -m pip install --quiet ./clients .  # a local project is always reinstalled
	rm -rf $(SETUPTOOLS_BUILD)
	$(PREFIX)/bin/python -c 'import sys, cqsd, cqsclient, cqsproto.native as n; \
	    sys.exit(set(n.chosen.values()) != {"native"} and f"not compiled: {n.chosen}")'

# A C compiler and the Python headers for `native`, installed when missing and
# we are root (as `java` is).
compiler:
	@if ! command -v cc >/dev/null 2>&1 || ! $(PYTHON) -c 'import os, sys, sysconfig; \
	    sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing a C compiler and the Python headers for the compiled build"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc python3-dev; \
	  else \
	    echo "the compiled build needs a C compiler and the Python headers: install gcc and python3-dev" >&2; exit 1; \
	  fi; \
	fi

# ruff (with the bugbear, import-order and async rules) over everything, and
# mypy over all of cqsd, logstream, clients and the examples: --strict on the
# engine, the record formats, SMDS, the protocol, the client, logstream and the
# examples, mypy's default mode elsewhere ([tool.ruff] and [tool.mypy] in
# pyproject.toml).
# CI runs it first.
lint: $(STAMP)
	$(BIN)/ruff check cqsd logstream clients tests benchmarks examples tools
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py
	$(BIN)/python benchmarks/server.py
	$(BIN)/python benchmarks/durability.py
	$(BIN)/python benchmarks/peers.py

clean:
	test ! -x $(BIN)/python || $(BIN)/python tools/native.py clean
	rm -rf $(VENV) build *.egg-info
