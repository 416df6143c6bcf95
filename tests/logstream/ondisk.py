"""Small series on disk for the tests, and where their records lie."""

from __future__ import annotations

from pathlib import Path

from logstream import Writer
from logstream.scan import SegmentScan
from logstream.segment import parse_segment_name
from logstream.series import SegmentFile, list_segments

T0 = 1_700_000_000_000_000_000  # a fixed "now" so orders and names are reproducible


def write_series(
    directory: Path,
    writer: str,
    count: int,
    *,
    segment_size: int = 1 << 20,
    start_ts: int = T0,
    step: int = 10,
) -> list[int]:
    """Append `count` records stamped start_ts, start_ts+step, ... and close; return the LSNs."""
    with Writer.open(directory, writer, segment_size=segment_size) as w:
        first = w.appended_lsn + 1
        return [
            w.append(body_for(writer, first + i), timestamp=start_ts + i * step)
            for i in range(count)
        ]


def body_for(writer: str, lsn: int) -> dict[str, object]:
    """The body `write_series` gives a record, so tests can predict it."""
    return {"writer": writer, "lsn": lsn, "pad": "p" * (lsn % 7)}


def _scan(path: Path) -> SegmentScan:
    parsed = parse_segment_name(path.name)
    assert parsed is not None
    return SegmentScan(SegmentFile(path, *parsed), last=True)


def record_offsets(path: Path) -> list[int]:
    """File offsets of the records in one undamaged segment."""
    scan = _scan(path)
    return [scan.frame_offset for _ in scan]


def data_end(path: Path) -> int:
    """Where the records of one undamaged segment end (any zeros after them not counted)."""
    scan = _scan(path)
    for _ in scan:
        pass
    return scan.end_offset


def segments(directory: Path, writer: str) -> list[Path]:
    """The segment files of one writer, oldest first."""
    return [s.path for s in list_segments(directory, writer)]
