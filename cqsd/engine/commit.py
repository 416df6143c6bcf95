"""Units of work: the operations of a commit, and its checks.

A commit applies puts, deletes, moves and unlocks all together or not at all.
It is checked first, changing nothing (``check``): each entry may appear once,
each operation must be one its client may make, and the puts must fit in the
space free after the batch's deletes, growing the structure if they must. What
passes is ``Checked`` and can no longer fail: ``Structure.apply_commit`` applies
it. The two are apart so that a commit spanning a primary and its overflow
structure (``pair.py``) can check both before applying to either.
"""

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from ..smds.datamap import DataMap
from .capacity import Capacity
from .entry import Entry
from .errors import CQSError, Reason
from .locks import check_deletable, check_held, check_movable
from .qtypes import QueueType, check_name, parse_qtype, retarget

# An operation's queue type, name and entry id are as the request gave them (typed
# ``Any``; ``object`` would do, but a compiled NamedTuple cannot name it): ``check``
# checks them, as Structure's requests do.


class Put(NamedTuple):
    qtype: Any
    name: Any
    data: bytes
    recoverable: bool = True
    dmap: DataMap | None = None  # the payload is offloaded there (the daemon wrote it)
    not_before: int | None = None  # wall-clock ns: delayed until then


class Delete(NamedTuple):
    entry_id: Any


class Move(NamedTuple):
    entry_id: Any
    qtype: Any
    name: Any


class Unlock(NamedTuple):
    entry_id: Any
    failed: bool = False
    qtype: Any = None
    name: Any = None


Op = Put | Delete | Move | Unlock
# a Put, parsed: (queue type, name, data, recoverable, data map, not_before)
ParsedPut = tuple[QueueType, str, bytes, bool, DataMap | None, int | None]


class Checked(NamedTuple):
    """A commit that passed every check and can no longer fail (``check``)."""

    ops: list[Op]
    puts: list[ParsedPut]  # each Put, parsed, in order
    grow_to: int | None = None  # the size its puts need the structure altered to first


def check(client: str, ops: Iterable[Op], space: Capacity,
          find: Callable[[object], Entry]) -> Checked:
    """Everything a commit of ``client`` checks in the structure whose capacity is
    ``space`` and whose entries ``find`` looks up (raising ENTRY_NOT_FOUND),
    changing nothing."""
    ops = list(ops)
    seen: set[object] = set()
    need_elements = need_entries = 0
    freed_elements = freed_entries = 0
    puts: list[ParsedPut] = []
    for op in ops:
        if type(op) is Put:
            qtype, name = parse_qtype(op.qtype), check_name(op.name)
            elements_, entries = space.cost_of(len(op.data), op.dmap)
            need_elements += elements_
            need_entries += entries
            puts.append((qtype, name, op.data, bool(op.recoverable), op.dmap, op.not_before))
            continue
        assert not isinstance(op, Put)  # for mypy: the type() test above is faster
        if op.entry_id in seen:
            raise CQSError(
                Reason.INVALID_REQUEST, f"entry {op.entry_id} appears twice in one commit"
            )
        seen.add(op.entry_id)
        entry = find(op.entry_id)
        if type(op) is Delete:
            check_deletable(client, entry)
            freed_elements += entry.total_elements
            freed_entries += entry.total_entries
        elif type(op) is Move:
            parse_qtype(op.qtype), check_name(op.name)
            check_movable(client, entry)
        elif type(op) is Unlock:
            retarget(entry.qtype, entry.name, op.qtype, op.name)
            check_held(client, entry)
        else:
            raise CQSError(Reason.INVALID_REQUEST, f"unknown commit operation {op!r}")
    grow_to = None
    if puts:
        grow_to = space.check_fits(
            need_elements - freed_elements,
            need_entries - freed_entries,
            lambda: f"commit of {len(puts)} puts",
        )
    return Checked(ops, puts, grow_to)
