"""Finding the segments of each writer in a logstream directory.

A listing is a snapshot: a writer may rotate or trim while we look. Everything
built on it is safe with that because segments only ever appear after the last
one or disappear from the front of a series.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from . import segment
from .errors import CorruptLog, Damage


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentFile:
    """One segment as its name describes it (the header is checked on opening)."""

    path: Path
    writer: str
    first_lsn: int


def list_series(directory: str | os.PathLike[str]) -> dict[str, list[SegmentFile]]:
    """Every writer's segments, oldest first; other files are ignored."""
    root = Path(directory)
    found: dict[str, list[SegmentFile]] = {}
    with os.scandir(root) as entries:
        for entry in entries:
            parsed = segment.parse_segment_name(entry.name)
            if parsed is not None:
                writer, first_lsn = parsed
                seg = SegmentFile(root / entry.name, writer, first_lsn)
                found.setdefault(writer, []).append(seg)
    for segments in found.values():
        segments.sort(key=lambda s: s.first_lsn)
    return dict(sorted(found.items()))


def list_segments(directory: str | os.PathLike[str], writer: str) -> list[SegmentFile]:
    """The segments of one writer, oldest first (empty if it has none)."""
    return list_series(directory).get(segment.check_writer_id(writer), [])


def _size(seg: SegmentFile) -> int:
    return seg.path.stat().st_size


def bytes_between(segments: list[SegmentFile], after: int, end: int | None,
                  size_of: Callable[[SegmentFile], int] = _size) -> int:
    """Record bytes of one series' ``segments`` after LSN ``after`` and before ``end``
    (the LSN after its last record; None: to its end): how much log a reader starting
    there goes through. Exact for whole segments; within the segment holding record
    ``after + 1`` it is that segment's share pro rata by LSN (the whole of it if
    ``end`` is not known), off by at most one segment. Reads only sizes. A series
    with no segments left (one a group retired whole) holds none."""
    if not segments:
        return 0
    ends = [*(seg.first_lsn for seg in segments[1:]), end]  # the LSN after each one's last
    total = 0
    for seg, after_last in zip(segments, ends, strict=True):
        if after_last is not None and after_last <= after + 1:
            continue  # every record in it is at or before ``after``
        try:
            held = max(0, size_of(seg) - segment.HEADER_SIZE)
        except FileNotFoundError:
            continue  # trimmed meanwhile: not after ``after``
        if seg.first_lsn <= after and after_last is not None:
            held = held * (after_last - after - 1) // (after_last - seg.first_lsn)
        total += held
    return total


def check_header(seg: SegmentFile, data: bytes) -> None:
    """Raise CorruptLog unless `data` is a good header agreeing with the file's name."""
    header = segment.decode_header(data)
    if isinstance(header, Damage):
        raise CorruptLog(seg.path, 0, header)
    if header.writer != seg.writer or header.first_lsn != seg.first_lsn:
        raise CorruptLog(
            seg.path,
            0,
            Damage.FOREIGN,
            f"header says writer {header.writer!r} first LSN {header.first_lsn}",
        )


def read_header(seg: SegmentFile) -> None:
    """Check the header of a segment on disk; raises CorruptLog."""
    with open(seg.path, "rb") as f:
        check_header(seg, f.read(segment.HEADER_SIZE))
