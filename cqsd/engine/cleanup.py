"""The clean-up queue (LH 4): deleted offloaded messages whose pages must wait.

A message offloaded to a shared message data set (docs/smds.md) that is
deleted stays charged to the structure, and its pages stay in use, until the
daemon says its delete is durable: until then a crash could bring it back.
It waits in two steps: ``deleted`` since the daemon last took them
(``stamp``, with the log sequence number of the record holding their
deletes), then on the queue in that order until the log is durable past it
(``durable``). A non-recoverable message's delete is never logged, so it
goes at the stamp. What goes, the structure discards (its space given back).
"""

from collections import deque
from collections.abc import Iterator

from .entry import DELETED, Entry


class CleanUp:
    __slots__ = ("deleted", "waiting")

    def __init__(self) -> None:
        self.deleted: list[Entry] = []  # offloaded, deleted since the last stamp
        self.waiting: deque[tuple[int, Entry]] = deque()  # (LSN of the delete, entry)

    def add(self, entry: Entry) -> None:
        """An offloaded message was deleted: it waits here, still charged."""
        entry.where = DELETED
        self.deleted.append(entry)

    def stamp(self, lsn: int) -> tuple[list[Entry], list[Entry]]:
        """(every message deleted since the last stamp, those of them that go now):
        the recoverable ones wait for ``lsn``, the record holding their deletes, to
        be durable; the rest, or all with no ``lsn``, go at once."""
        deleted, self.deleted = self.deleted, []
        gone = []
        for entry in deleted:
            if entry.recoverable and lsn:
                self.waiting.append((lsn, entry))
            else:
                gone.append(entry)
        return deleted, gone

    def durable(self, lsn: int) -> list[Entry]:
        """Take every message whose delete is durable with the log durable to ``lsn``."""
        waiting, gone = self.waiting, []
        while waiting and waiting[0][0] <= lsn:
            gone.append(waiting.popleft()[1])
        return gone

    def __iter__(self) -> Iterator[Entry]:
        """Every message here, in the order it was deleted."""
        yield from self.deleted
        for _, entry in self.waiting:
            yield entry
