"""The reference fold of docs/recovery.md: image + log records -> image.

Pure Python over image rows (``records.py``), so the Spark job can be checked
against it and a test can compare it with a live engine.

Offloaded payloads (docs/smds.md) fold one of two ways. *Maps only* — the
daemon's restart — skips ``B`` effects, whose bytes are already in the data
set, so restart memory does not grow with offloaded data; ``M`` sets the
row's map. *Materialising* — what the Spark jobs do, and this fold as their
oracle — keeps each ``B`` (``cqsd.blocks``) until the ``M`` of its entry,
which sets the row's map and its data, the blocks' bytes checked against the map.
"""

from collections.abc import Iterable

from ..blocks import Blocks, decode
from ..records import (
    B_DATA,
    B_PAGE,
    BLOCK,
    COLD_BY,
    COUNT,
    DATA,
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
    LEASE,
    LEASED,
    LOCK,
    M_MAP,
    MAP,
    MAPPED,
    MOVED_IN,
    MOVED_OUT,
    N_AT,
    NAME,
    NOT_BEFORE,
    NOT_BEFORE_AT,
    OTHERS,
    OWNER,
    PUT,
    QTYPE,
    R_COUNT,
    R_HOME,
    READY_AT,
    STRUCTURE,
    T_DEADLINE,
    T_LEASE,
    WHERE,
    FoldError,
)


def fold(image: dict[int, list], records: Iterable[dict], structure: str, *,
         materialise: bool = False) -> int:
    """Apply every record of ``structure`` to ``image`` in place; returns the highest
    entry id put by the records (0 if none). ``materialise`` gives offloaded rows
    their payload from the ``B`` effects (which may precede their ``M`` by any
    number of records of this call); ``B`` effects left without an ``M`` belong
    to puts that never completed and are dropped. Raises FoldError."""
    blocks = Blocks(structure) if materialise else None
    last_id = 0
    for body in records:
        if body.get(STRUCTURE) == structure:
            last_id = max(last_id, _apply(image, body[EFFECTS], structure, blocks))
        other = body.get(OTHERS)
        if other and structure in other:
            last_id = max(last_id, _apply(image, other[structure], structure, blocks))
    return last_id


def _apply(image: dict[int, list], effects: list, structure: str, blocks: Blocks | None) -> int:
    last_id = 0
    for effect in effects:
        kind, eid = effect[0], effect[1]
        if kind == PUT or kind == MOVED_IN:
            count, home = (0, None) if kind == PUT else (effect[I_COUNT], effect[I_HOME])
            image[eid] = [eid, effect[E_QTYPE], effect[E_NAME], effect[E_DATA], True,
                          effect[E_PUT_TIME], count, "ready", None, home, None, None, None]
            last_id = max(last_id, eid)
            continue
        if kind == BLOCK:
            if blocks is not None:
                blocks.add(eid, effect[B_PAGE], effect[B_DATA])
            continue
        if kind == MAPPED:  # map and blocks are checked before the entry, as in Spark
            datamap = decode(structure, eid, effect[M_MAP])
            payload = blocks.take(eid, datamap) if blocks is not None else None
        row = image.get(eid)
        if row is None:
            raise FoldError(f"structure {structure}: effect {kind} on entry {eid}, "
                            "which the image does not hold")
        if kind == LOCK:
            row[WHERE], row[OWNER], row[LEASE] = "locked", effect[E_OWNER], None
            row[COUNT] += 1
        elif kind == LEASED:
            row[LEASE] = [effect[T_LEASE], effect[T_DEADLINE]]
        elif kind == NOT_BEFORE_AT:
            row[NOT_BEFORE] = effect[N_AT]
        elif kind == DELETE or kind == MOVED_OUT:
            del image[eid]
        elif kind == READY_AT:
            row[QTYPE], row[NAME] = effect[E_QTYPE], effect[E_NAME]
            row[HOME], row[COUNT] = effect[R_HOME], effect[R_COUNT]
            row[WHERE], row[OWNER], row[LEASE] = "ready", None, None
        elif kind == COLD_BY:
            row[WHERE], row[OWNER], row[LEASE] = "cold", effect[E_OWNER], None
        elif kind == MAPPED:
            row[MAP] = effect[M_MAP]
            if payload is not None:
                row[DATA] = payload
        else:
            raise FoldError(f"structure {structure}: unknown effect kind {kind!r}")
    return last_id
