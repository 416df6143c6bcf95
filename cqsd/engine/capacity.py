"""A structure's capacity: the data elements and list entries it has and uses,
and its growth toward its maximum size.

A coupling facility counts a list structure's space in 512-byte data elements
and in list entries (docs/architecture.md); a message costs one entry and
⌈(payload + 64 bytes of entry controls)/512⌉ elements per segment of
``entry_max``, or, offloaded to a data set (docs/smds.md), the elements of its
encoded data map. ``current_size`` may be below ``size``, the maximum: a request
that does not fit first alters the structure toward ``size`` by the step
overflow processing takes (``overflow.grown_size``, seed 004 "Structure
Alter"), and only one that cannot fit even at ``size`` is refused with
STRUCTURE_FULL. A refusal marks the structure full and the next request that
fits clears it, each leaving a ``FullnessChanged`` event.

Pure bookkeeping: the structure reserves before it inserts (``reserve``) and
gives back when a message goes for good (``discard``).
"""

from collections.abc import Callable

import msgpack

from ..smds.datamap import DataMap
from ..smds.offload import offloads
from .entry import ELEMENT, Entry, elements
from .errors import CQSError, Reason
from .events import Altered, Event, FullnessChanged
from .overflow import grown_size

GROWN = "put does not fit"  # why a structure altered itself before refusing a put


class Capacity:
    __slots__ = ("current_size", "elements_total", "elements_used", "entries_total",
                 "entries_used", "entry_max", "events", "full", "name", "offload_rules", "size")

    def __init__(self, name: str, size: int, initsize: int | None, entry_max: int,
                 max_entries: int | None, offload_rules: tuple[tuple[int, int], ...] | None,
                 events: list[Event]) -> None:
        self.name = name  # the structure's, for its events and refusals
        self.size = size  # the maximum size in bytes (SIZE)
        self.current_size = initsize or size  # bytes, grown toward size (INITSIZE at first)
        self.entry_max = entry_max  # payload bytes per list entry: longer ones are segmented
        self.offload_rules = offload_rules  # None: no SMDS; else (offldNthr, offldNsze) rules
        self.elements_total = self.current_size // ELEMENT
        self.entries_total = max_entries or size // ELEMENT
        self.elements_used = 0
        self.entries_used = 0
        self.full = False  # the last request that needed space was refused it
        self.events = events  # the structure's (shared with its overflow structure, if paired)

    def cost(self, nbytes: int) -> tuple[int, int]:
        """(data elements, list entries) a message of ``nbytes`` occupies, segments included."""
        step = self.entry_max
        if nbytes <= step:
            return elements(nbytes), 1
        whole, rest = divmod(nbytes, step)
        return whole * elements(step) + (elements(rest) if rest else 0), whole + (1 if rest else 0)

    def cost_of(self, nbytes: int, dmap: DataMap | None) -> tuple[int, int]:
        """(data elements, list entries) of a message, offloaded to ``dmap`` or not."""
        if dmap is None:
            return self.cost(nbytes)
        return elements(len(msgpack.packb(dmap.encode()))), 1

    def offloads(self, nbytes: int) -> bool:
        """Whether a payload of ``nbytes`` goes to a data set (docs/smds.md): over
        ``entry_max`` always, smaller ones by the offload rules as the structure fills."""
        rules = self.offload_rules
        if rules is None:
            return False
        return offloads(nbytes, 100 * self.elements_used / max(1, self.elements_total),
                        self.entry_max, rules)

    def check_fits(self, need_elements: int, need_entries: int,
                   what: Callable[[], str]) -> int | None:
        """None if a request needing this much space fits now; the size it must alter
        to first if it fits only once grown toward ``size`` (seed 004, "Structure
        Alter": the step overflow processing takes, for the use it needs). Raises
        STRUCTURE_FULL if even ``size`` cannot hold it, naming the request ``what()``
        says (made only then: a put's name costs more than its check)."""
        used = self.elements_used + need_elements
        entries_fit = self.entries_used + need_entries <= self.entries_total
        if used <= self.elements_total and entries_fit:
            return None
        if entries_fit and used <= self.size // ELEMENT:
            return grown_size(used, self.elements_total, self.size)
        if not self.full:
            self.full = True
            self._fullness()
        room = (f"{self.size // ELEMENT - self.elements_used} elements even at its maximum "
                f"size" if entries_fit else f"{self.entries_total - self.entries_used} entries")
        raise CQSError(
            Reason.STRUCTURE_FULL,
            f"structure {self.name} is full: {what()} needs {need_elements} data elements "
            f"and {need_entries} list entries; {room} are free",
        )

    def reserve(self, need_elements: int, need_entries: int, what: Callable[[], str]) -> None:
        """Take the space a request needs, growing first if it must (``check_fits``)."""
        grow_to = self.check_fits(need_elements, need_entries, what)
        if grow_to is not None:
            self.alter(grow_to, GROWN)
        self.elements_used += need_elements
        self.entries_used += need_entries
        if self.full:
            self.full = False
            self._fullness()

    def discard(self, entry: Entry) -> None:
        """Give back the space of a message gone for good, its segments' included."""
        self.elements_used -= entry.total_elements
        self.entries_used -= entry.total_entries

    def alter(self, size_bytes: int, reason: str) -> Altered:
        """Change the current size within ``size`` (``Structure.alter``)."""
        if type(size_bytes) is not int or not 0 < size_bytes <= self.size:
            raise CQSError(
                Reason.INVALID_REQUEST,
                f"alter of structure {self.name} to {size_bytes!r} bytes: the size must be "
                f"1 to its maximum size {self.size}",
            )
        if size_bytes < self.current_size and size_bytes // ELEMENT < self.elements_used:
            raise CQSError(
                Reason.INVALID_REQUEST,
                f"alter of structure {self.name} to {size_bytes} bytes "
                f"({size_bytes // ELEMENT} data elements): {self.elements_used} are in use",
            )
        event = Altered(self.name, self.current_size, size_bytes, reason)
        self.current_size = size_bytes
        self.elements_total = size_bytes // ELEMENT
        self.events.append(event)
        return event

    def _fullness(self) -> None:
        self.events.append(
            FullnessChanged(self.name, self.full, self.elements_used, self.elements_total)
        )
