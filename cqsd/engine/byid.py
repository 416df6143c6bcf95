"""The messages of one queue in entry-id order (entry.py's ``Queue``).

Design note. A queue is put to at its tail and read at its head: entry ids come
from a clock that only goes forward (ids.py), so nearly every put brings the
highest id the queue has held and nearly every read takes its lowest. A sorted
map pays for the general case on each of them; sortedcontainers' ``SortedDict``,
interpreted, was about 5% of the daemon's user time on the plain put / read /
delete pattern (perf record, benchmarks/README.md). Here the ids sit in one
ascending list read from a moving head, beside a dict from id to value: a put
past the tail is an append, a read at the head a step of the head.

The rarer cases pay more. An id below the head (a message unlocked back to the
front of its queue) takes the spent slot before the head, or is inserted at the
front; an id between (an overflow move, a restore) is bisected into place. An
entry removed from the middle (a delete of an unlocked message, a move) leaves
its id in the list as *stale*: skipped when the head or the tail reaches it, and
dropped all at once when stale ids outnumber live ones. So the list stays within
twice the live ids plus ``SLACK``, and the ids before the head are given back
the same way.

Iteration tolerates changes between its steps, as a browse page's generator
needs: it yields live ids only and in increasing order, and finds its place
again by bisection when the list was rebuilt under it. An id inserted in place
before its position only makes it look again at ids it has passed, which the
increasing order skips.
"""

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

V = TypeVar("V")

SLACK = 64  # stale ids, or spent slots before the head, kept whatever the size
_GONE: object = object()  # what the dict has for a stale id


class ById(Generic[V]):
    """Values by entry id, in id order."""

    __slots__ = ("_by_id", "_head", "_ids")

    def __init__(self, items: Iterable[tuple[int, V]] = ()) -> None:
        # ids as the objects they came as (Any): compiled code would unbox an int
        # read from either and box it again to use it, an allocation past 256
        self._by_id: dict[Any, V] = dict(items)
        self._ids: list[Any] = sorted(self._by_id)
        # _ids[:_head] are spent; _ids[_head] and _ids[-1] are live, and the ids
        # between that are not in _by_id are stale
        self._head = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def __contains__(self, key: int) -> bool:
        return key in self._by_id

    def __iter__(self) -> Iterator[int]:
        return self.keys()

    def __getitem__(self, key: int) -> V:
        return self._by_id[key]

    def __setitem__(self, key: int, value: V) -> None:
        k: Any = key  # boxed once, the one object the dict and the list share
        by_id = self._by_id
        if k in by_id:
            by_id[k] = value
            return
        by_id[k] = value
        ids = self._ids
        head = self._head
        if head == len(ids) or k > ids[-1]:
            ids.append(k)
        elif k < ids[head]:
            if head:
                self._head = head - 1
                ids[head - 1] = k
            else:
                ids.insert(0, k)
        else:
            i = bisect_left(ids, k, head)
            if ids[i] != k:  # else its own stale id, live again
                ids.insert(i, k)

    def __delitem__(self, key: int) -> None:
        k: Any = key
        by_id = self._by_id
        del by_id[k]
        ids = self._ids
        if not by_id:
            self._rebuild()
        elif k == ids[self._head]:
            self._head += 1
            self._skip_head()
        elif k == ids[-1]:
            ids.pop()
            while ids[-1] not in by_id:
                ids.pop()
        else:
            stale = len(ids) - self._head - len(by_id)
            if stale > SLACK and stale > len(by_id):
                self._rebuild()

    def first(self) -> V:
        """The value of the lowest id (IndexError when empty)."""
        return self._by_id[self._ids[self._head]]

    def first_id(self) -> int:
        key: int = self._ids[self._head]
        return key

    def last_id(self) -> int:
        key: int = self._ids[-1]
        return key

    def pop_first(self) -> V:
        """Remove and return the value of the lowest id (IndexError when empty)."""
        by_id = self._by_id
        value = by_id.pop(self._ids[self._head])
        if by_id:
            self._head += 1
            self._skip_head()
        else:
            self._rebuild()
        return value

    def keys(self, after: int = -1) -> Iterator[int]:
        """The ids in order (those above ``after``; ids are entry ids, never negative)."""
        return self._walk(after, False)

    def values(self, after: int = -1) -> Iterator[V]:
        """The values in id order (of the ids above ``after``)."""
        return self._walk(after, True)

    def _walk(self, after: int, values: bool) -> Iterator[Any]:
        by_id = self._by_id
        ids = self._ids
        last: Any = after
        i = bisect_right(ids, last, self._head)
        while True:
            if ids is not self._ids:  # rebuilt: find the place again
                ids = self._ids
                i = bisect_right(ids, last, self._head)
            elif i < self._head:
                i = self._head
            if i >= len(ids):
                return
            key = ids[i]
            i += 1
            if key > last:
                value = by_id.get(key, _GONE)
                if value is not _GONE:
                    last = key
                    yield value if values else key

    def _skip_head(self) -> None:
        """Past stale ids to a live one (there is one), then give back the spent
        slots once they are most of the list."""
        ids = self._ids
        by_id = self._by_id
        head = self._head
        while ids[head] not in by_id:
            head += 1
        self._head = head
        if head > SLACK and 2 * head > len(ids):
            self._rebuild()

    def _rebuild(self) -> None:
        """The live ids alone, in a new list."""
        by_id = self._by_id
        self._ids = [key for key in self._ids[self._head:] if key in by_id]
        self._head = 0
