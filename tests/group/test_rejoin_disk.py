"""A node fenced while its disk is full cannot start the new series it must rejoin
with: it says so (``rejoin_failed`` naming the disk), refuses requests naming it,
keeps what is stored, and rejoins by itself once there is room (docs/group.md)."""

import uuid

import pytest

import cqsclient
from cqsclient.errors import CQSError

from .checker import QUEUE, STRUCTURE, owner_messages, reference_messages
from .cluster import FaultyGroup


@pytest.fixture
def alone(etcd_server):
    """NODE1 alone in its group, behind its etcd proxy and its lazyfs mount."""
    group = FaultyGroup(("NODE1",), etcd_server.endpoint, "D" + uuid.uuid4().hex[:6].upper(),
                        lease=2)
    try:
        group.nodes["NODE1"].start()
        yield group
    finally:
        group.close()


def test_a_full_disk_at_rejoin_is_refused_cleanly_and_rejoined_once_there_is_room(alone):
    """Fenced (cut off from etcd) with its disk full: once etcd answers it reports
    ENOSPC on its log directory instead of dying, refuses puts with STRUCTURE_FAILED
    saying why, and with room again rejoins as a new series and serves every
    acknowledged message, as the reference fold of the log has them."""
    node, mount, proxy = alone.nodes["NODE1"], alone.mounts["NODE1"], alone.proxies["NODE1"]
    node.wait_for("takeover_done", structure=STRUCTURE, timeout=30)
    with cqsclient.connect(node.address, client="D1", timeout=10) as c:
        ids = c.structure(STRUCTURE).put_batch(QUEUE, [b"kept%d" % i for i in range(50)])
    acked = dict(zip(ids, [b"kept%d" % i for i in range(50)], strict=True))
    mark = node.mark()
    mount.full(True)
    try:
        proxy.blackhole()
        node.wait_for("fenced", after=mark, timeout=30)
        proxy.heal()
        (failed,) = node.wait_for("rejoin_failed", after=mark, timeout=30)
        assert failed["reason"] == "ENOSPC" and failed["disk"].endswith("logstream"), failed
        assert node.alive
        with cqsclient.connect(node.address, client="D2", timeout=10) as c:
            with pytest.raises(CQSError) as refused:
                c.structure(STRUCTURE).put(QUEUE, b"refused")
        assert refused.value.reason == "STRUCTURE_FAILED", refused.value
        assert "cannot write its log" in refused.value.message, refused.value.message
    finally:
        mount.full(False)
    node.wait_for("node_rejoined", after=mark, timeout=30)
    node.wait_for("takeover_done", after=mark, structure=STRUCTURE, timeout=30)
    assert node.alive and not node.events("task_died")
    assert owner_messages(node.address) == acked == reference_messages(alone.data)
