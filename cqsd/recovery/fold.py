"""The reference fold of docs/recovery.md: image + log records -> image.

Pure Python over plain rows, so the Spark job can be checked against it and a
test can compare it with a live engine. Rows are lists, as in the image file:
[id, qtype, name, data, recoverable, put_time, delivery_count, where, owner, home].
"""

from collections.abc import Iterable

ID, QTYPE, NAME, DATA, RECOVERABLE, PUT_TIME, COUNT, WHERE, OWNER, HOME = range(10)


class FoldError(Exception):
    """A record that does not fit the image it is applied to."""


def fold(image: dict[int, list], records: Iterable[dict], structure: str) -> int:
    """Apply every record of ``structure`` to ``image`` in place; returns the highest
    entry id put by the records (0 if none)."""
    last_id = 0
    for body in records:
        if body.get("s") == structure:
            last_id = max(last_id, _apply(image, body["e"], structure))
        other = body.get("x")
        if other and structure in other:
            last_id = max(last_id, _apply(image, other[structure], structure))
    return last_id


def _apply(image: dict[int, list], effects: list, structure: str) -> int:
    last_id = 0
    for effect in effects:
        kind, eid = effect[0], effect[1]
        if kind == "P":
            _, _, qtype, name, data, put_time = effect
            image[eid] = [eid, qtype, name, data, True, put_time, 0, "ready", None, None]
            last_id = max(last_id, eid)
            continue
        if kind == "I":
            _, _, qtype, name, data, put_time, count, home = effect
            image[eid] = [eid, qtype, name, data, True, put_time, count, "ready", None, home]
            last_id = max(last_id, eid)
            continue
        row = image.get(eid)
        if row is None:
            raise FoldError(f"structure {structure}: effect {kind} on entry {eid}, "
                            "which the image does not hold")
        if kind == "L":
            row[WHERE], row[OWNER] = "locked", effect[2]
            row[COUNT] += 1
        elif kind in ("D", "O"):
            del image[eid]
        elif kind == "R":
            _, _, qtype, name, home, count = effect
            row[QTYPE], row[NAME], row[HOME], row[COUNT] = qtype, name, home, count
            row[WHERE], row[OWNER] = "ready", None
        elif kind == "C":
            row[WHERE], row[OWNER] = "cold", effect[2]
        else:
            raise FoldError(f"structure {structure}: unknown effect kind {kind!r}")
    return last_id


def rows_of(structure) -> dict[int, list]:
    """A live engine structure as image rows (what the fold must reproduce)."""
    return {
        e.entry_id: [
            e.entry_id, int(e.qtype), e.name, bytes(e.data), e.recoverable, e.put_time,
            e.delivery_count, e.where, e.owner,
            [int(e.home[0]), e.home[1]] if e.home else None,
        ]
        for e in structure
    }
