"""A group on loopback for the benchmarks: a real etcd, and nodes sharing a data
directory, from the group tests' harness (``tests/group``)."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.group.cluster import Node, shared_data
from tests.group.etcdserver import EtcdServer


@contextlib.contextmanager
def etcd(prefix: str) -> Iterator[EtcdServer]:
    """An etcd of its own in a temporary directory, stopped at the end."""
    server = EtcdServer(Path(tempfile.mkdtemp(prefix=prefix))).start()
    try:
        yield server
    finally:
        server.stop()


def group_nodes(server: EtcdServer, names: tuple[str, ...], group: str, structures: str,
                **keys) -> dict[str, Node]:
    """Nodes ``names`` of a fresh group (``group`` and a random suffix) on a fresh
    shared data directory, not started; ``keys`` are Node's (lease, standby, ...)."""
    group, data = group + uuid.uuid4().hex[:6].upper(), shared_data()
    return {n: Node(n, data, server.endpoint, group=group, structures=structures, **keys)
            for n in names}
