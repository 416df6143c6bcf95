"""A group node's loop that stands still is reported, with where it stood
(cqsd/group/stalls.py): the reason a node was fenced "not renewed" while etcd was well."""

import time

import structlog
import trio

from cqsd.group import stalls


def a_call_that_blocks_the_loop() -> None:
    time.sleep(0.6)  # the stall under test: a blocking call on the loop


async def test_a_blocked_loop_is_reported_with_its_stack_and_its_length():
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stalls.watch, 0.3)
            await trio.sleep(2 * stalls.BEAT)  # a few beats on time first
            a_call_that_blocks_the_loop()
            await trio.sleep(2 * stalls.BEAT)  # the loop runs again: the beat after it
            nursery.cancel_scope.cancel()
    stalled = [e for e in logs if e["event"] == "loop_stalled"]
    resumed = [e for e in logs if e["event"] == "loop_resumed"]
    assert len(stalled) == 1 and "a_call_that_blocks_the_loop" in stalled[0]["stack"]
    assert len(resumed) == 1 and 0.3 < resumed[0]["stalled_seconds"] < 2


async def test_a_loop_that_keeps_beating_is_not_reported():
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stalls.watch, 0.5)
            await trio.sleep(6 * stalls.BEAT)
            nursery.cancel_scope.cancel()
    assert [e for e in logs if e["event"].startswith("loop_")] == []
