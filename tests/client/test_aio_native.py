"""The async client inside a test that pytest-trio runs natively (trio_mode)."""

from __future__ import annotations

import trio

import cqsclient.aio


async def test_async_client_in_a_trio_nursery(server, address):
    """The async client works in a plain Trio program, shared by tasks of a nursery."""
    results = []
    async with cqsclient.aio.connect(address, client="NATIVE") as c:
        s = await c.structure("MSGQ01")

        async def put(i):
            results.append(await s.put("Q", bytes([i])))

        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(put, i)
        messages = await s.read_batch("Q", 20)
    assert sorted(m.entry_id for m in messages) == sorted(results)
