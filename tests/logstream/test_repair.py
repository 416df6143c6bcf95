"""Torn tails are cut (with a copy kept); corruption is refused, naming file and offset."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from logstream import CorruptLog, Damage, TornTail, Writer, read, record, tail_positions
from logstream.scan import CHUNK

from .ondisk import body_for, record_offsets, segments, write_series

COUNT = 4
SEGMENT = 4096


@pytest.fixture
def series(tmp_path: Path) -> tuple[Path, bytes, list[int]]:
    """A one-segment series of COUNT records: its path, its pristine bytes, record offsets."""
    write_series(tmp_path, "alpha", COUNT, segment_size=SEGMENT)
    [path] = segments(tmp_path, "alpha")
    return path, path.read_bytes(), record_offsets(path)


def reset(path: Path, data: bytes) -> None:
    """Put `data` back as the segment and drop any broken copies from a previous round."""
    for old in path.parent.glob(path.name + ".broken-*"):
        old.unlink()
    path.write_bytes(data)


def assert_intact_through(directory: Path, last_lsn: int) -> None:
    """The series reads back exactly records 1..last_lsn with their original bodies."""
    records = list(read(directory))
    assert [r.lsn for r in records] == list(range(1, last_lsn + 1))
    assert all(r.body == body_for("alpha", r.lsn) for r in records)


def test_a_tail_torn_at_every_byte_is_cut_and_appends_continue(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """Truncating inside the last record at any byte loses only that record, keeping a copy."""
    path, pristine, offsets = series
    last = offsets[-1]
    for size in range(last + 1, len(pristine)):
        reset(path, pristine[:size])
        with Writer.open(path.parent, "alpha", segment_size=SEGMENT) as w:
            repair = w.repair
            assert repair is not None, size
            assert (repair.path, repair.offset, repair.bytes_cut) == (path, last, size - last)
            assert repair.reason is Damage.SHORT_RECORD
            assert repair.copy == path.with_name(f"{path.name}.broken-{last}")
            # Zeros ending the torn bytes cannot be told from preallocated space.
            assert repair.copy.read_bytes() == pristine[last:size].rstrip(b"\0")
            assert path.stat().st_size == SEGMENT  # cut, then preallocated again
            assert w.append(body_for("alpha", COUNT), timestamp=2**62) == COUNT
        assert path.stat().st_size == len(pristine)
        assert_intact_through(path.parent, COUNT)


def test_a_reader_stops_before_an_unrepaired_torn_tail(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """Without repair, a reader ends at the last good record, whatever byte the tail tore at."""
    path, pristine, offsets = series
    for size in range(offsets[-1], len(pristine)):
        path.write_bytes(pristine[:size])
        assert_intact_through(path.parent, COUNT - 1)
        assert tail_positions(path.parent) == {"alpha": COUNT - 1}


def test_a_cut_exactly_between_records_is_no_damage(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """A file ending on a record boundary opens without repair."""
    path, pristine, offsets = series
    path.write_bytes(pristine[: offsets[-1]])
    with Writer.open(path.parent, "alpha") as w:
        assert w.repair is None and w.appended_lsn == COUNT - 1


def test_a_bit_flip_anywhere_in_the_last_record_is_cut(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """A damaged last record is treated as torn: cut, copied, and earlier records kept."""
    path, pristine, offsets = series
    last = offsets[-1]
    for at in range(last, len(pristine)):
        damaged = bytearray(pristine)
        damaged[at] ^= 1 << (at % 8)
        reset(path, bytes(damaged))
        with Writer.open(path.parent, "alpha") as w:
            assert w.repair is not None and w.repair.offset == last, at
            assert w.repair.reason in (
                Damage.BAD_MAGIC, Damage.BAD_CRC, Damage.BAD_LENGTH, Damage.SHORT_RECORD,
            )
            assert w.repair.copy.read_bytes() == bytes(damaged[last:])
        assert_intact_through(path.parent, COUNT - 1)


def test_a_bit_flip_in_an_earlier_record_is_corruption(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """Damage followed by good records raises CorruptLog naming file and offset; nothing is cut."""
    path, pristine, offsets = series
    second, third = offsets[1], offsets[2]
    for at in range(second, third):
        damaged = bytearray(pristine)
        damaged[at] ^= 1 << (at % 8)
        path.write_bytes(bytes(damaged))
        with pytest.raises(CorruptLog) as caught:
            Writer.open(path.parent, "alpha")
        assert (caught.value.path, caught.value.offset) == (str(path), second), at
        assert f"offset {second}" in str(caught.value)
        assert path.read_bytes() == bytes(damaged)
        assert not list(path.parent.glob("*.broken-*"))
        with pytest.raises(CorruptLog) as caught:
            list(read(path.parent))
        assert caught.value.offset == second


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (random.Random(1).randbytes(5000), Damage.BAD_MAGIC),
        (record.encode(COUNT + 1, 2**62, "unlucky")[:-1] + b"?", Damage.BAD_CRC),
        (b"\xc1LO", Damage.SHORT_RECORD),
        (b"\xc1LOG" + b"\0" * 3000, Damage.BAD_CRC),
        (record.encode(COUNT + 1, 2**62, "x" * 100)[:50] + b"\0" * 3000, Damage.BAD_CRC),
        (b"\0" * (CHUNK + 10) + b"\1", Damage.BAD_MAGIC),
    ],
    ids=["garbage", "record-with-bad-crc", "part-of-a-magic", "a-magic-then-zeros",
         "half-a-record-then-zeros", "zeros-then-a-byte-a-chunk-away"],
)
def test_bytes_after_the_last_record_are_cut(
    series: tuple[Path, bytes, list[int]], tail: bytes, reason: Damage
) -> None:
    """Garbage, or a record torn in preallocated space, after the last record is a torn tail."""
    path, pristine, _ = series
    path.write_bytes(pristine + tail)
    with Writer.open(path.parent, "alpha") as w:
        assert w.repair is not None
        assert (w.repair.offset, w.repair.bytes_cut, w.repair.reason) == (
            len(pristine), len(tail), reason,
        )
        assert w.repair.copy.read_bytes() == tail.rstrip(b"\0")
        assert w.append("next") == COUNT + 1
    assert path.stat().st_size > len(pristine)


@pytest.mark.parametrize("zeros", [1, 4096, 3 * CHUNK + 5], ids=["a-byte", "a-page", "chunks"])
def test_zeros_after_the_last_record_are_a_clean_end(
    series: tuple[Path, bytes, list[int]], zeros: int
) -> None:
    """Only zeros after the last record (preallocated space) open with no repair."""
    path, pristine, _ = series
    path.write_bytes(pristine + bytes(zeros))
    with Writer.open(path.parent, "alpha") as w:
        assert w.repair is None and w.appended_lsn == COUNT
        assert w.append("next") == COUNT + 1
    assert record_offsets(path)[-1] == len(pristine)
    assert not list(path.parent.glob("*.broken-*"))


def test_an_old_record_image_after_the_tail_does_not_count_as_a_follower(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """A good record with an older LSN inside the garbage (say, a copied body) is still torn."""
    path, pristine, offsets = series
    path.write_bytes(pristine + b"junk" + pristine[offsets[0] : offsets[1]])
    with Writer.open(path.parent, "alpha") as w:
        assert w.repair is not None and w.repair.offset == len(pristine)


def test_garbage_followed_by_the_next_record_is_corruption(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """Bad bytes with a good next-LSN record after them are corruption, not a torn tail."""
    path, pristine, _ = series
    path.write_bytes(pristine + b"junk" + record.encode(COUNT + 1, 2**62, "later"))
    with pytest.raises(CorruptLog) as caught:
        Writer.open(path.parent, "alpha")
    assert caught.value.offset == len(pristine) and caught.value.reason is Damage.BAD_MAGIC


def test_a_good_record_with_the_wrong_lsn_is_corruption(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """A record whose CRC is good but whose LSN skips ahead raises CorruptLog."""
    path, pristine, _ = series
    path.write_bytes(pristine + record.encode(COUNT + 2, 2**62, "skipped one"))
    with pytest.raises(CorruptLog) as caught:
        Writer.open(path.parent, "alpha")
    assert caught.value.reason is Damage.LSN_MISMATCH and caught.value.offset == len(pristine)


def test_a_good_crc_over_a_bad_body_is_corruption(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """A body that is not msgpack (a writer bug, not a torn write) raises CorruptLog on reading."""
    path, pristine, _ = series
    path.write_bytes(pristine + record.encode_packed(COUNT + 1, 2**62, b"\xc1"))
    with pytest.raises(CorruptLog) as caught:
        list(read(path.parent))
    assert caught.value.reason is Damage.BAD_BODY and caught.value.offset == len(pristine)


def test_without_repair_a_torn_tail_is_raised(series: tuple[Path, bytes, list[int]]) -> None:
    """Writer.open(repair=False) raises TornTail naming file and offset, and changes nothing."""
    path, pristine, offsets = series
    path.write_bytes(pristine[:-1])
    with pytest.raises(TornTail) as caught:
        Writer.open(path.parent, "alpha", repair=False)
    assert (caught.value.path, caught.value.offset) == (str(path), offsets[-1])
    assert path.read_bytes() == pristine[:-1]


def test_a_second_repair_at_the_same_offset_keeps_both_copies(
    series: tuple[Path, bytes, list[int]],
) -> None:
    """Repairing the same offset twice keeps the earlier broken copy too."""
    path, pristine, offsets = series
    for _ in range(2):
        path.write_bytes(pristine[:-1])
        Writer.open(path.parent, "alpha").close()
    copies = sorted(p.name for p in path.parent.glob("*.broken-*"))
    assert copies == [f"{path.name}.broken-{offsets[-1]}", f"{path.name}.broken-{offsets[-1]}.1"]


def test_a_torn_tail_in_an_earlier_segment_is_corruption(tmp_path: Path) -> None:
    """Sealed segments were fsynced whole, so a short one is corruption for readers."""
    write_series(tmp_path, "alpha", 100, segment_size=4096)
    first = segments(tmp_path, "alpha")[0]
    size = first.stat().st_size
    os.truncate(first, size - 1)
    with pytest.raises(CorruptLog) as caught:
        list(read(tmp_path))
    assert caught.value.path == str(first) and "not the last" in str(caught.value)


def test_zeros_ending_an_earlier_segment_are_a_clean_end(tmp_path: Path) -> None:
    """A sealed segment still ending in its preallocated zeros reads whole, with verify too."""
    write_series(tmp_path, "alpha", 100, segment_size=4096)
    first = segments(tmp_path, "alpha")[0]
    with open(first, "ab") as f:
        f.write(bytes(1000))
    assert [r.lsn for r in read(tmp_path)] == list(range(1, 101))
    Writer.open(tmp_path, "alpha", segment_size=4096, verify=True).close()


def test_records_lost_to_zeros_in_an_earlier_segment_are_a_gap(tmp_path: Path) -> None:
    """Zeros over an earlier segment's last record end it early: the next segment is a gap."""
    write_series(tmp_path, "alpha", 100, segment_size=4096)
    first, second = segments(tmp_path, "alpha")[:2]
    data, last = first.read_bytes(), record_offsets(first)[-1]
    first.write_bytes(data[:last] + bytes(len(data) - last))
    with pytest.raises(CorruptLog) as caught:
        list(read(tmp_path))
    assert caught.value.path == str(second) and caught.value.reason is Damage.LSN_GAP
    with pytest.raises(CorruptLog) as caught:
        Writer.open(tmp_path, "alpha", segment_size=4096, verify=True)
    assert caught.value.path == str(second) and caught.value.reason is Damage.LSN_GAP


def test_a_missing_middle_segment_is_a_gap(tmp_path: Path) -> None:
    """A series with a segment deleted from its middle raises CorruptLog (lsn-gap)."""
    write_series(tmp_path, "alpha", 200, segment_size=4096)
    files = segments(tmp_path, "alpha")
    files[1].unlink()
    with pytest.raises(CorruptLog) as caught:
        list(read(tmp_path))
    assert caught.value.path == str(files[2]) and caught.value.reason is Damage.LSN_GAP
