"""What the engine reports to operators: rows of figures by name, as the
protocol's query replies and ``cqsctl display`` carry them.

A structure reports its own figures; a pair reports its two structures' added
up, with the rules for adding them here, once.
"""

from collections import Counter
from collections.abc import Iterable
from typing import Any

Row = dict[str, Any]


def add_queue(row: Row, theirs: Row) -> Row:
    """One queue's figures (``Structure.queue_stats``) over both structures of a
    pair: counts added, the oldest put time the older of the two."""
    for field in ("depth", "elements", "locked", "delayed"):
        row[field] += theirs[field]
    oldest = [t for t in (row["oldest_put_time"], theirs["oldest_put_time"]) if t is not None]
    row["oldest_put_time"] = min(oldest, default=None)
    return row


def add_headers(per_structure: Iterable[list[Row]]) -> list[Row]:
    """List-header figures (``Structure.header_stats``) added up, by list header."""
    rows: dict[int, Row] = {}
    for header_rows in per_structure:
        for r in header_rows:
            row = rows.setdefault(r["lh"], {"lh": r["lh"], "entries": 0, "elements": 0})
            row["entries"] += r["entries"]
            row["elements"] += r["elements"]
    return [rows[lh] for lh in sorted(rows)]


def add_clients(per_structure: Iterable[dict[str, int]]) -> dict[str, int]:
    """Locks held per client, added up."""
    total: Counter[str] = Counter()
    for locks in per_structure:
        total.update(locks)
    return dict(total)
