"""Overflow processing between requests (seed 004): a structure past its
threshold grows, or has its biggest queues selected, and their messages move
to the overflow structure in batches, each batch one log record, with the
requests that arrived meanwhile served in between. The engine decides what
relieves a structure (``engine.Relief``: growth, or the queues selected); this
room carries it out, one task of moves per pair."""

import time

import structlog
import trio
import trio.lowlevel

from ..engine import CQSError, StructurePair
from .registry import Registry
from .runtime import Runtime

log = structlog.get_logger()


class OverflowMoves:
    def __init__(self, registry: Registry, runtime: Runtime) -> None:
        self.registry = registry
        self.runtime = runtime
        self._movers: set[str] = set()  # pairs whose overflow moves are under way

    def relieve(self, s: StructurePair) -> None:
        """Grow ``s``, or select queues and start moving their messages."""
        started = time.perf_counter()
        try:
            relief = s.relieve()
        except CQSError as err:  # settle must still log what the request did
            log.error("overflow_relief_failed", structure=s.name, error=err.message)
            return
        if relief is None:
            return
        if relief.selected or relief.dropped:
            log.warning("overflow_selected", structure=s.name, queues=relief.selected,
                        dropped_by_exit=relief.dropped, exit_error=relief.exit_error,
                        pause_ms=round(1000 * (time.perf_counter() - started), 3))
        if s.moving and s.name not in self._movers:
            self._movers.add(s.name)
            self.runtime.spawn(f"overflow move of {s.name}", self._move, s)

    async def _move(self, s: StructurePair) -> None:
        moved = 0
        try:
            while s.moving and self.registry.pairs.get(s.name) is s:
                moved += s.move_some()
                self.runtime.settle()
                await trio.lowlevel.checkpoint()  # the requests waiting meanwhile go first
        finally:
            self._movers.discard(s.name)
        assert s.overflow is not None  # only a pair with one has moves (StructurePair.relieve)
        log.info("overflow_moved", structure=s.name, overflow=s.overflow.name, messages=moved)
