"""Operator sessions (cqsctl) apart from applications: they take no client slot, never
collide with one another under the same name, and own their locks alone."""

import base64
import json
import subprocess
import sys

import pytest

import cqsclient
from cqsclient.errors import ClientLimit

from .harness import Raw


def ctl(daemon, *args, env_client="OPS"):
    return subprocess.Popen(
        [sys.executable, "-m", "cqsclient.ctl", "--address", daemon.address,
         "--client", env_client, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_cqsctl_at_once_with_every_client_slot_taken(make_daemon):
    """With 32 applications registered (max_clients), two cqsctl runs under the same name
    are served at once, each reading and deleting its own message; a 33rd application
    is still refused."""
    d = make_daemon("resync_grace = 0\nlog_level = \"debug\"").start()  # operator sessions: debug
    apps = [Raw(d.socket) for _ in range(32)]
    try:
        for i, app in enumerate(apps):
            assert app.register(f"APP{i:02d}")["ok"]
        with pytest.raises(ClientLimit):
            cqsclient.connect(d.address, client="APP32")
        before = d.mark()
        readers = [ctl(d, "--json", "read", "MSGQ01", "OPSQ", "--wait", "20") for _ in range(2)]
        registered = d.wait_for("register", 2, after=before, operator=True)
        assert len({e["client"] for e in registered}) == 2  # OPS:<id>, one each
        status = ctl(d, "status")
        out, err = status.communicate(timeout=60)
        assert status.returncode == 0, err
        assert "clients: 32 of 32" in out and "operator_sessions: 3" in out
        for data in (b"one", b"two"):
            assert apps[0].request("put", structure="MSGQ01", queue="OPSQ", data=data)["ok"]
        outs = [r.communicate(timeout=60) for r in readers]
        assert [r.returncode for r in readers] == [0, 0], outs
        got = sorted(base64.b64decode(json.loads(o)["data"]["base64"]) for o, _ in outs)
        assert got == [b"one", b"two"]
        assert not d.events("request_failed", reason="CLIENT_ACTIVE")
    finally:
        for app in apps:
            app.close()


def test_an_operator_session_that_drops_returns_its_locks_at_once(make_daemon):
    """An operator session cannot come back for its locks, so even with a resync grace
    they return as soon as it drops, and its name frees no application's slot."""
    d = make_daemon("resync_grace = 600").start()
    with cqsclient.connect(d.address, client="APP") as app:
        s = app.structure("MSGQ01")
        s.put("Q", b"held by an operator")
        ops = cqsclient.connect(d.address, client="APP", operator=True)  # same name: no clash
        assert ops.structure("MSGQ01").read("Q").data == b"held by an operator"
        ops.abort()  # a drop, not a deregistration
        d.wait_for("peer_recovery", structure="MSGQ01")
        assert s.read("Q", wait=5).data == b"held by an operator"
        rows = {r["client"]: r for r in app.query("clients")}
        assert rows["APP"]["operator"] is False and len(rows) == 1
