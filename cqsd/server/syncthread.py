"""One long-lived thread for the flusher's blocking calls (a slow disk's fsync).

Design note. ``trio.to_thread.run_sync`` is general: a capacity limiter taken and
given back around each call (two checkpoints), a placeholder, a context copied,
a thread from the cache woken and named, the outcome carried back through a
wrapper. The flusher needs none of it: it runs one call at a time, never
cancels one, and is the only caller. Its calls go to a thread of its own
through a ``SimpleQueue``, and come back through the Trio token
(``run_sync_soon``), which reschedules the waiting task with the call's outcome.
py-spy on the daemon (4+4 clients of 1 KiB durable messages, a loaded machine,
so that fsyncs went to a thread) found ~10% of the loop's Python in the
``to_thread`` hand-off.

Like ``to_thread.run_sync``, a call that began is waited for even if the task
is cancelled meanwhile: a flush cannot be taken back.
"""

import queue
import threading
from collections.abc import Callable
from typing import Any

import outcome
import trio


class SyncThread:
    def __init__(self, name: str = "cqsd-fsync") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the thread; its result, or what it raised."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True,
                                            args=(trio.lowlevel.current_trio_token(),))
            self._thread.start()
        self._jobs.put((fn, args, trio.lowlevel.current_task()))
        return await trio.lowlevel.wait_task_rescheduled(_uncancellable)

    def _work(self, token: trio.lowlevel.TrioToken) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, task = job
            result = outcome.capture(fn, *args)
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)
            except trio.RunFinishedError:  # the loop ended under a call it never waited for
                return

    def close(self) -> None:
        """End the thread once it is idle (the flusher has stopped)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None


def _uncancellable(raise_cancel) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED
