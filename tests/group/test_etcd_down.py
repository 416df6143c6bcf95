"""etcd down: no node acknowledges once its lease has run out, every request gets
STRUCTURE_FAILED naming etcd, and when etcd comes back a node owns the pair again
with nothing acknowledged lost."""

import threading
import time
import uuid

import pytest

from .checker import History, Producer, drain
from .cluster import Node, shared_data
from .etcdserver import EtcdServer
from .test_takeover_faults import SLACK, refused_for_etcd, wait_owner

LEASE = 2
PROGRESS = 20


@pytest.fixture
def etcd_alone(tmp_path):
    """An etcd of this test's own, which it stops and starts again."""
    server = EtcdServer(tmp_path).start()
    yield server
    server.stop()


def test_etcd_down_stops_acknowledgements_and_loses_nothing(etcd_alone):
    data, name = shared_data(), "G" + uuid.uuid4().hex[:6].upper()
    nodes = {n: Node(n, data, etcd_alone.endpoint, group=name, lease=LEASE)
             for n in ("NODE1", "NODE2")}
    history, stop, owner_found = History(), threading.Event(), False
    addresses = [n.address for n in nodes.values()]
    producers = [Producer(i, addresses, history, stop) for i in range(2)]
    try:
        for node in nodes.values():
            node.start()
        wait_owner(nodes)
        marks = {n: node.mark() for n, node in nodes.items()}
        for p in producers:
            p.start()
        history.wait_for_puts(PROGRESS, "the producers made no progress")
        etcd_alone.stop()
        for n, node in nodes.items():  # every node's lease runs out: all are fenced
            node.wait_for("fenced", after=marks[n], timeout=30)
        silent_from = time.monotonic() + SLACK
        for node in nodes.values():
            assert "etcd" in refused_for_etcd(node)
        time.sleep(2 * LEASE)  # the outage's length (a fault, not a wait): producers retry
        back = time.monotonic()
        etcd_alone.start()
        owner = wait_owner(nodes)
        owner_found = True
        history.wait_for_puts(len(history.put_ok) + PROGRESS, "no progress once etcd was back")
    finally:
        stop.set()
        for p in producers:
            p.join(60)
        verdict = history.verdict(drain([owner.address])) if owner_found else None
        for node in nodes.values():
            node.cleanup()
    assert all(p.error is None for p in producers), [p.error for p in producers]
    late = [t for t, _ in history.acks if silent_from < t < back]
    assert late == [], f"{len(late)} puts acknowledged while etcd was down"
    print({k: (len(v) if isinstance(v, list) else v) for k, v in verdict.items()})
    assert verdict is not None and verdict["lost"] == [] and verdict["unexpected"] == []
    assert verdict["duplicated_at_end"] == []
