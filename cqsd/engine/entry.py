"""List entries: messages, their staging segments, and where each one lives.

A message is one ``Entry`` on its ready queue (the first segment), plus, when it
is longer than ``entry_max``, segment entries on the type's staging queue. The
head keeps the whole payload so a read needs no reassembly; the segments hold
zero-copy slices of it and occupy their own list entries and data elements, so
capacity is counted as a coupling facility would count it.

An offloaded message (docs/smds.md) keeps no payload here: its ``map`` says where
in the data set of structure ``store`` it lies, and it costs the elements of
its encoded map, however long the payload.
"""

from collections.abc import Callable

from ..smds.datamap import DataMap
from .byid import ById

ELEMENT = 512  # bytes in a CF data element (seed 004, "List Structure Components")
ENTRY_CONTROLS = 64  # bytes of entry controls charged with every list entry (docs/architecture.md)

# Where an entry is. Staged segments are never reachable by entry id.
READY, LOCKED, COLD, STAGED = "ready", "locked", "cold", "staged"
DELETED = "deleted"  # an offloaded message on the clean-up queue (LH 4) until its delete is durable
DELAYED = "delayed"  # put with a not_before still to come: invisible to reads until then


def elements(nbytes: int) -> int:
    """Data elements used by a list entry carrying ``nbytes`` of payload."""
    return (nbytes + ENTRY_CONTROLS + ELEMENT - 1) // ELEMENT


class Entry:
    """One list entry. Callers get these back from requests and must not mutate them."""

    __slots__ = (
        "entry_id", "qtype", "name", "data", "recoverable", "put_time",
        "delivery_count", "owner", "where", "elements", "segments", "home", "map", "store",
        "lease", "not_before",
    )

    def __init__(self, entry_id: int, qtype: int, name: str, data: bytes | memoryview,
                 recoverable: bool, put_time: int, elements_: int) -> None:
        self.entry_id: int = entry_id
        self.qtype: int = qtype
        self.name: str = name
        self.data = data
        self.recoverable: bool = recoverable
        self.put_time: int = put_time
        self.delivery_count = 0
        self.owner: str | None = None
        self.where = READY
        self.elements: int = elements_  # this entry's own elements, segments excluded
        self.segments: "Queue | None" = None  # staging sublist of a long message
        self.home: tuple[int, str] | None = None  # the queue a suspended entry came from
        self.map: DataMap | None = None  # where an offloaded payload is (data is then empty)
        self.store: str | None = None  # the structure whose data sets hold it
        # a leased lock's (lease ns, wall-clock deadline ns, monotonic deadline s)
        self.lease: tuple[int, int, float] | None = None
        self.not_before: int | None = None  # wall-clock ns before which it was not readable

    @property
    def key(self) -> tuple[int, str]:
        return (self.qtype, self.name)

    @property
    def length(self) -> int:
        """Payload bytes, offloaded or not."""
        return len(self.data) if self.map is None else self.map.length

    @property
    def total_elements(self) -> int:
        return self.elements + (self.segments.elements if self.segments else 0)

    @property
    def total_entries(self) -> int:
        return 1 + (len(self.segments.entries) if self.segments else 0)

    def __repr__(self) -> str:
        return (
            f"Entry({self.entry_id}, {self.qtype}:{self.name}, {self.length}B, "
            f"{self.where}, owner={self.owner}, deliveries={self.delivery_count})"
        )


# whether a read must pass over a message it cannot deliver now (Structure.read)
Passed = Callable[[Entry], bool]


class Queue:
    """The sublist of one queue name in one list header: entries FIFO by entry id."""

    __slots__ = ("qtype", "name", "lh", "entries", "elements", "held")

    def __init__(self, qtype: int, name: str, lh: int) -> None:
        self.qtype = qtype
        self.name = name
        self.lh = lh
        self.entries: ById[Entry] = ById()  # entry id -> Entry
        self.elements = 0  # on this list header: its entries' own elements
        # everything its messages use, their staging segments included: what the
        # queue weighs as an overflow candidate (seed 004, "using the most data elements")
        self.held = 0

    # total_elements spelt out: these run on every put, read and delete
    def add(self, entry: Entry) -> None:
        self.entries[entry.entry_id] = entry
        n = entry.elements
        self.elements += n
        self.held += n if entry.segments is None else n + entry.segments.elements

    def remove(self, entry: Entry) -> None:
        del self.entries[entry.entry_id]
        n = entry.elements
        self.elements -= n
        self.held -= n if entry.segments is None else n + entry.segments.elements

    def first(self) -> Entry:
        return self.entries.first()

    def pop_first(self) -> Entry:
        entry = self.entries.pop_first()
        n = entry.elements
        self.elements -= n
        self.held -= n if entry.segments is None else n + entry.segments.elements
        return entry
