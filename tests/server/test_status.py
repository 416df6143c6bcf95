"""The status snapshot (status.py) reads the rooms: the daemon's state from its
life and its log, each structure's figures, and the log's."""

from types import SimpleNamespace

from cqsd.server import status
from cqsd.server.rooms import Life

from .test_dispatch import config, daemon, put, register  # noqa: F401 - fixtures


def rooms(failed=None, **life):
    return SimpleNamespace(journal=SimpleNamespace(failed=failed), life=Life(**life))


def test_the_state_says_starting_ready_stopping_or_log_failed():
    """A log failure outranks a stop, a stop outranks readiness."""
    assert status.state(rooms()) == "starting"
    assert status.state(rooms(ready=True)) == "ready"
    assert status.state(rooms(ready=True, stopping=True)) == "stopping"
    assert status.state(rooms(failed=OSError("eio"), ready=True, stopping=True)) == "log_failed"


async def test_the_snapshot_shows_structures_and_the_log(daemon, register):  # noqa: F811
    """A put shows in its structure's row and in the log's appended LSN."""
    session, _ = register("A")
    put(daemon, session)
    assert await daemon.journal.wait_durable(daemon.journal.position)
    snap = status.snapshot(daemon.rooms)
    [row] = snap["structures"]
    assert (row["name"], row["status"], row["messages"]) == ("MSGQ01", "available", 1)
    log = snap["log"]
    assert log["appended_lsn"] == log["durable_lsn"] == daemon.journal.position
    assert log["segments"] >= 1 and log["failed"] is None
    assert snap["uptime_seconds"] >= 0 and snap["recovering"] == []
