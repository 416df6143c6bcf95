"""The async SDK against a real daemon, under Trio and under asyncio."""

import anyio
import anyio.lowlevel
import pytest

import cqsclient.aio


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_async_client_pipelines_and_is_notified(daemon, backend):
    """Concurrent tasks on one connection put, wait-read and get notifications."""

    async def main():
        async with cqsclient.aio.connect(daemon.address, client=f"AIO{backend[:2]}") as c:
            s = await c.structure("MSGQ01")
            await c.register_interest("MSGQ01", "ASYNC")
            got = []

            async def reader():
                got.append(await s.read("ASYNC", wait=10))

            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                while not [r for r in await c.query("queues", "MSGQ01")
                           if r["queue"] == "ASYNC" and r["waiting"]]:
                    await anyio.lowlevel.checkpoint()
                ids = [await s.put("ASYNC", b"%d" % i) for i in range(50)]
            assert got[0].entry_id == ids[0]
            notes = [n async for n in c.notifications(timeout=0.5)]
            # the first put went straight to the waiting reader; the second filled the queue
            assert [(n.structure, n.queue) for n in notes] == [("MSGQ01", "ASYNC")]
            batch = await s.read_batch("ASYNC", 100)
            assert [m.entry_id for m in batch] == ids[1:]
            async with s.unit_of_work() as uow:
                for m in batch:
                    uow.delete(m.entry_id)
            assert await s.read("ASYNC") is None

    anyio.run(main, backend=backend)
