"""Finding the segments of each writer in a logstream directory.

A listing is a snapshot: a writer may rotate or trim while we look. Everything
built on it is safe with that because segments only ever appear after the last
one or disappear from the front of a series.
"""

from __future__ import annotations

import dataclasses
import os
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
