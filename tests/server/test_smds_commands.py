"""The operator's SMDS commands (smds/commands.py) on a daemon run in-process:
stop-smdsconn closes a data set and start-smdsconn opens it again, alter-smds
sets the overrides and resizes the pool, and a command the state does not
allow is refused before anything closes."""

import threading

import pytest
import trio

import cqsd.server.smds.opened
from cqsd.engine import CQSError, Reason

from .conftest import received
from .test_datasets import client, daemon, put_durably, send  # noqa: F401 - fixtures

KEY = ("SMDS1", "APP1")


async def test_stop_then_start_smdsconn(daemon, client):  # noqa: F811
    """stop closes the data set, saving its map, and its connection is STOPPED; start
    makes it NORMAL and opens it again, its message still readable."""
    await put_durably(daemon, *client)
    commands, sets = daemon.smds_commands, daemon.datasets.open_sets
    [row] = await commands.stop("SMDS1", "APP1")
    assert KEY not in sets.open and row["avail"] == "STOPPED"
    assert daemon.datasets.states.record(KEY)["map_time"] is not None
    [row] = await commands.start("SMDS1", None)
    assert KEY in sets.open and (row["status"], row["avail"]) == ("OPEN", "NORMAL")
    [entry] = list(daemon.registry.pairs["SMDS1"])
    assert bytes(daemon.datasets.payload(entry))[:4] == bytes(range(4))


async def test_alter_smds_sets_the_overrides_and_resizes_the_pool(daemon, client):  # noqa: F811
    """dsbufs resizes the structure's pool to what its data sets ask for; dsexpand
    no turns expansion off; default drops an override."""
    await put_durably(daemon, *client)
    commands, tuning = daemon.smds_commands, daemon.datasets.tuning
    assert commands.alter("SMDS1", "APP1", 7, "no") is None  # no growth started
    row = daemon.datasets.displays.row(KEY)
    assert (row["dsbufs"], row["dsexpand"]) == (7, False)
    assert tuning.pool("SMDS1").statistics().buffers == max(7, daemon.config.structure(
        "SMDS1").dsbufs)
    commands.alter("SMDS1", "APP1", "default", "default")
    row = daemon.datasets.displays.row(KEY)
    assert (row["dsbufs"], row["dsexpand"]) == (daemon.config.structure("SMDS1").dsbufs, True)


@pytest.mark.parametrize(("args", "words"), [
    (("NOPE", "APP1", None, None), "no structure named"),
    (("SMDS1", "app 1", 5, None), "is not a client name"),
    (("SMDS1", "APP1", 0, None), "dsbufs must be 1 to"),
    (("SMDS1", "APP1", None, "maybe"), "dsexpand must be yes, no or default"),
    (("SMDS1", "APP1", None, None), "give --dsbufs, --dsexpand or both"),
])
async def test_alter_smds_refuses_what_it_cannot_do(daemon, args, words):  # noqa: F811
    """A bad structure, owner or value is refused, naming what is wrong."""
    with pytest.raises(CQSError) as err:
        daemon.smds_commands.alter(*args)
    assert words in err.value.message
    assert err.value.reason in (Reason.INVALID_REQUEST, Reason.UNKNOWN_STRUCTURE)


async def test_reset_smds_failed_abandons_the_data_set_at_once(daemon, client):  # noqa: F811
    """STATUS(FAILED) closes the open data set without saving its map, and a read
    of its message is refused SMDS_UNAVAILABLE; reset-smds with nothing to set is
    refused before anything changes."""
    await put_durably(daemon, *client)
    commands = daemon.smds_commands
    with pytest.raises(CQSError) as err:
        await commands.reset("SMDS1", "APP1", None, None)
    assert err.value.reason == Reason.INVALID_REQUEST and KEY in daemon.datasets.open_sets.open
    row = await commands.reset("SMDS1", "APP1", None, "failed")
    assert row["status"] == "FAILED" and KEY not in daemon.datasets.open_sets.open
    assert daemon.datasets.states.record(KEY)["map_time"] is None
    [entry] = list(daemon.registry.pairs["SMDS1"])
    with pytest.raises(CQSError) as err:
        daemon.datasets.payload(entry)
    assert err.value.reason == Reason.SMDS_UNAVAILABLE


async def test_a_rescan_runs_aside_while_other_requests_are_served(daemon, client,  # noqa: F811
                                                                   monkeypatch):
    """start-smdsconn rebuilds the data set's space map in a worker thread: a put
    kept in memory and a ping are answered before the rescan is done, a read of
    the data set's message meanwhile gets SMDS_UNAVAILABLE (no half-built map),
    and a delete of it meanwhile frees its pages once the map is whole."""
    session, end = client
    eid = await put_durably(daemon, session, end)
    commands, sets = daemon.smds_commands, daemon.datasets.open_sets
    await commands.stop("SMDS1", "APP1")
    daemon.datasets.states.set(KEY, map_time=None)  # no saved map: a rescan
    order: list[str] = []
    entered, go = threading.Event(), threading.Event()
    real = cqsd.server.smds.opened.restart

    def gated(*args, **kwargs):
        entered.set()
        go.wait(10)  # on the loop (as it was) this holds every request for 10 s
        try:
            return real(*args, **kwargs)
        finally:
            order.append("rescan done")

    monkeypatch.setattr(cqsd.server.smds.opened, "restart", gated)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(commands.start, "SMDS1", "APP1")
        await trio.to_thread.run_sync(entered.wait)
        send(daemon, session, "put", structure="SMDS1", queue="SMALL", data=b"kept in memory")
        send(daemon, session, "ping")
        send(daemon, session, "read", structure="SMDS1", queue="Q")
        assert await daemon.journal.wait_durable(daemon.journal.position)
        put, ping, read = received(end)
        order.append("answered")
        assert put["ok"] and ping["ok"]
        assert read["reason"] == "SMDS_UNAVAILABLE" and "OPENING" in read["message"]
        send(daemon, session, "dequeue", structure="SMDS1", queue="Q")  # deletes eid
        assert await daemon.journal.wait_durable(daemon.journal.position)
        assert received(end)[0]["ok"]
        go.set()
    assert order == ["answered", "rescan done"]
    assert KEY in sets.open
    space = sets.open[KEY].space
    space.release(daemon.journal.durable)
    assert space.usage().used_pages == 0, eid  # the delete made meanwhile freed its pages
