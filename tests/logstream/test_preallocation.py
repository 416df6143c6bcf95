"""Preallocated segments: appends fill reserved space, sealing cuts it off, a crash leaves zeros."""

from __future__ import annotations

import shutil
from pathlib import Path

from logstream import Damage, Writer, read, record, tail_positions
from logstream.segment import encode_header

from .ondisk import T0, body_for, data_end, record_offsets, segments

SEGMENT = 64 * 1024


def crashed_copy(directory: Path, into: Path) -> Path:
    """The files of a live writer as they are now: what it leaves if it is killed now."""
    shutil.copytree(directory, into)
    return into


def append_bodies(w: Writer, lsns: range) -> None:
    for lsn in lsns:
        assert w.append(body_for("alpha", lsn), timestamp=T0 + lsn) == lsn


def test_a_crashed_writer_leaves_zeros_that_reopen_cleanly(tmp_path: Path) -> None:
    """A writer killed after a flush leaves a zero tail; reopening repairs nothing and goes on."""
    with Writer.open(tmp_path / "live", "alpha", segment_size=SEGMENT) as w:
        append_bodies(w, range(1, 11))
        w.flush()
        crashed = crashed_copy(tmp_path / "live", tmp_path / "crashed")
    [path] = segments(crashed, "alpha")
    end = data_end(path)
    assert path.read_bytes()[end:] == bytes(SEGMENT - end)
    with Writer.open(crashed, "alpha", segment_size=SEGMENT) as again:
        assert again.repair is None
        assert (again.appended_lsn, again.durable_lsn) == (10, 10)
        append_bodies(again, range(11, 12))
    assert record_offsets(path)[-1] == end
    assert [r.body for r in read(crashed)] == [body_for("alpha", n) for n in range(1, 12)]
    assert not list(crashed.glob("*.broken-*"))


def test_a_record_torn_in_preallocated_space_is_cut_keeping_only_its_bytes(
    tmp_path: Path,
) -> None:
    """Half a record then zeros is a torn tail; the copy holds the half record, not the zeros."""
    with Writer.open(tmp_path / "live", "alpha", segment_size=SEGMENT) as w:
        append_bodies(w, range(1, 4))
        crashed = crashed_copy(tmp_path / "live", tmp_path / "crashed")
    [path] = segments(crashed, "alpha")
    end = data_end(path)
    half = record.encode(4, T0 + 4, "x" * 100)[:50]
    with open(path, "r+b") as f:
        f.seek(end)
        f.write(half)
    with Writer.open(crashed, "alpha", segment_size=SEGMENT) as again:
        repair = again.repair
        assert repair is not None
        assert (repair.offset, repair.bytes_cut, repair.reason) == (
            end, SEGMENT - end, Damage.BAD_CRC,
        )
        assert repair.copy.read_bytes() == half
        assert path.stat().st_size == SEGMENT  # preallocated again after the cut
        append_bodies(again, range(4, 5))
    assert [r.lsn for r in read(crashed)] == [1, 2, 3, 4]


def test_sealed_segments_end_with_their_last_record(tmp_path: Path) -> None:
    """Rotation cuts the full segment back to its records; only the active one is preallocated."""
    with Writer.open(tmp_path, "alpha", segment_size=4096) as w:
        while w.stats().segments_created < 4:
            w.append("x" * 300)
        *sealed, active = segments(tmp_path, "alpha")
        assert len(sealed) == 3
        assert [p.stat().st_size for p in sealed] == [data_end(p) for p in sealed]
        assert active.stat().st_size == 4096


def test_a_clean_close_leaves_exactly_the_header_and_records(tmp_path: Path) -> None:
    """Closing cuts off the unused space: the file is byte for byte its header and records."""
    bodies = ["one", {"two": 2}, b"three", 0]
    path = tmp_path / "alpha.00000000000000000001.seg"
    with Writer.open(tmp_path, "alpha", segment_size=SEGMENT) as w:
        for i, body in enumerate(bodies):
            w.append(body, timestamp=T0 + i)
        assert path.stat().st_size == SEGMENT
    frames = [record.encode(i + 1, T0 + i, body) for i, body in enumerate(bodies)]
    assert path.read_bytes() == encode_header("alpha", 1) + b"".join(frames)
    with Writer.open(tmp_path, "alpha", segment_size=SEGMENT):
        assert path.stat().st_size == SEGMENT  # reopened: preallocated again
    assert path.stat().st_size == data_end(path)


def test_a_reader_of_a_live_series_sees_exactly_what_was_appended(tmp_path: Path) -> None:
    """While a writer appends (and rotates), each read yields every record so far, no more."""
    with Writer.open(tmp_path, "alpha", segment_size=4096) as w:
        for lsn in range(1, 201):
            append_bodies(w, range(lsn, lsn + 1))
            assert [r.body for r in read(tmp_path)] == [
                body_for("alpha", n) for n in range(1, lsn + 1)
            ]
            assert tail_positions(tmp_path) == {"alpha": lsn}
        assert len(segments(tmp_path, "alpha")) > 2


def test_a_reader_stops_before_a_record_it_sees_half_written(tmp_path: Path) -> None:
    """A record caught half way through its pwrite ends the read, without an error."""
    with Writer.open(tmp_path, "alpha", segment_size=SEGMENT) as w:
        append_bodies(w, range(1, 4))
        [path] = segments(tmp_path, "alpha")
        frame = record.encode(4, T0 + 4, body_for("alpha", 4))
        with open(path, "r+b") as f:  # the first half of the writer's next pwrite
            f.seek(data_end(path))
            f.write(frame[: len(frame) // 2])
        assert [r.lsn for r in read(tmp_path)] == [1, 2, 3]
        assert tail_positions(tmp_path) == {"alpha": 3}
        append_bodies(w, range(4, 5))  # the pwrite completes
        assert [r.lsn for r in read(tmp_path)] == [1, 2, 3, 4]
