"""Who holds what: a structure's lock queue and cold queue, and the checks a
request makes of a lock before it touches a message.

Where the seeds put a locked entry on a private list header, the lock queue
(LH 2), we keep it indexed by holder, so that a client's locks are found
without a walk (a warm restart resyncs them, peer recovery releases them);
the locks per queue are counted for queue reports, and a SERIAL queue with a
message in flight is in ``serial_busy`` (one message in flight per name, across
a primary and its overflow structure, which share the set). The cold queue
(LH 1) holds, by id, what the locks of a client's earlier life became at its
cold start. Browse shows both in entry-id order.

A lock may run on a lease (``Timed``): the structure's ``timed`` counts the
leased locks, so a release that ends one says so there.
"""

from collections.abc import Iterator

from .entry import COLD, LOCKED, Entry
from .errors import CQSError, Reason
from .qtypes import QueueKey, QueueType, show
from .timed import Timed

SERIAL = QueueType.TRAN_SERIAL


class Locks:
    __slots__ = ("by_owner", "cold", "per_key", "serial_busy", "timed")

    def __init__(self, timed: Timed) -> None:
        self.by_owner: dict[str, dict[int, Entry]] = {}  # the lock queue: holder -> id -> entry
        self.per_key: dict[QueueKey, int] = {}  # locks per queue
        self.serial_busy: set[QueueKey] = set()  # SERIAL queues with a message in flight
        self.cold: dict[int, Entry] = {}  # the cold queue, by id
        self.timed = timed  # the structure's leases

    def lock(self, entry: Entry, client: str) -> None:
        """Put a message, taken off its queue, on the lock queue as ``client``'s: a delivery."""
        entry.where = LOCKED
        entry.owner = client
        entry.delivery_count += 1
        locks = self.by_owner.get(client)
        if locks is None:
            locks = self.by_owner[client] = {}
        locks[entry.entry_id] = entry
        key = (entry.qtype, entry.name)
        self.per_key[key] = self.per_key.get(key, 0) + 1
        if entry.qtype == SERIAL:
            self.serial_busy.add(key)

    def release(self, entry: Entry) -> bool:
        """Take an entry off the lock queue, its lease with it; it is nowhere until
        placed again. True if it was a SERIAL queue's message in flight: that queue
        may deliver again."""
        owner = entry.owner
        assert owner is not None, f"entry {entry.entry_id} is on the lock queue without an owner"
        locks = self.by_owner[owner]
        del locks[entry.entry_id]
        if not locks:
            del self.by_owner[owner]
        entry.owner = None
        if entry.lease is not None:
            entry.lease = None
            self.timed.leased -= 1
        # the count spelt out, as in Timed.undelay: a helper is a call more on every delete
        key = (entry.qtype, entry.name)
        left = self.per_key[key] - 1
        if left:
            self.per_key[key] = left
        else:
            del self.per_key[key]
        if entry.qtype == SERIAL:
            self.serial_busy.discard(key)
            return True
        return False

    def chill(self, entry: Entry, client: str | None) -> None:
        """Put a message on the cold queue, kept as ``client``'s so that the operator
        can see whose it was."""
        entry.where = COLD
        entry.owner = client
        self.cold[entry.entry_id] = entry

    def thaw(self, entry: Entry) -> None:
        """Take a message off the cold queue; it is nowhere until placed again."""
        del self.cold[entry.entry_id]
        entry.owner = None

    def all_locked(self) -> Iterator[Entry]:
        for locks in self.by_owner.values():
            yield from locks.values()

    def held_by(self, client: str) -> list[Entry]:
        """The messages ``client`` holds, oldest first."""
        return sorted(self.by_owner.get(client, {}).values(), key=lambda e: e.entry_id)

    def count(self) -> int:
        return sum(len(locks) for locks in self.by_owner.values())

    def per_client(self) -> dict[str, int]:
        return {client: len(locks) for client, locks in self.by_owner.items() if locks}


def check_held(client: str, entry: Entry) -> None:
    """Raises LOCK_NOT_HELD unless ``client`` holds the message."""
    if entry.where != LOCKED or entry.owner != client:
        holder = f"locked by {entry.owner}" if entry.where == LOCKED else "not locked"
        raise CQSError(
            Reason.LOCK_NOT_HELD,
            f"entry {entry.entry_id} on {show(entry.key)} is {holder}, not by {client}",
        )


def check_movable(client: str | None, entry: Entry) -> None:
    """Raises LOCK_NOT_HELD if another client holds the message (``client=None``:
    the operator with no locks of its own)."""
    if entry.where == LOCKED and entry.owner != client:
        check_held(client or "the operator", entry)


def check_deletable(client: str | None, entry: Entry, operator: bool = False) -> None:
    """A client deletes what it holds; the operator what no other client holds."""
    if operator or client is None:
        check_movable(client, entry)
    else:
        check_held(client, entry)
