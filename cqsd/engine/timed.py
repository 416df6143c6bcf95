"""What a structure keeps for its leased locks and delayed puts (structure.py's
design note): two heaps of (deadline, entry id) with lazy deletion, the delayed
messages by id and per queue, the monotonic clock leases run on, and whether
anything was set since the daemon's timer last looked.

One object, not seven attributes of the structure: CPython keeps an object's
attributes in a compact shared-key layout only up to 30 of them, and the
structure's request paths (put, read, delete) slow by a tenth past that.
"""

import heapq
import time
from collections.abc import Callable, Iterable

from .entry import DELAYED, Entry
from .qtypes import QueueKey


class Timed:
    __slots__ = ("armed", "delayed", "due", "leased", "leases", "per_key", "ticks")

    def __init__(self, ticks: Callable[[], float] = time.monotonic) -> None:
        self.ticks = ticks  # the monotonic clock leases run on, in seconds
        self.leases: list[tuple[float, int]] = []  # (monotonic deadline, id), a heap
        self.leased = 0  # locks holding a lease (for compacting the heap)
        self.delayed: dict[int, Entry] = {}  # delayed puts, by id
        self.due: list[tuple[int, int]] = []  # (not_before, id) of each delayed put, a heap
        self.per_key: dict[QueueKey, int] = {}  # delayed puts per queue
        self.armed = False  # a lease or a delay was set: the daemon's timer looks again

    def arm(self, entry: Entry, lease: tuple[int, int, float],
            locked: Callable[[], Iterable[Entry]]) -> None:
        """Give a locked entry ``lease`` (ns, wall-clock deadline, monotonic deadline)
        in place of the one it had. A heap grown mostly stale (renewed or released
        leases) is rebuilt first from ``locked()``, every entry on the lock queue."""
        if entry.lease is None:
            self.leased += 1
        entry.lease = lease
        heap = self.leases
        if len(heap) > 4 * self.leased + 1024:  # mostly stale: renewed or released
            heap[:] = [(e.lease[2], e.entry_id) for e in locked() if e.lease]
            heapq.heapify(heap)
        heapq.heappush(heap, (lease[2], entry.entry_id))
        self.armed = True

    def delay(self, entry: Entry) -> None:
        """Hold a message off its queue until its ``not_before`` (``Structure.ripen``)."""
        assert entry.not_before is not None
        entry.where = DELAYED
        self.delayed[entry.entry_id] = entry
        key = (entry.qtype, entry.name)
        self.per_key[key] = self.per_key.get(key, 0) + 1
        heapq.heappush(self.due, (entry.not_before, entry.entry_id))
        self.armed = True

    def undelay(self, entry: Entry) -> None:
        """Take a delayed message out of waiting; it is nowhere until placed again."""
        del self.delayed[entry.entry_id]
        key = (entry.qtype, entry.name)
        left = self.per_key[key] - 1
        if left:
            self.per_key[key] = left
        else:
            del self.per_key[key]

    def next_due(self) -> int | None:
        """The wall-clock ns at which the next delayed message becomes readable, or None."""
        heap, delayed = self.due, self.delayed
        while heap:
            not_before, entry_id = heap[0]
            entry = delayed.get(entry_id)
            if entry is not None and entry.not_before == not_before:
                return not_before
            heapq.heappop(heap)
        return None
