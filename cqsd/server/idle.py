"""Whether Trio has anything to run: so that the poller may wait in its stead.

Design note. Each time the poller yields (a checkpoint at the end of a pass, or
``wait_readable`` on its epoll when no request is left) a trip through Trio's
run loop follows: its epoll re-armed (Trio registers one-shot) and waited on,
the batch of runnable tasks, the poller resumed. With 4 producers and 4
consumers that was ~0.6 trips and a tenth of the daemon's CPU a message, and
one client's lone request pays a whole trip. When no other task waits to run
and no deadline has come, the trip only comes back: the poller may as well
wait on an epoll of its own that holds both its connections' epoll and
Trio's, so that whatever would wake Trio's run loop (a socket another task
waits on, a thread's or a signal's wake-up byte) wakes the poller, which then
yields. Nothing else makes a task runnable while the poller runs: a task
becomes runnable only through I/O, a deadline, or another running task.

What Trio has to run is not only its run queue: the rest of the batch the
poller was resumed in has been taken off it. So an instrument (Trio's public
hooks) notes each task scheduled, and the poller skips Trio only when none of
them is still waiting for its step. A task still waits while Trio holds what
to resume it with (``Task._next_send_fn``, cleared as its step begins): the
instrument need not also hear each step begin, a second interpreted hook call
a task step. That mark, Trio's epoll, its next deadline and its waiters for
idleness (``trio.testing.wait_all_tasks_blocked``, which only Trio's own wait
can serve) are not public: ``attach`` finds them on the Trio pinned in
pyproject.toml (a test checks that it does), and without them the poller
yields as before. Only under Trio's own clock: a test's virtual clock
has no real time to sleep.
"""

from __future__ import annotations

import select
from typing import Any, cast

import trio

# The most the poller waits without Trio: a wake-up missed through a source not
# foreseen here would cost this much, not a hang.
MAX_SLEEP = 1.0


class _Scheduled:
    """The tasks scheduled, some of which may have taken their step since: an
    instrument (Trio calls the hooks an object has, the ones
    ``trio.abc.Instrument`` names), not a subclass of it, so that it compiles
    (docs/native.md)."""

    def __init__(self) -> None:
        self.tasks: set[Any] = set()

    def task_scheduled(self, task: Any) -> None:
        self.tasks.add(task)

    def waiting(self) -> bool:
        """Whether a task scheduled has not taken its step yet; those that have are
        forgotten."""
        if self.tasks:
            self.tasks = {task for task in self.tasks if task._next_send_fn is not None}
        return bool(self.tasks)


class TrioIdle:
    """Trio's run loop, as far as the poller must know it to wait in its stead."""

    def __init__(self, runner: Any, trio_epoll: int, epoll: int) -> None:
        self._runner = runner
        self._scheduled = _Scheduled()
        self._trio_epoll = trio_epoll
        # Trio's epoll and the poller's, in one the poller waits on: not Trio's in the
        # poller's, which Trio's holds once the poller has waited through Trio (ELOOP)
        self._both = select.epoll()
        self._both.register(trio_epoll, select.EPOLLIN)
        self._both.register(epoll, select.EPOLLIN)

    @classmethod
    async def attach(cls, epoll: int) -> TrioIdle | None:
        """The current Trio run loop's, for the poller's ``epoll``; None where Trio's
        epoll or deadlines cannot be found or its clock is not the system's."""
        runner = getattr(getattr(trio._core._run, "GLOBAL_RUN_CONTEXT", None), "runner", None)
        trio_epoll = getattr(getattr(runner, "io_manager", None), "_epoll", None)
        if (trio_epoll is None or not hasattr(runner, "waiting_for_idle")
                or not hasattr(trio.lowlevel.current_task(), "_next_send_fn")
                or not hasattr(getattr(runner, "deadlines", None), "next_deadline")
                or type(getattr(runner, "clock", None)).__name__ != "SystemClock"):
            return None
        idle = cls(runner, trio_epoll.fileno(), epoll)
        trio.lowlevel.add_instrument(cast(trio.abc.Instrument, idle._scheduled))
        try:
            # a task scheduled before the instrument is in the run queue or in the batch
            # under way: two batches later each has taken its step
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()
        except BaseException:
            idle.close()
            raise
        return idle

    def close(self) -> None:
        trio.lowlevel.remove_instrument(cast(trio.abc.Instrument, self._scheduled))
        self._both.close()

    def sleep_allowed(self) -> float:
        """How long the poller may wait without yielding to Trio; 0 or less when a task
        waits to run, a deadline has come, or a test waits for every task to block."""
        runner = self._runner
        if self._scheduled.waiting() or runner.waiting_for_idle:
            return -1.0
        return min(runner.deadlines.next_deadline() - runner.clock.current_time(), MAX_SLEEP)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the poller's epoll or Trio's; whether the
        poller's alone is ready, and the poller may go on without Trio."""
        ready = self._both.poll(timeout, 2)
        return bool(ready) and not self._trio_ready(ready)

    def due(self) -> bool:
        """Whether Trio must run before the poller goes on: a task waits to run, a
        deadline has come, or Trio's epoll is ready."""
        return self.sleep_allowed() <= 0 or self._trio_ready(self._both.poll(0, 2))

    def _trio_ready(self, ready: list[tuple[int, int]]) -> bool:
        for fd, _ in ready:
            if fd == self._trio_epoll:
                return True
        return False
