"""Overflow processing policy: how much to grow, which queues to select, the exit.

Seed 004, "Structure Overflow": when the data elements in use reach a threshold
(default 70 percent), CQS first alters a structure that is below its maximum
size, "to bring utilization down 20%"; at maximum size it selects "the QNAMEs
using the most data elements", enough to cover 20 percent of the structure's
data elements and at most 512 of them (both settings: ``overflow_share`` and
``overflow_candidates``), and a user exit may override that choice. These
are pure functions of numbers; ``pair.py`` applies them.
"""

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .entry import ELEMENT
from .qtypes import QueueKey, QueueType, parse_qtype
from .reports import Row

DEFAULT_THRESHOLD = 70  # percent of data elements in use (seed 004); 100 turns overflow off
RELIEF_POINTS = 20  # percentage points a growth aims to free (seed 004)
DEFAULT_SHARE = 20  # percent of data elements the candidates cover (seed 004)
MAX_CANDIDATES = 512  # queue names selected at most per selection (seed 004)

Key = QueueKey  # the engine's local name for it
# exit(structure name, candidates) -> the candidates it keeps (seed 004: "User exit
# can override CQS decision to put QNAME in overflow status")
OverflowExit = Callable[[str, list[Row]], Iterable[Row]]


@dataclass
class Relief:
    """What one overflow pass did, for the daemon to log.

    ``grew`` is (old size, new size) in bytes when the pass altered the structure;
    ``selected`` the queues that entered overflow status and ``dropped`` those the
    exit kept out, each {"qtype", "queue", "elements"}; ``exit_error`` says how the
    exit failed, in which case every candidate was kept.
    """

    grew: tuple[int, int] | None = None
    selected: list[Row] = field(default_factory=list)
    dropped: list[Row] = field(default_factory=list)
    exit_error: str | None = None


def threshold_elements(threshold: int, elements_total: int) -> int:
    """The data elements in use at which ``threshold`` percent is reached."""
    return -(-threshold * elements_total // 100)


def grown_size(used: int, elements_total: int, size: int) -> int:
    """The size in bytes that brings ``used`` data elements down by RELIEF_POINTS
    percentage points (70% of 1,000 elements: 1,400 elements, 50%), capped at the
    maximum ``size``; ``size`` itself when no size can (use at 20% or below). A
    structure restored over-full counts as 100% used: it grows to hold its content
    at 80%."""
    excess = min(100 * used, 100 * elements_total) - RELIEF_POINTS * elements_total
    if excess <= 0:
        return size
    want = -(-100 * used * elements_total // excess)
    return min(size, want * ELEMENT)


def select(
    ready: Iterable[tuple[int, Key]], elements_total: int, exclude: set[Key] | dict[Key, bool],
    share: int = DEFAULT_SHARE, limit: int = MAX_CANDIDATES,
) -> list[tuple[Key, int]]:
    """The biggest queues, biggest first, until they cover ``share`` percent of
    ``elements_total``, at most ``limit`` of them, leaving out those in ``exclude``.

    ``ready`` is (data elements, key) per queue. A partial sort: the cost is linear
    in the number of queues, which is what makes the pause short.
    """
    budget = -(-share * elements_total // 100)
    biggest = heapq.nlargest(
        limit, (row for row in ready if row[1] not in exclude), key=_elements
    )
    chosen: list[tuple[Key, int]] = []
    covered = 0
    for elements_, key in biggest:
        if covered >= budget:
            break
        chosen.append((key, elements_))
        covered += elements_
    return chosen


def _elements(row: tuple[int, Key]) -> int:
    return row[0]


def describe(key: Key, elements_: int) -> Row:
    return {"qtype": QueueType(key[0]).name, "queue": key[1], "elements": elements_}


def consult(
    exit_: OverflowExit | None, structure: str, candidates: list[tuple[Key, int]]
) -> tuple[list[tuple[Key, int]], list[tuple[Key, int]], str | None]:
    """(kept, dropped, error) after the exit has seen the candidates.

    The exit may only drop candidates: a name it returns that was not offered is
    ignored. An exit that raises, or returns something that is not candidates,
    keeps them all, and the error says why: a broken exit must not stop overflow
    processing, which exists to keep the structure from filling.
    """
    if exit_ is None or not candidates:
        return candidates, [], None
    offered = [describe(key, n) for key, n in candidates]
    try:
        kept = {(parse_qtype(c["qtype"]), c["queue"])
                for c in exit_(structure, [dict(c) for c in offered])}
    except Exception as err:  # the exit is user code: any failure keeps everything
        return candidates, [], f"{type(err).__name__}: {err}"
    return (
        [c for c in candidates if c[0] in kept],
        [c for c in candidates if c[0] not in kept],
        None,
    )
