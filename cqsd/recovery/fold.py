"""The reference fold of docs/recovery.md: image + log records -> image.

Pure Python over image rows (``records.py``), so the Spark job can be checked
against it and a test can compare it with a live engine.
"""

from collections.abc import Iterable

from ..records import (
    BLOCK,
    COLD_BY,
    COUNT,
    DELETE,
    E_DATA,
    E_NAME,
    E_OWNER,
    E_PUT_TIME,
    E_QTYPE,
    EFFECTS,
    HOME,
    I_COUNT,
    I_HOME,
    LOCK,
    M_MAP,
    MAP,
    MAPPED,
    MOVED_IN,
    MOVED_OUT,
    NAME,
    OTHERS,
    OWNER,
    PUT,
    QTYPE,
    R_COUNT,
    R_HOME,
    READY_AT,
    STRUCTURE,
    WHERE,
    FoldError,
)


def fold(image: dict[int, list], records: Iterable[dict], structure: str) -> int:
    """Apply every record of ``structure`` to ``image`` in place; returns the highest
    entry id put by the records (0 if none)."""
    last_id = 0
    for body in records:
        if body.get(STRUCTURE) == structure:
            last_id = max(last_id, _apply(image, body[EFFECTS], structure))
        other = body.get(OTHERS)
        if other and structure in other:
            last_id = max(last_id, _apply(image, other[structure], structure))
    return last_id


def _apply(image: dict[int, list], effects: list, structure: str) -> int:
    last_id = 0
    for effect in effects:
        kind, eid = effect[0], effect[1]
        if kind == PUT or kind == MOVED_IN:
            count, home = (0, None) if kind == PUT else (effect[I_COUNT], effect[I_HOME])
            image[eid] = [eid, effect[E_QTYPE], effect[E_NAME], effect[E_DATA], True,
                          effect[E_PUT_TIME], count, "ready", None, home, None]
            last_id = max(last_id, eid)
            continue
        if kind == BLOCK:  # maps only: the bytes are in the data set already
            continue
        row = image.get(eid)
        if row is None:
            raise FoldError(f"structure {structure}: effect {kind} on entry {eid}, "
                            "which the image does not hold")
        if kind == LOCK:
            row[WHERE], row[OWNER] = "locked", effect[E_OWNER]
            row[COUNT] += 1
        elif kind == DELETE or kind == MOVED_OUT:
            del image[eid]
        elif kind == READY_AT:
            row[QTYPE], row[NAME] = effect[E_QTYPE], effect[E_NAME]
            row[HOME], row[COUNT] = effect[R_HOME], effect[R_COUNT]
            row[WHERE], row[OWNER] = "ready", None
        elif kind == COLD_BY:
            row[WHERE], row[OWNER] = "cold", effect[E_OWNER]
        elif kind == MAPPED:
            row[MAP] = effect[M_MAP]
        else:
            raise FoldError(f"structure {structure}: unknown effect kind {kind!r}")
    return last_id
