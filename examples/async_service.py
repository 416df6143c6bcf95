"""An async request/reply service, under asyncio or Trio (AnyIO).

    CQSD_ADDRESS=unix://./cqsd-data/cqsd.sock python examples/async_service.py [asyncio|trio]

A request on the TRANQ queue is "REPLYQUEUE text"; the service answers with
the text upper-cased on the LTERM queue REPLYQUEUE. The reply is put and the
request deleted in one unit of work, so a crash never leaves a request
answered twice or not at all. Up to eight requests are served at once, each
in its own task; SIGTERM or Ctrl-C stops the service once those in hand are
answered.
"""

import os
import signal
import sys

import anyio

import cqsclient.aio

CONCURRENCY = 8


async def answer(s: cqsclient.aio.StructureHandle, request: cqsclient.Message,
                 slots: anyio.Semaphore) -> None:
    try:
        reply_queue, _, text = request.data.decode().partition(" ")
        async with s.unit_of_work() as uow:
            uow.put(reply_queue, text.upper().encode(), qtype="LTERM")
            uow.delete(request.entry_id)
    finally:
        slots.release()


async def stop_on_signal(requests: cqsclient.aio.Consumer) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            requests.stop()
            return


async def main() -> None:
    client = os.environ.get("CQSD_CLIENT", "SERVICE1")
    async with cqsclient.aio.connect(client=client, reconnect=True) as c:
        s = await c.structure("MSGQ01")
        slots = anyio.Semaphore(CONCURRENCY)
        async with anyio.create_task_group() as watch, s.consume(
                "TRANQ", prefetch=CONCURRENCY) as requests:
            watch.start_soon(stop_on_signal, requests)
            print("serving", flush=True)
            async with anyio.create_task_group() as serving:
                async for request in requests:
                    await slots.acquire()
                    serving.start_soon(answer, s, request, slots)
            watch.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main, backend=sys.argv[1] if len(sys.argv) > 1 else "asyncio")
