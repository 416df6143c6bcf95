"""A group node's loop that stands still is reported, with where it stood
(cqsd/group/stalls.py): the reason a node was fenced "not renewed" while etcd was well."""

import time

import structlog
import trio
import trio.testing

from cqsd.group import stalls


async def resumed(logs: list) -> list:
    """The ``loop_resumed`` events once the watch has run again: its beat fell due
    during the stall, so it runs (and logs) before every task is blocked once more."""
    await trio.testing.wait_all_tasks_blocked()
    return [e for e in logs if e["event"] == "loop_resumed"]


def a_call_that_blocks_the_loop() -> None:
    time.sleep(1.2)  # the stall under test: a blocking call on the loop


async def test_a_blocked_loop_is_reported_with_its_stack_and_its_length():
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stalls.watch, 0.3)
            await trio.testing.wait_all_tasks_blocked()  # the watch beats
            a_call_that_blocks_the_loop()
            after = await resumed(logs)
            nursery.cancel_scope.cancel()
    stalled = [e for e in logs if e["event"] == "loop_stalled"]
    assert len(stalled) == 1 and "a_call_that_blocks_the_loop" in stalled[0]["stack"]
    assert len(after) == 1 and 0.9 < after[0]["stalled_seconds"] < 3
    assert after[0]["gc_seconds"] < 0.3  # a sleep, not the collector


async def test_a_stall_in_the_garbage_collector_says_so():
    """A full collection holds the GIL: the stall it makes is put down to it."""
    import gc

    junk = [[i] for i in range(1_000_000)]  # tracked objects for a long full collection
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stalls.watch, 0.01)
            await trio.testing.wait_all_tasks_blocked()  # the watch beats
            started = time.monotonic()
            while time.monotonic() - started < 2 * stalls.BEAT:  # past a beat, wherever
                gc.collect()                                   # in one it starts
            took = time.monotonic() - started
            after = await resumed(logs)
            nursery.cancel_scope.cancel()
    del junk
    assert len(after) == 1, (took, logs)
    assert after[0]["gc_seconds"] >= 0.8 * took and 2 in after[0]["gc_generations"]


async def test_a_loop_that_keeps_beating_is_not_reported():
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stalls.watch, 0.5)
            await trio.sleep(6 * stalls.BEAT)
            nursery.cancel_scope.cancel()
    assert [e for e in logs if e["event"].startswith("loop_")] == []
