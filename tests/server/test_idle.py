"""While Trio has nothing to run the poller waits in its stead (cqsd/server/idle.py):
requests that come one by one cost no trip through Trio's run loop, and nothing
Trio would have run waits for the poller: a deadline, a thread's result, a task
another request woke, a test waiting for every task to block.

The real Poller runs in the test's trio run on a real socket pair; requests come
from a thread, as a client's would, one at a time.
"""

import queue
import threading
import time

import trio
import trio.testing

from cqsd.server.idle import MAX_SLEEP, TrioIdle
from cqsd.server.poller import Poller

from .test_poller import Handler, frame

REQUESTS = 200
PROMPT = MAX_SLEEP / 2  # what a missed wake-up would take longer than


class IoWaits(trio.abc.Instrument):
    """Counts the times Trio's run loop waited on its epoll."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


async def test_the_pinned_trio_lets_the_poller_wait_in_its_stead():
    """On the Trio in pyproject.toml the poller finds Trio's epoll, deadlines and idle
    waiters: an upgrade that moved them fails here rather than silently slowing."""
    poller = Poller(Handler(), 1024)
    try:
        idle = await TrioIdle.attach(poller._epoll.fileno())
        assert idle is not None
        assert idle.sleep_allowed() > 0  # nothing else to run, no deadline
        idle.close()
    finally:
        poller.close()


async def test_requests_one_by_one_cost_no_trip_through_trio(connected, journal):
    """A client sending its requests one at a time, each after the last was handled,
    is served by the poller alone: Trio's run loop waits a handful of times, not once
    a request."""
    handler = Handler()
    handled: queue.SimpleQueue = queue.SimpleQueue()
    handler.on_frame = lambda session, f: handled.put(f["n"])
    poller = Poller(handler, 1024 * 1024)
    session, client = connected(journal)
    client.setblocking(True)

    def send():
        for n in range(REQUESTS):
            client.sendall(frame(n))
            assert handled.get(timeout=10) == n

    waits = IoWaits()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.run)
        nursery.start_soon(poller.read, session)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(waits)
        await trio.to_thread.run_sync(send)
        trio.lowlevel.remove_instrument(waits)
        nursery.cancel_scope.cancel()
    poller.close()
    assert handler.seqs() == list(range(REQUESTS))
    assert waits.count < REQUESTS // 10


async def test_nothing_trio_would_run_waits_for_the_idle_poller(connected, journal):
    """With the poller waiting on its own epoll: a sleep ends on time, a thread's
    result comes back at once, a task woken by a request runs at once, and
    ``wait_all_tasks_blocked`` returns."""
    handler = Handler()
    woken = trio.Event()
    handler.on_frame = lambda session, f: woken.set()
    poller = Poller(handler, 1024 * 1024)
    session, client = connected(journal)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.run)
        nursery.start_soon(poller.read, session)
        await trio.testing.wait_all_tasks_blocked()
        started = time.monotonic()
        await trio.sleep(0.05)
        assert time.monotonic() - started < PROMPT
        started = time.monotonic()
        await trio.to_thread.run_sync(time.sleep, 0.01)
        assert time.monotonic() - started < PROMPT
        started = time.monotonic()
        threading.Timer(0.01, client.sendall, [frame(1)]).start()
        await woken.wait()
        assert time.monotonic() - started < PROMPT
        with trio.fail_after(PROMPT):
            await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    poller.close()
