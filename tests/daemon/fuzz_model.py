"""What a live daemon must be storing, for the fuzzer in test_fuzz.py.

The model holds every message the daemon acknowledged, with its place spelled
out (queue key, lock owner, cold), and nothing else: capacity, overflow routing
and the split of a pair into primary and overflow structure are the daemon's to
decide, so the model allows a put to be refused for space but never lets a
message appear, vanish or move unless a request it saw said so. It is written
from docs/protocol.md and docs/sdk.md; where those are silent it follows the
engine and says so.
"""

import math
import zlib

from cqsd.engine.qtypes import list_header  # the stable name hash (docs/protocol.md)

# docs/protocol.md (a contract): queue types by number; the staging types are internal.
QTYPES = {"TRAN": 1, "TRAN_STAGING": 2, "TRAN_SUSPEND": 3, "TRAN_SERIAL": 4, "LTERM": 5,
          "LTERM_STAGING": 6, "APPC": 7, "REMOTE": 8, "OTMA": 9, "USER1": 10, "USER2": 11}
NAMES = {number: name for name, number in QTYPES.items()}
STAGING = {"TRAN_STAGING", "LTERM_STAGING"}
COLD_LH, LOCK_LH = 1, 2
ELEMENT, ENTRY_CONTROLS = 512, 64  # docs/protocol.md: ⌈(payload + 64)/512⌉ data elements

Key = tuple[str, str]  # (queue type name, queue name)


def qtype_name(value: object) -> str | None:
    """The type a client-usable spelling names, or None if the daemon must refuse it."""
    if type(value) is int:
        value = NAMES.get(value)
    if type(value) is not str or value not in QTYPES or value in STAGING:
        return None
    return value


def valid_queue(name: object) -> bool:
    """docs/protocol.md: names up to 15 bytes, ASCII (printable: they are shown to operators)."""
    return type(name) is str and 0 < len(name) <= 15 and name.isascii() and name.isprintable()


def cost(size: int, entry_max: int) -> tuple[int, int]:
    """(data elements, list entries) of a message: one entry per entry_max segment."""
    pieces = [size] if size <= entry_max else [
        min(entry_max, size - o) for o in range(0, size, entry_max)]
    return sum(math.ceil((p + ENTRY_CONTROLS) / ELEMENT) for p in pieces), len(pieces)


def digest(data: bytes) -> tuple[int, int]:
    return len(data), zlib.crc32(data)


def within(msgs: list["Msg"], budget: int) -> list["Msg"]:
    """What one read or browse reply carries of ``msgs``: it stops once their
    payloads pass ``budget`` (max_message), so it holds at most one message more
    (docs/robustness.md)."""
    size = 0
    for i, m in enumerate(msgs):
        if size >= budget:
            return msgs[:i]
        size += m.digest[0]
    return msgs


class Msg:
    __slots__ = ("eid", "structure", "key", "where", "owner", "count", "home", "recoverable",
                 "digest")

    def __init__(self, eid, structure, key, recoverable, digest_):
        self.eid, self.structure, self.key = eid, structure, key
        self.where, self.owner, self.count, self.home = "ready", None, 0, None
        self.recoverable, self.digest = recoverable, digest_

    def view(self) -> tuple:
        """What a browse must show of it."""
        return (self.key, self.where, self.owner, self.count, self.home, self.recoverable,
                self.digest)

    def position(self) -> tuple:
        """Browse order: the cold queue, then the lock queue, by id; then ready
        messages by (list header, queue name, id)."""
        if self.where != "ready":
            return (COLD_LH if self.where == "cold" else LOCK_LH, "", self.eid)
        return (list_header(QTYPES[self.key[0]], self.key[1]), self.key[1], self.eid)


def seen_view(m: dict) -> tuple:
    """The view of a message as a browse reply shows it."""
    home = tuple(m["home"]) if m.get("home") else None
    return ((m["qtype"], m["queue"]), m["where"], m["owner"], m["delivery_count"], home,
            m["recoverable"], digest(m["data"]))


class Model:
    def __init__(self, entry_max: dict[str, int], max_deliveries: int, grace: float,
                 offloading: frozenset[str] = frozenset()) -> None:
        self.entry_max = entry_max  # structure (what clients address) -> entry_max
        self.offloading = offloading  # structures whose payloads over entry_max are offloaded
        self.max_deliveries = max_deliveries
        self.grace = grace
        self.msgs: dict[int, Msg] = {}
        self.gone: set[int] = set()  # ids deleted: they must never come back
        self.last_id = dict.fromkeys(entry_max, 0)
        self.registered: set[str] = set()

    # -- looking ---------------------------------------------------------------

    def find(self, structure: str, eid: object) -> Msg | None:
        m = self.msgs.get(eid) if type(eid) is int else None
        return m if m is not None and m.structure == structure else None

    def ready(self, structure: str, key: Key) -> list[Msg]:
        return sorted((m for m in self.msgs.values() if m.structure == structure
                       and m.key == key and m.where == "ready"), key=lambda m: m.eid)

    def readable(self, structure: str, key: Key, n: int, budget: int) -> list[Msg]:
        """What a read of n must lock: the oldest ready messages, as many as one reply
        carries; one at a time on a SERIAL queue, and none while it has one in flight."""
        if key[0] == "TRAN_SERIAL":
            busy = any(m.structure == structure and m.key == key and m.where == "locked"
                       for m in self.msgs.values())
            n = 0 if busy else 1
        return within(self.ready(structure, key)[:n], budget)

    def locks_of(self, client: str) -> list[Msg]:
        return sorted((m for m in self.msgs.values() if m.where == "locked" and m.owner == client),
                      key=lambda m: m.eid)

    def listing(self, structure: str) -> list[Msg]:
        return sorted((m for m in self.msgs.values() if m.structure == structure),
                      key=Msg.position)

    def usage(self, structure: str) -> tuple[int, int, int]:
        """(data elements, list entries, messages) the structure must account for."""
        mine = [m for m in self.msgs.values() if m.structure == structure]
        entry_max = self.entry_max[structure]
        offloads = structure in self.offloading
        costs = [(1, 1) if offloads and m.digest[0] > entry_max else cost(m.digest[0], entry_max)
                 for m in mine]
        return sum(c[0] for c in costs), sum(c[1] for c in costs), len(mine)

    def ready_keys(self) -> set[tuple[str, Key]]:
        return {(m.structure, m.key) for m in self.msgs.values() if m.where == "ready"}

    # -- what acknowledged requests did ----------------------------------------

    def added(self, structure: str, eid: int, key: Key, data_digest, recoverable: bool) -> Msg:
        """A put the daemon acknowledged. Entry ids only grow (docs/protocol.md)."""
        assert type(eid) is int, f"entry id {eid!r} is not an int"
        assert eid > self.last_id[structure], (
            f"entry id {eid} of {structure} is not above {self.last_id[structure]}, "
            "the highest handed out before")
        self.last_id[structure] = eid
        m = self.msgs[eid] = Msg(eid, structure, key, recoverable, data_digest)
        return m

    def lock(self, m: Msg, client: str) -> None:
        m.where, m.owner, m.count = "locked", client, m.count + 1

    def delete(self, m: Msg) -> None:
        del self.msgs[m.eid]
        self.gone.add(m.eid)

    def move(self, m: Msg, key: Key) -> None:
        m.key, m.where, m.owner, m.home = key, "ready", None, None

    def unlock(self, m: Msg, failed: bool, target: Key | None) -> None:
        """Back to its place or to target; a failed delivery past max_deliveries goes
        to the suspend queue (home kept), under the same name (the engine's choice)."""
        m.where, m.owner = "ready", None
        if failed and m.count >= self.max_deliveries:
            m.home = m.home or m.key
            m.key = ("TRAN_SUSPEND", m.key[1])
        elif target is not None:
            m.key, m.home = target, None

    def unlock_target(self, m: Msg, qtype: object, queue: object) -> Key | None:
        if qtype is None and queue is None:
            return None
        return (qtype_name(qtype) if qtype is not None else m.key[0], queue or m.key[1])

    def release(self, client: str, failed: bool) -> None:
        """Deregistration (failed=False) or peer recovery (failed=True)."""
        for m in self.locks_of(client):
            self.unlock(m, failed, None)

    def cold_start(self, client: str) -> None:
        for m in self.locks_of(client):
            m.where = "cold"  # the owner stays, for the operator to see

    def requeue(self, m: Msg) -> None:
        if m.where == "ready":
            m.key, m.home = m.home, None
        m.where, m.owner, m.count = "ready", None, 0

    def dropped(self, client: str) -> None:
        """A registered client's connection ended without deregistering."""
        self.registered.discard(client)
        if self.grace == 0:
            self.release(client, failed=True)

    def restarted(self, clean: bool) -> None:
        """The daemon stopped (SIGTERM) or was killed, and started again: a clean stop
        keeps everything, a crash only recoverable messages; either way the locks
        wait out the grace for their holders to resync, then go back without a
        failed delivery (the daemon stopping was no failure of their holders)."""
        self.registered.clear()
        if not clean:
            for m in [m for m in self.msgs.values() if not m.recoverable]:
                self.delete(m)
        owners = {m.owner for m in self.msgs.values() if m.where == "locked"}
        if self.grace == 0:
            for owner in owners:
                self.release(owner, failed=False)

    def recovered(self, structure: str, purge: bool) -> None:
        """RECOVER CFSTRUCT: from the checkpoint and the log (recoverable messages only;
        locks of clients not registered go back), or emptied (purge)."""
        for m in [m for m in self.msgs.values() if m.structure == structure]:
            if purge or not m.recoverable:
                self.delete(m)
        for m in [m for m in self.msgs.values() if m.structure == structure
                  and m.where == "locked" and m.owner not in self.registered]:
            self.unlock(m, True, None)
