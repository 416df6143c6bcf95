"""The runtime (runtime.py) is what rooms ask of the running daemon: it is bound
once, spawns supervised tasks, settles through the dispatcher, and stops the
daemon on a fatal error by failing the journal."""

import pytest
import structlog
import trio
import trio.testing

from cqsd.server.runtime import InternalError, Runtime


async def test_a_runtime_is_bound_once(journal, nursery):
    """A second bind is refused: no room may find its collaborators replaced."""
    runtime = Runtime()
    assert not runtime.running
    runtime.bind(nursery, lambda: 0, journal)
    assert runtime.running
    with pytest.raises(RuntimeError):
        runtime.bind(nursery, lambda: 0, journal)


async def test_settle_goes_to_the_bound_settle_step(journal, nursery):
    """settle returns what the bound settle step returns (the LSN a reply waits for)."""
    runtime, calls = Runtime(), []
    runtime.bind(nursery, lambda: calls.append(1) or 42, journal)
    assert runtime.settle() == 42 and calls == [1]


def test_nothing_is_spawned_or_settled_before_the_daemon_runs():
    """Until bound, spawning or settling is a bug, not a silent no-op."""
    runtime = Runtime()
    with pytest.raises(AssertionError):
        runtime.settle()
    with pytest.raises(AssertionError):
        runtime.spawn("t", trio.sleep, 0)


async def test_a_spawned_task_that_dies_fails_the_journal(journal, nursery):
    """A supervised task that raises is named in a task_died event, and the journal
    fails with an InternalError: nothing more is acknowledged."""
    runtime = Runtime()
    runtime.bind(nursery, lambda: 0, journal)

    async def dies():
        raise ValueError("planted")

    with structlog.testing.capture_logs() as logs:
        runtime.spawn("doomed", dies)
        await trio.testing.wait_all_tasks_blocked()
    assert isinstance(journal.failed, InternalError)
    assert "task_died: ValueError: planted" in str(journal.failed)
    [event] = [e for e in logs if e["event"] == "task_died"]
    assert event["task"] == "doomed"
    assert journal.append({"s": "S", "e": []}) == 0


async def test_a_spawned_task_runs_in_the_daemons_nursery(journal, nursery):
    """A task spawned by a room runs to its end with its arguments."""
    runtime, done = Runtime(), trio.Event()
    runtime.bind(nursery, lambda: 0, journal)

    async def task(event):
        event.set()

    runtime.spawn("task", task, done)
    with trio.fail_after(5):
        await done.wait()
    assert journal.failed is None
