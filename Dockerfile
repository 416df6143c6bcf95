# A stub until the operations issue: installs cqsd and runs the daemon on its
# embedded default configuration.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/cqsd
COPY . /src/cqsd
RUN pip install --no-cache-dir /src/cqsd/clients /src/cqsd
VOLUME ["/srv/cqsd/cqsd-data"]
CMD ["cqsd", "run"]
