"""What a room may ask of the running daemon: settle what it changed, start a
supervised task, and stop on an error that leaves memory in doubt.

Design note. Rooms that act outside a request (peer recovery after a grace
timer, an overflow move, the timer of leases, a checkpoint, an operator's
recovery) need the daemon's nursery and its settle step, which exist only once
the daemon runs. They are all given this one object when they are made, and
the daemon binds it once (``bind``), when its nursery is open and its
dispatcher made: no room holds a callback that may still be None, and none is
set after construction. Until then nothing may be spawned or settled.
"""

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio

from .journal import Journal

log = structlog.get_logger()


class InternalError(Exception):
    """What ``Runtime.fatal`` hands the journal: the named event and its cause."""


class Runtime:
    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._settle: Callable[[], int] | None = None
        self._journal: Journal | None = None

    def bind(self, nursery: trio.Nursery, settle: Callable[[], int], journal: Journal) -> None:
        """Once, when the daemon runs: its nursery, its settle step and its log."""
        if self._nursery is not None:
            raise RuntimeError("the runtime is bound once")
        self._nursery, self._settle, self._journal = nursery, settle, journal

    @property
    def running(self) -> bool:
        """Whether ``bind`` has run: tasks may be spawned."""
        return self._nursery is not None

    def settle(self) -> int:
        """Turn what was just done into log records, notifications and waiter
        hand-offs (dispatch.py); the LSN a reply must wait for."""
        assert self._settle is not None, "settle before the daemon runs"
        return self._settle()

    def spawn(self, name: str, task: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``task`` in the daemon's nursery, supervised: if it raises, the
        daemon says which task and why, and stops rather than half-runs."""
        assert self._nursery is not None, "spawn before the daemon runs"
        self._nursery.start_soon(self._supervise, name, task, *args, name=name)

    async def _supervise(self, name: str, task: Callable[..., Awaitable[Any]],
                         *args: Any) -> None:
        try:
            await task(*args)
        except Exception as err:
            self.fatal("task_died", err, task=name)

    def fatal(self, event: str, err: BaseException, **fields: Any) -> None:
        """Stop without acknowledging anything more, as after a log write failure:
        memory may no longer match the log, or the daemon lost a task it needs, so
        the restart recovers from the log (docs/robustness.md)."""
        log.critical(event, error=f"{type(err).__name__}: {err}", **fields, exc_info=err,
                     action="no more acknowledgements; stopping for restart and recovery")
        assert self._journal is not None
        self._journal.fail(InternalError(f"{event}: {type(err).__name__}: {err}"), event=None)
