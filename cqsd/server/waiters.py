"""Readers waiting server-side for a message, served first come, first served.

A waiter is served by whichever request makes its queue readable (a put, an
unlock, a move, a delete on a SERIAL queue): that request's handler reads on
the waiter's behalf, synchronously, so no other reader can slip in between the
message arriving and the waiter getting it.

Design note. A waiting read is no task of its own: it is a ``Waiter`` parked
here, answered by whatever ends its wait. Served, its reply goes out once the
request that served it has settled and replied (``answer_served``): the lock
records come first; failed, dropped or stopping, at once; timed out, from one
timer task (``run``) for every waiter, sleeping until the earliest deadline.
A task a wait (spawned, with its own cancel scope and event, woken, ended) cost
about 170,000 instructions a waiting read, a quarter of a message's.
"""

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import trio

from ..engine import CQSError, Entry, QueueKey, Reason, Structure, StructurePair
from ..engine.entry import Passed

if TYPE_CHECKING:
    from .session import Session

# What waiters wait on: the daemon's rooms hold a StructurePair per structure, which
# has a Structure's read API (name, watched, readable, read); a bare Structure serves alike.
Readable = Structure | StructurePair


class Waiter:
    """A read parked until a message comes, its wait runs out or its structure
    goes; ``messages`` and ``failed`` say which, for whoever answers it."""

    __slots__ = ("session", "rid", "client", "n", "lease", "wait", "structure", "key",
                 "messages", "failed", "done")

    def __init__(self, session: "Session | None", rid: int, client: str, n: int,
                 lease: float | None, wait: float) -> None:
        self.session = session  # None for a waiter nobody answers (tests of the queue)
        self.rid = rid
        self.client = client
        self.n = n
        self.lease = lease  # of the locks it is served
        self.wait = wait  # seconds, from when it is parked
        self.structure: Readable | None = None
        self.key: QueueKey | None = None
        self.messages: list[Entry] | None = None
        self.failed = False  # its structure failed: it will never be served
        self.done = False  # out of line: served, failed, dropped or timed out


class ReadWaiters:
    def __init__(self, budget: int, passed: Passed | None = None) -> None:
        self.budget = budget  # payload bytes one reply may carry (read_up_to)
        self.passed = passed  # messages a read passes over (their data set unavailable)
        # answers a waiter out of line (Dispatcher.answer); set by the daemon
        self.answer: Callable[[Waiter], None] = lambda waiter: None
        self.served: list[Waiter] = []  # answered once the request serving them settles
        self._queues: dict[tuple[str, QueueKey], deque[Waiter]] = {}
        self._deadlines: list[tuple[float, int, Waiter]] = []  # a heap; done ones linger
        self._waiting = 0  # waiters not done, of those in _deadlines
        self._order = itertools.count()
        self._timer: trio.CancelScope | None = None

    def park(self, structure: Readable, key: QueueKey, waiter: Waiter) -> None:
        """Put ``waiter`` in line on ``key``, its wait running out ``waiter.wait``
        seconds from now."""
        waiter.structure, waiter.key = structure, key
        self._queues.setdefault((structure.name, key), deque()).append(waiter)
        structure.watched.add(key)
        if waiter.session is not None:
            waiter.session.park(waiter)
        deadline = trio.current_time() + waiter.wait
        heapq.heappush(self._deadlines, (deadline, next(self._order), waiter))
        self._waiting += 1
        if self._timer is not None and deadline < self._timer.deadline:
            self._timer.deadline = deadline

    def count(self, structure: str, key: QueueKey) -> int:
        return len(self._queues.get((structure, key), ()))

    def serve(self, structure: Readable) -> None:
        """Hand newly readable messages to the oldest waiters on their queues; their
        replies wait in ``served`` for the settle that logs the locks."""
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
                self._end(waiter)
                self.served.append(waiter)
            if not queue:
                self._forget(structure, key)

    def answer_served(self) -> None:
        """Reply to the waiters served since the last call (dispatch.py's settle)."""
        served, self.served = self.served, []
        for waiter in served:
            self.answer(waiter)

    def fail(self, structure: Readable) -> None:
        """Answer every waiter on a structure that has failed, unserved."""
        for name, key in [k for k in self._queues if k[0] == structure.name]:
            for waiter in self._queues.pop((name, key)):
                waiter.failed = True
                self._end(waiter)
                self.answer(waiter)
            structure.watched.discard(key)

    def drop_client(self, client: str) -> None:
        """Take ``client``'s waiters out of line unserved (their connection was taken
        over: a message locked for them now would reach nobody), and answer them."""
        for waiter in [w for queue in self._queues.values() for w in queue
                       if w.client == client]:
            self._remove(waiter)
            self.answer(waiter)

    def drop_session(self, session: "Session", answer: bool) -> None:
        """Take the waiters of a connection that is ending out of line; ``answer``
        them too (the daemon is stopping: they hear so before the connection ends)."""
        # a session keeps its parked reads untyped (it may not import this module)
        for waiter in cast("list[Waiter]", list(session.waiting)):
            self._remove(waiter)
            if answer:
                self.answer(waiter)

    async def run(self) -> None:
        """Answer each waiter whose wait runs out, sleeping until the next does."""
        while True:
            deadlines = self._deadlines
            while deadlines and deadlines[0][2].done:  # served: nothing to time out
                heapq.heappop(deadlines)
            with trio.CancelScope(deadline=deadlines[0][0] if deadlines else math.inf) as timer:
                self._timer = timer
                await trio.sleep_forever()
            self._timer = None
            now = trio.current_time()
            while self._deadlines and self._deadlines[0][0] <= now:
                waiter = heapq.heappop(self._deadlines)[2]
                if not waiter.done:
                    self._remove(waiter)
                    self.answer(waiter)

    def _remove(self, waiter: Waiter) -> None:
        if waiter.done:
            return
        assert waiter.structure is not None and waiter.key is not None  # parked
        queue = self._queues.get((waiter.structure.name, waiter.key))
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                self._forget(waiter.structure, waiter.key)
        self._end(waiter)

    def _end(self, waiter: Waiter) -> None:
        waiter.done = True
        self._waiting -= 1
        if waiter.session is not None:
            waiter.session.unpark(waiter)
        if len(self._deadlines) > 64 and len(self._deadlines) > 4 * self._waiting:
            # served waiters linger in the heap until they reach its top: past a
            # bound, keep only those still waiting (amortised, a few per waiter)
            self._deadlines = [d for d in self._deadlines if not d[2].done]
            heapq.heapify(self._deadlines)

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
            # key spelt out, not *key: compiled, that is a direct call
            entry = structure.read(client, key[0], key[1], lease, passed)
            got.append(entry)
            size += entry.length
    except CQSError as err:
        if err.reason != Reason.NO_MESSAGE:
            raise
    return got
