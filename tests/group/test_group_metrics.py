"""A node of a group as monitoring sees it: its role in status and its metrics."""

import shutil
import subprocess
import urllib.request
import uuid

import pytest

import cqsclient
from tests.group.cluster import Node, shared_data
from tests.group.etcdserver import free_port


@pytest.fixture
def node(etcd_server):
    port = free_port()
    n = Node("NODE1", shared_data(), etcd_server.endpoint, group="M" + uuid.uuid4().hex[:5].upper(),
             daemon_keys=f'metrics_listen = "127.0.0.1:{port}"')
    n.metrics = f"http://127.0.0.1:{port}/metrics"
    n.start()
    n.wait_for("takeover_done", count=2)
    yield n
    n.cleanup()


def test_an_owner_shows_its_role_and_metrics(node):
    """status says what the node owns; /metrics says it owns them, is not fenced, and
    passes promtool's checks."""
    with cqsclient.connect(node.address, client="OPS", operator=True) as c:
        role = c.query("status")[0]["group"]
    assert role["node"] == "NODE1" and role["owns"] == ["EMHQ01", "MSGQ01"]
    assert role["fenced"] is False and role["lease_left"] > 0
    with urllib.request.urlopen(node.metrics, timeout=10) as r:
        text = r.read().decode()
    assert 'cqsd_structure_owned{structure="MSGQ01"} 1.0' in text
    assert "cqsd_node_fenced 0.0" in text and "cqsd_node_takeovers_total 2.0" in text
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool (Debian prometheus) is needed: make test installs it"
    checked = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                             capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
