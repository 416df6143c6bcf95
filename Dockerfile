# cqsd in a container (docs/operations.md, "Run in a container").
#
#   docker build -t cqsd .
#   docker run -d --name cqsd -v cqsd-data:/var/lib/cqsd -p 127.0.0.1:9410:9410 cqsd
#
# The base is Eclipse Temurin's Java 21 runtime on Ubuntu 24.04: the Java that
# Spark's checkpoint and recovery jobs need, and Python 3.12 from Ubuntu. The
# daemon runs as the unprivileged user cqsd under tini (signals forwarded,
# Spark's children reaped), keeps its data in the volume /var/lib/cqsd (and
# the Spark jobs' class archive, docs/operations.md, out of it), serves
# /metrics and /healthz on 9410 (the health check uses it), and listens on TCP
# 7410 when a config mounted at /etc/cqsd/cqsd.toml asks for it.
ARG BASE=eclipse-temurin:21-jre-noble

# The build stage compiles the request path (`make install`: mypyc, gcc and the
# Python headers, none of which the image keeps) into /opt/cqsd.
FROM ${BASE} AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md Makefile ./
COPY clients ./clients
COPY cqsd ./cqsd
COPY logstream ./logstream
COPY tools/native.py ./tools/
ENV PIP_NO_CACHE_DIR=1
RUN make install PREFIX=/opt/cqsd \
    && /opt/cqsd/bin/cqsd --version

FROM ${BASE}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/cqsd \
        --shell /usr/sbin/nologin cqsd \
    && install -d -o cqsd -g cqsd -m 0750 /var/lib/cqsd /run/cqsd /var/cache/cqsd
COPY --from=build /opt/cqsd /opt/cqsd
COPY config/container.toml /etc/cqsd/cqsd.toml
ENV PATH=/opt/cqsd/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/cqsd \
    CACHE_DIRECTORY=/var/cache/cqsd
USER 10001:10001
WORKDIR /var/lib/cqsd
VOLUME ["/var/lib/cqsd"]
EXPOSE 7410 9410
# Healthy once recovery is done and the daemon serves; a long recovery has the
# start period before failures count.
HEALTHCHECK --interval=30s --timeout=5s --start-period=5m --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:9410/healthz', timeout=4).status != 200)"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["cqsd", "run", "--config", "/etc/cqsd/cqsd.toml"]
