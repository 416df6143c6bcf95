"""Exactly-once puts at a start: the keys of the last ``dedup_window`` seconds,
read back from the log (cqsd/dedup.py; docs/group.md, "Exactly-once puts").

Only the records stamped within the window are unpacked, and only the segments
written to within it are read at all: a segment whose file was last modified
before the window holds only older records. The log keeps those segments
(checkpoints.py, ``trim``), whatever the checkpoints cover.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import logstream
from logstream.series import list_series

from ..dedup import Remembered, rebuild


def pair_of(pairs: Mapping[str, object]) -> dict[str, str]:
    """structure -> its pair's name, for the pairs given by name -> pair (anything
    with ``structures()``)."""
    return {s.name: name for name, pair in pairs.items()
            for s in pair.structures()}  # type: ignore[attr-defined]


def remembered(log_dir: Path, cut: Mapping[str, int], pairs: dict[str, str], window: float,
               now: int) -> dict[str, Remembered]:
    """The memories of ``pairs`` (structure -> pair) from the records of ``cut``'s
    writers (each up to its LSN there) stamped in the ``window`` seconds before
    ``now`` (wall-clock ns)."""
    since = now - int(window * 1e9)
    start = _recent(log_dir, cut, since) if window > 0 and pairs else {}
    records: Iterable[logstream.Record] = (
        logstream.read(log_dir, start=start, cut={w: cut[w] for w in start}, since=since)
        if start else ())
    return rebuild(((r.timestamp, r.body) for r in records if isinstance(r.body, dict)),
                   pairs, window, now)


def _recent(log_dir: Path, writers: Iterable[str], since: int) -> dict[str, int]:
    """For each writer written to since ``since``: the first LSN of its oldest segment
    modified since then."""
    start, series = {}, list_series(log_dir)  # one listing: a group has many series
    for writer in writers:
        for seg in series.get(writer, ()):
            try:
                modified = seg.path.stat().st_mtime_ns
            except FileNotFoundError:  # trimmed meanwhile: older than the window
                continue
            if modified >= since:
                start[writer] = seg.first_lsn
                break
    return start
