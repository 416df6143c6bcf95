"""The one timer of leases and delayed puts: a task that sleeps until the
earliest deadline any structure holds, then expires and ripens what is due.

Design note. The engine keeps a heap per structure for each (``expire``,
``ripen``); the daemon keeps no timer per message, only this task. A lease
runs on the monotonic clock (``time.monotonic``, the engine's ``ticks``), a
delay on the wall clock (``time.time_ns``, as put times): the sleep is the
shorter of the two waits, and at most ``RECHECK`` seconds, so a wall clock set
forward or back is noticed. A request that sets an earlier deadline (a leased
read, a renew, a delayed put) pokes the task (``Dispatcher.settle``, dispatch.py), which then
works out its sleep again. Expiries are logged (the engine's R effects, in the
record ``settle`` writes) and events say how many went; waiting readers and
interested clients hear of ripened messages through ``settle`` too.
"""

import math
import time
from collections.abc import Callable, Collection

import structlog
import trio

from ..engine import QueueType
from .registry import Registry
from .runtime import Runtime

log = structlog.get_logger()
RECHECK = 60.0  # seconds at most between two looks at the wall clock


class Timers:
    def __init__(self, registry: Registry, runtime: Runtime,
                 spared: Callable[[], Collection[str]]) -> None:
        self.registry = registry
        self.runtime = runtime
        self.spared = spared  # owners whose expiries are no failure of theirs (Clients)
        self._poked = trio.Event()

    def poke(self) -> None:
        """A deadline may now be earlier than the one being slept toward."""
        self._poked.set()

    async def run(self) -> None:
        while True:
            with trio.move_on_after(self.wait()):
                await self._poked.wait()
            self._poked = trio.Event()
            self.fire()

    def wait(self) -> float:
        """Seconds until the earliest lease or delay of any structure (RECHECK at most)."""
        mono, wall = time.monotonic(), time.time_ns()
        soonest = RECHECK
        for pair in self.registry.pairs.values():
            expiry, due = pair.next_expiry(), pair.next_due()
            if expiry is not None:
                soonest = min(soonest, expiry - mono)
            if due is not None:
                soonest = min(soonest, (due - wall) / 1e9)
        return max(0.0, soonest) if math.isfinite(soonest) else RECHECK

    def fire(self) -> None:
        """Expire every lease and ripen every delayed put that is due, then settle."""
        mono, wall, spared = time.monotonic(), time.time_ns(), self.spared()
        for pair in self.registry.pairs.values():
            expired, ripe = pair.expire(mono, spared), pair.ripen(wall)
            if expired:
                log.info("leases_expired", structure=pair.name, messages=len(expired),
                         suspended=sum(1 for e in expired if e.qtype == QueueType.TRAN_SUSPEND),
                         entries=[e.entry_id for e in expired[:10]])
            if ripe:
                log.debug("delayed_ripened", structure=pair.name, messages=len(ripe))
        self.runtime.settle()
