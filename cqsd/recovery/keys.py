"""Exactly-once puts at a start: the keys of the last ``dedup_window`` seconds,
read back from the log (cqsd/dedup.py; docs/group.md, "Exactly-once puts").

Only the records stamped within the window are unpacked, and only the segments
written to within it are read at all: a segment whose file was last modified
before the window holds only older records. The log keeps those segments
(checkpoints.py, ``trim``), whatever the checkpoints cover.

Three clocks meet here, and none is compared with another: the records' stamps
(their writers' clocks) are measured back from the newest record read, the
files' times (the file system's clock) back from the newest file, and this
node's clock only caps the first (cqsd/dedup.py, "Clocks"). A node whose clock
runs minutes ahead of the others, or of a shared file system's, still reads
back the keys the others took in the window.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import logstream
from logstream.series import list_series

from ..dedup import Remembered, rebuild


def pair_of(pairs: Mapping[str, object]) -> dict[str, str]:
    """structure -> its pair's name, for the pairs given by name -> pair (anything
    with ``structures()``)."""
    return {s.name: name for name, pair in pairs.items()
            for s in pair.structures()}  # type: ignore[attr-defined]


# How much later than a record its segment's file may have been modified (the
# writes of a group commit, a file system's coarse times): read that much more.
SLACK_NS = 2 * 10**9


def remembered(log_dir: Path, cut: Mapping[str, int], pairs: dict[str, str], window: float,
               now: int, newest: int) -> dict[str, Remembered]:
    """The memories of ``pairs`` (structure -> pair) from the records of ``cut``'s
    writers (each up to its LSN there) stamped in the ``window`` seconds before
    ``newest``, the stamp of the newest record at or below the cut, or before
    ``now``, this node's wall-clock ns, if that is earlier. They are on the log's
    clock: ``Remembered.catch_up`` puts them on this node's.

    A ``newest`` of 0 (a warm standby loading, which has read no record yet) is
    the newest stamp among the records of the recent segments, all of which are
    then unpacked: the window is never measured back from this node's clock alone."""
    window_ns = int(window * 1e9)
    start = _recent(log_dir, cut, window_ns + SLACK_NS) if window > 0 and pairs else {}
    records: Iterable[logstream.Record] = (
        logstream.read(log_dir, start=start, cut={w: cut[w] for w in start},
                       since=min(now, newest) - window_ns if newest else None)
        if start else ())
    read = _Newest()
    memories = rebuild(((r.timestamp, r.body) for r in read.of(records)
                        if isinstance(r.body, dict)), pairs, window)
    anchor = min(now, newest or read.stamp or now)
    for memory in memories.values():
        memory.expire(anchor)
    return memories


class _Newest:
    """The newest stamp of the records passed through ``of``."""

    def __init__(self) -> None:
        self.stamp = 0

    def of(self, records: Iterable[logstream.Record]) -> Iterator[logstream.Record]:
        for rec in records:
            self.stamp = max(self.stamp, rec.timestamp)
            yield rec


def _recent(log_dir: Path, writers: Iterable[str], span: int) -> dict[str, int]:
    """For each writer: the first LSN of its oldest segment modified in the ``span`` ns
    before the newest modification of any of theirs (the file system's clock alone)."""
    series = list_series(log_dir)  # one listing: a group has many series
    modified: dict[str, list[tuple[int, int]]] = {}  # writer -> (first LSN, mtime)
    for writer in writers:
        for seg in series.get(writer, ()):
            try:
                modified.setdefault(writer, []).append(
                    (seg.first_lsn, seg.path.stat().st_mtime_ns))
            except FileNotFoundError:  # trimmed meanwhile: older than the window
                continue
    since = max((m for segs in modified.values() for _, m in segs), default=0) - span
    start = {}
    for writer, segs in modified.items():
        recent = [first for first, m in segs if m >= since]
        if recent:
            start[writer] = recent[0]
    return start
