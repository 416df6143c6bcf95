"""What a structure keeps for its leased locks and delayed puts (structure.py's
design note): two heaps of (deadline, entry id) with lazy deletion, the delayed
messages by id and per queue, the monotonic clock leases run on, and whether
anything was set since the daemon's timer last looked.

One object, not seven attributes of the structure: CPython keeps an object's
attributes in a compact shared-key layout only up to 30 of them, and the
structure's request paths (put, read, delete) slow by a tenth past that.
"""

import time
from collections.abc import Callable

from .entry import Entry
from .qtypes import QueueKey

Key = QueueKey  # the engine's local name for it


class Timed:
    __slots__ = ("armed", "delayed", "due", "leased", "leases", "per_key", "ticks")

    def __init__(self, ticks: Callable[[], float] = time.monotonic) -> None:
        self.ticks = ticks  # the monotonic clock leases run on, in seconds
        self.leases: list[tuple[float, int]] = []  # (monotonic deadline, id), a heap
        self.leased = 0  # locks holding a lease (for compacting the heap)
        self.delayed: dict[int, Entry] = {}  # delayed puts, by id
        self.due: list[tuple[int, int]] = []  # (not_before, id) of each delayed put, a heap
        self.per_key: dict[Key, int] = {}  # delayed puts per queue
        self.armed = False  # a lease or a delay was set: the daemon's timer looks again
