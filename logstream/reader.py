"""Reading a logstream: every writer's series, merged into one ordered stream.

Each series is read by its own lazy iterator (one open segment, one read
buffer), and `heapq.merge` interleaves them by (timestamp, writer, lsn). That
order is total, and because timestamps never decrease within a series each
iterator is already sorted by it, which is all a heap merge needs.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator, Mapping

from .errors import CorruptLog, Damage, Trimmed
from .record import Record
from .scan import SegmentScan, scan_to_end
from .series import SegmentFile, list_series


def read(
    directory: str | os.PathLike[str],
    start: Mapping[str, int] | None = None,
    cut: Mapping[str, int] | None = None,
    since: int | None = None,
) -> Iterator[Record]:
    """Yield the records of every writer in `directory` in (timestamp, writer, lsn) order.

    `start` maps writers to the first LSN to yield (others start at their
    oldest record); `cut` maps writers to the last LSN to yield (writers not
    in it yield nothing); `since` skips records stamped before it. The
    directory is listed now; files are opened as the iterator is consumed.
    Raises Trimmed (now) if a start position was trimmed away, and CorruptLog
    (while iterating) for corruption; a torn tail just ends its series.
    """
    series = list_series(directory)
    streams = []
    for writer, segments in series.items():
        if cut is not None and writer not in cut:
            continue
        first = None if start is None else start.get(writer)
        if first is not None and max(first, 1) < segments[0].first_lsn:
            raise Trimmed(
                f"{segments[0].path}: writer {writer!r} starts at LSN {segments[0].first_lsn},"
                f" records from {first} were trimmed"
            )
        last = None if cut is None else cut[writer]
        if first is not None and last is not None and first > last:
            continue  # covered to its cut already (a group's long dead series): not opened
        streams.append(_read_series(writer, segments, first, last, since))
    return heapq.merge(*streams, key=_order)


def _order(rec: Record) -> tuple[int, str, int]:
    return (rec.timestamp, rec.writer, rec.lsn)


def _read_series(
    writer: str,
    segments: list[SegmentFile],
    first: int | None,
    last: int | None,
    since: int | None,
) -> Iterator[Record]:
    """One writer's records from `first` to `last`, checking LSN continuity."""
    expected: int | None = None
    for i, seg in enumerate(segments):
        if expected is not None and seg.first_lsn != expected:
            raise CorruptLog(seg.path, 0, Damage.LSN_GAP, f"expected first LSN {expected}")
        if last is not None and seg.first_lsn > last:
            return
        is_last = i == len(segments) - 1
        if first is not None and not is_last and segments[i + 1].first_lsn <= first:
            expected = segments[i + 1].first_lsn  # wholly before the start: not opened
            continue
        scan = SegmentScan(seg, last=is_last)
        try:
            for frame in scan:
                if last is not None and frame.lsn > last:
                    return
                if first is not None and frame.lsn < first:
                    continue
                if since is not None and frame.timestamp < since:
                    continue
                yield Record(writer, frame.lsn, frame.timestamp, scan.body(frame))
                if frame.lsn == last:
                    return  # not on to the end: a live segment's preallocated tail is long
        except FileNotFoundError:
            raise Trimmed(f"{seg.path} was trimmed while being read") from None
        expected = scan.next_lsn


def tail_positions(directory: str | os.PathLike[str]) -> dict[str, int]:
    """Map every writer to the LSN of its last good record (0 if it never wrote one).

    Used as a cut, it makes `read` stop where the log ended when it was taken,
    however much the writers append meanwhile. Raises CorruptLog for
    corruption in a last segment.
    """
    return {
        writer: scan_to_end(segments[-1], last=True).next_lsn - 1
        for writer, segments in list_series(directory).items()
    }
