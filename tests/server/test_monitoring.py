"""The monitoring listener answers while the start's recovery runs: /healthz with the
documented ``503 starting``, /metrics with the daemon-wide families, and keeps its
sockets for the serving that follows."""

import threading
import time
from types import SimpleNamespace

import trio
from prometheus_client.parser import text_string_to_metric_families

from cqsd.server.metrics import Fsyncs, Monitor


def starting_daemon():
    """What the monitor reads of the rooms of a daemon that has not finished recovery."""
    return SimpleNamespace(life=SimpleNamespace(started=time.time(), ready=False,
                                                stopping=False),
                           journal=SimpleNamespace(failed=None))


async def get(port: int, path: str) -> tuple[int, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


async def test_health_and_metrics_answer_while_recovery_runs():
    d = starting_daemon()
    monitor = Monitor(d, Fsyncs())
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    release, results = threading.Event(), []

    def recovery():  # the synchronous rebuild, held until the probes have answered
        assert release.wait(30)
        return "rebuilt"

    async with trio.open_nursery() as nursery:
        async def start():
            results.append(await monitor.serve_during(listeners, recovery))
        nursery.start_soon(start)
        try:
            code, body = await get(port, "/healthz")
            assert code == 503 and '"status": "starting"' in body
            code, body = await get(port, "/metrics")
            values = {s.name: s.value for f in text_string_to_metric_families(body)
                      for s in f.samples}
            assert code == 200 and values["cqsd_ready"] == 0
            assert values["process_resident_memory_bytes"] > 0
            assert not any(name.startswith("cqsd_structure") for name in values)
            assert results == []  # recovery is still running
        finally:
            release.set()
    assert results == ["rebuilt"]
    d.life.ready = True  # the same sockets serve on, now ready
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.serve, listeners)
        code, body = await get(port, "/healthz")
        assert code == 200 and '"status": "ready"' in body
        nursery.cancel_scope.cancel()


class Unreadable(Exception):
    pass


async def test_a_recovery_that_fails_raises_its_own_error():
    """What the rebuild raises reaches ``cqsd run`` as itself (it names it and exits 1),
    not wrapped in an exception group."""
    monitor = Monitor(starting_daemon(), Fsyncs())
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    def recovery():
        raise Unreadable("image MSGQ01.img: bad checksum")

    try:
        await monitor.serve_during(listeners, recovery)
    except Unreadable as err:
        assert "bad checksum" in str(err)
    else:
        raise AssertionError("the failure was not raised")
