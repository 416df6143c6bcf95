"""The flusher's own thread runs its blocking calls one at a time, hands back their
results and errors, and a call that began is waited for even if cancelled."""

import threading

import pytest
import trio
import trio.testing

from cqsd.server.syncthread import SyncThread


async def test_a_call_runs_in_the_thread_and_returns_its_result():
    """The call runs on another thread, the same one each time, and its result comes back."""
    t = SyncThread()
    try:
        first = await t.run(threading.get_ident)
        assert first != threading.get_ident()
        assert await t.run(threading.get_ident) == first
        assert await t.run(divmod, 7, 2) == (3, 1)
    finally:
        t.close()


async def test_what_a_call_raises_is_raised_to_the_caller():
    """An exception in the thread is raised in the task that waited for it."""
    t = SyncThread()
    try:
        with pytest.raises(ZeroDivisionError):
            await t.run(divmod, 1, 0)
        assert await t.run(int, "5") == 5  # and the thread goes on
    finally:
        t.close()


async def test_a_cancelled_caller_still_waits_for_its_call():
    """Cancelled while its call runs, the task waits until the call is done (a flush
    cannot be taken back), then sees the cancellation."""
    t = SyncThread()
    entered, release, done = threading.Event(), threading.Event(), []

    def blocking():
        entered.set()
        release.wait(10)
        done.append(True)

    async def caller(scope: trio.CancelScope) -> None:
        with scope:
            await t.run(blocking)
        ended.set()

    scope, ended = trio.CancelScope(), trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller, scope)
            await trio.to_thread.run_sync(entered.wait, 10)
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()  # cancelled, if it could be
            assert not ended.is_set() and not done
            release.set()
            with trio.fail_after(10):
                await ended.wait()
        assert done == [True]
    finally:
        release.set()
        t.close()
