"""Readers waiting server-side for a message, served first come, first served.

A waiter is served by whichever request makes its queue readable (a put, an
unlock, a move, a delete on a SERIAL queue): that request's handler reads on
the waiter's behalf, synchronously, so no other reader can slip in between the
message arriving and the waiter getting it.
"""

from collections import deque

import trio

from ..engine import CQSError, Entry, QueueKey, Reason, Structure, StructurePair
from ..engine.entry import Passed

# What waiters wait on: the daemon's rooms hold a StructurePair per structure, which
# has a Structure's read API (name, watched, readable, read); a bare Structure serves alike.
Readable = Structure | StructurePair


class Waiter:
    __slots__ = ("client", "n", "lease", "event", "messages", "failed")

    def __init__(self, client: str, n: int, lease: float | None = None) -> None:
        self.client = client
        self.n = n
        self.lease = lease  # of the locks it is served
        self.event = trio.Event()
        self.messages: list[Entry] | None = None
        self.failed = False  # its structure failed: it will never be served


class ReadWaiters:
    def __init__(self, budget: int, passed: Passed | None = None) -> None:
        self.budget = budget  # payload bytes one reply may carry (read_up_to)
        self.passed = passed  # messages a read passes over (their data set unavailable)
        self._queues: dict[tuple[str, QueueKey], deque[Waiter]] = {}

    def add(self, structure: Readable, key: QueueKey, waiter: Waiter) -> None:
        self._queues.setdefault((structure.name, key), deque()).append(waiter)
        structure.watched.add(key)

    def remove(self, structure: Readable, key: QueueKey, waiter: Waiter) -> None:
        queue = self._queues.get((structure.name, key))
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                self._forget(structure, key)

    def count(self, structure: str, key: QueueKey) -> int:
        return len(self._queues.get((structure, key), ()))

    def serve(self, structure: Readable) -> None:
        """Hand newly readable messages to the oldest waiters on their queues."""
        while structure.readable:
            key = structure.readable.pop()
            queue = self._queues.get((structure.name, key))
            while queue:
                waiter = queue[0]
                got = read_up_to(structure, waiter.client, key, waiter.n, self.budget,
                                 waiter.lease, self.passed)
                if not got:
                    break
                queue.popleft()
                waiter.messages = got
                waiter.event.set()
            if not queue:
                self._forget(structure, key)

    def fail(self, structure: Readable) -> None:
        """Wake every waiter on a structure that has failed, unserved."""
        for name, key in [k for k in self._queues if k[0] == structure.name]:
            for waiter in self._queues.pop((name, key)):
                waiter.failed = True
                waiter.event.set()
            structure.watched.discard(key)

    def drop_client(self, client: str) -> None:
        """Take ``client``'s waiters out of line unserved (their connection was taken
        over: a message locked for them now would reach nobody); their tasks end them."""
        for queue in self._queues.values():
            for waiter in [w for w in queue if w.client == client]:
                queue.remove(waiter)
                waiter.event.set()

    def _forget(self, structure: Readable, key: QueueKey) -> None:
        self._queues.pop((structure.name, key), None)
        structure.watched.discard(key)


def read_up_to(structure: Readable, client: str, key: QueueKey, n: int, budget: int,
               lease: float | None = None, passed: Passed | None = None) -> list[Entry]:
    """Lock up to ``n`` messages for ``client`` (for ``lease`` seconds, if given),
    stopping once their payloads pass ``budget`` bytes, so that a reply holds at
    most one message more than that; those ``passed`` passes over stay where they
    are."""
    got: list[Entry] = []
    size = 0
    try:  # an empty queue is seen without the exception (a served waiter's next, say)
        while len(got) < n and size < budget and structure.has_ready(key):
            entry = structure.read(client, *key, lease, passed)
            got.append(entry)
            size += entry.length
    except CQSError as err:
        if err.reason != Reason.NO_MESSAGE:
            raise
    return got
