"""An unexpected exception costs one request when the structures are untouched, and
otherwise stops the daemon cleanly, as a log failure does; a dead task stops it too.

These run the daemon in-process (over its real Unix socket and data directory)
so that a bug can be planted where no request could put one.
"""

import contextlib

import pytest
import structlog
import trio

import cqsclient.aio
from cqsclient.errors import ConnectionLost, CQSError
from cqsd.config import loads
from cqsd.engine.qtypes import list_header
from cqsd.server import checkpoints, daemon, wire


def config(tmp_path):
    return loads(f'[daemon]\ndata_dir = "{tmp_path}/d"\nsocket = "{tmp_path}/s"\n'
                 '[[structure]]\nname = "MSGQ01"\nsize = "1MiB"\n')


async def serve(tmp_path, nursery):
    d = daemon.Daemon(config(tmp_path))
    await nursery.start(d.run)
    return d


async def stopping(tmp_path, during) -> daemon.LogFailed:
    """How the daemon stops while (or after) ``during(d)`` talks to it."""
    stopped = []
    d = daemon.Daemon(config(tmp_path))

    async def run(task_status):
        with pytest.raises(daemon.LogFailed) as caught:
            await d.run(task_status=task_status)
        stopped.append(caught.value)

    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        await during(d)
    return stopped[0]


def client(tmp_path, name="C"):
    return cqsclient.aio.connect(f"unix://{tmp_path}/s", client=name)


async def test_a_bug_outside_the_engine_fails_its_request_alone(tmp_path, monkeypatch):
    """A reply that cannot be built fails that read with INVALID_REQUEST; the message
    stays locked to the reader, and the daemon goes on serving.

    The bug is planted in the reply's module data, not its code, which may be
    compiled (docs/native.md): without its table of queue type names, ``wire.message``
    raises TypeError on both builds."""
    async with trio.open_nursery() as nursery:
        d = await serve(tmp_path, nursery)
        async with client(tmp_path) as c:
            s = await c.structure("MSGQ01")
            eid = await s.put("Q", b"x")
            monkeypatch.setattr(wire, "TYPE_NAMES", None)
            with pytest.raises(CQSError) as failed:
                await s.read("Q")
            assert failed.value.reason == "INVALID_REQUEST"
            monkeypatch.undo()
            await s.delete(eid)
            assert await s.browse("Q") == []
        d.stop("test")


async def test_a_bug_inside_the_engine_stops_the_daemon_without_an_image(tmp_path):
    """An engine method that raises half-way may have changed the structure: the
    request is not acknowledged, the daemon logs internal_error and stops with
    exit code 4, and the restart recovers what the log holds.

    The bug is planted in the engine's memory, not its code, which may be compiled
    (docs/native.md): the queue's list header loses it, so the delete that empties
    the queue takes its message off it, then raises."""
    async def during(d):
        with contextlib.suppress(ConnectionLost):  # the daemon is gone when it deregisters
            async with client(tmp_path) as c:
                s = await c.structure("MSGQ01")
                eid = await s.put("Q", b"kept")
                primary = d.registry.pairs["MSGQ01"].primary
                [(qtype, _)] = [key for key in primary._queues if key[1] == "Q"]
                del primary._headers[list_header(qtype, "Q")]["Q"]
                with pytest.raises(CQSError):
                    await s.operator_delete(eid)

    with structlog.testing.capture_logs() as logs:
        stopped = await stopping(tmp_path, during)
    assert stopped.exit_code == 4
    assert [e["op"] for e in logs if e["event"] == "internal_error"] == ["delete"]
    assert not list((tmp_path / "d" / "images").glob("MSGQ01*"))
    async with trio.open_nursery() as nursery:
        d = await serve(tmp_path, nursery)
        async with client(tmp_path) as c:
            assert [m.data for m in await (await c.structure("MSGQ01")).browse("Q")] == [b"kept"]
        d.stop("test")


async def test_a_task_that_dies_is_named_and_stops_the_daemon(tmp_path, monkeypatch):
    """If the checkpoint trigger task raises, the daemon logs task_died naming it and
    stops (exit code 4) rather than running on without checkpoints."""
    async def dies(self):
        raise OSError("planted")

    async def during(d):
        pass

    monkeypatch.setattr(checkpoints.Checkpoints, "run", dies)
    with structlog.testing.capture_logs() as logs:
        assert (await stopping(tmp_path, during)).exit_code == 4
    died = [e for e in logs if e["event"] == "task_died"]
    assert [(e["task"], e["error"]) for e in died] == [("checkpoint triggers", "OSError: planted")]
