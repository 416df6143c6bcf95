"""Opening, appending, flushing, rotating and closing one writer."""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import time
from pathlib import Path

import msgpack
import pytest

import logstream
from logstream import CorruptLog, Damage, LogstreamError, Writer, WriterBusy, read, record
from logstream.segment import HEADER_SIZE, segment_name

from .ondisk import T0, segments, write_series


def test_lsns_start_at_one_and_go_up_by_one(tmp_path: Path) -> None:
    """A new series numbers its records 1, 2, 3, ..."""
    with Writer.open(tmp_path, "alpha") as w:
        assert [w.append(i) for i in range(5)] == [1, 2, 3, 4, 5]
        assert w.appended_lsn == 5


def test_reopening_continues_after_the_last_record(tmp_path: Path) -> None:
    """LSNs continue after the last record already on disk."""
    write_series(tmp_path, "alpha", 4)
    with Writer.open(tmp_path, "alpha") as w:
        assert (w.appended_lsn, w.durable_lsn) == (4, 4)
        assert w.append("more") == 5
    assert [r.lsn for r in read(tmp_path)] == [1, 2, 3, 4, 5]


def test_the_directory_is_created_with_its_parents(tmp_path: Path) -> None:
    """Opening a writer in a missing nested directory creates it."""
    where = tmp_path / "a" / "b" / "log"
    with Writer.open(where, "alpha") as w:
        w.append(1)
    assert segments(where, "alpha") == [where / segment_name("alpha", 1)]


def test_append_writes_without_fsync_and_flush_fsyncs_once(
    tmp_path: Path, fsync_counter: list[int]
) -> None:
    """Appends only write; one flush makes them all durable with one fsync."""
    with Writer.open(tmp_path, "alpha") as w:
        before = len(fsync_counter)
        for i in range(10):
            w.append(i)
        assert len(fsync_counter) == before and w.durable_lsn == 0
        assert w.flush() == 10
        assert len(fsync_counter) == before + 1
        assert w.stats().group_commits == 1


def test_a_flush_that_is_already_durable_returns_at_once(
    tmp_path: Path, fsync_counter: list[int]
) -> None:
    """Flushing an LSN that is already durable makes no system call."""
    with Writer.open(tmp_path, "alpha") as w:
        lsn = w.append("x")
        w.flush()
        before = len(fsync_counter)
        assert w.flush(lsn) == lsn
        assert w.flush() == lsn
        assert len(fsync_counter) == before


def test_flush_upto_covers_at_least_that_lsn(tmp_path: Path) -> None:
    """flush(upto) returns a durable LSN at or above `upto`."""
    with Writer.open(tmp_path, "alpha") as w:
        for i in range(3):
            w.append(i)
        assert w.flush(2) >= 2


def test_flushing_an_lsn_never_appended_is_refused(tmp_path: Path) -> None:
    """flush(upto) beyond the appended LSN raises ValueError."""
    with Writer.open(tmp_path, "alpha") as w:
        w.append(1)
        with pytest.raises(ValueError):
            w.flush(2)


def test_a_second_writer_for_the_same_series_is_refused(tmp_path: Path) -> None:
    """The series lock refuses a second open writer until the first closes."""
    first = Writer.open(tmp_path, "alpha")
    with pytest.raises(WriterBusy):
        Writer.open(tmp_path, "alpha")
    first.close()
    Writer.open(tmp_path, "alpha").close()


def test_two_writers_share_a_directory(tmp_path: Path) -> None:
    """Different writer ids in one directory have separate series."""
    with Writer.open(tmp_path, "alpha") as a, Writer.open(tmp_path, "beta") as b:
        assert (a.append(1), b.append(1), a.append(2)) == (1, 1, 2)
    assert logstream.tail_positions(tmp_path) == {"alpha": 2, "beta": 1}


@pytest.mark.parametrize("size", [0, 64, 4095])
def test_tiny_segment_sizes_are_refused(tmp_path: Path, size: int) -> None:
    """A segment size below the minimum is a configuration mistake."""
    with pytest.raises(ValueError):
        Writer.open(tmp_path, "alpha", segment_size=size)


def test_bad_writer_ids_are_refused(tmp_path: Path) -> None:
    """Writer.open validates the writer id before touching the directory."""
    with pytest.raises(ValueError):
        Writer.open(tmp_path / "never", "no/slashes")
    assert not (tmp_path / "never").exists()


def test_timestamps_never_go_backwards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the clock steps back, the writer repeats the last timestamp."""
    clock = iter([T0 + 100, T0 + 50, T0 + 200])
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    with Writer.open(tmp_path, "alpha") as w:
        for i in range(3):
            w.append(i)
    assert [r.timestamp for r in read(tmp_path)] == [T0 + 100, T0 + 100, T0 + 200]


def test_an_explicit_timestamp_below_the_last_is_refused(tmp_path: Path) -> None:
    """Explicit timestamps must not decrease, even across a reopen."""
    write_series(tmp_path, "alpha", 2, start_ts=T0)
    with Writer.open(tmp_path, "alpha") as w:
        with pytest.raises(ValueError):
            w.append("late", timestamp=T0)
        assert w.append("same", timestamp=T0 + 10) == 3
        for bad in (-1, 2**64, 1.5, True):
            with pytest.raises(ValueError):
                w.append("bad", timestamp=bad)  # type: ignore[arg-type]


def test_a_body_msgpack_cannot_pack_writes_nothing(tmp_path: Path) -> None:
    """An unpackable body raises TypeError and leaves the series unchanged."""
    with Writer.open(tmp_path, "alpha") as w:
        w.append(1)
        with pytest.raises(TypeError):
            w.append({"x": object()})
        with pytest.raises(ValueError):
            w.append(2**64)
        assert w.append(2) == 2
    assert [r.body for r in read(tmp_path)] == [1, 2]


def test_a_batch_is_its_records_in_order_with_one_write(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """append_batch gives the records consecutive LSNs and writes them all at once."""
    writes = []
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda *a: writes.append(1) or real(*a))
    with Writer.open(tmp_path, "alpha") as w:
        w.append("first")
        writes.clear()
        assert w.append_batch([{"n": i} for i in range(50)]) == 51
        assert w.append_batch([]) == 51
        assert len(writes) == 1 and w.stats().records == 51
    assert [(r.lsn, r.body) for r in read(tmp_path)][1:] == [
        (i + 2, {"n": i}) for i in range(50)]


def test_a_batch_past_the_segment_end_rotates_between_two_records(tmp_path: Path) -> None:
    """A batch that does not fit what is left of the segment is written record by record."""
    with Writer.open(tmp_path, "alpha", segment_size=4096) as w:
        assert w.append_batch([b"x" * 900 for _ in range(10)]) == 10
    assert len(segments(tmp_path, "alpha")) >= 3
    assert [r.lsn for r in read(tmp_path)] == list(range(1, 11))


def test_a_batch_with_a_body_msgpack_cannot_pack_writes_nothing(tmp_path: Path) -> None:
    """One unpackable body refuses the whole batch before anything is written."""
    with Writer.open(tmp_path, "alpha") as w:
        with pytest.raises(TypeError):
            w.append_batch([1, {"x": object()}, 3])
        assert w.append_batch([1, 2]) == 2
    assert [r.body for r in read(tmp_path)] == [1, 2]


def test_appending_after_close_is_refused(tmp_path: Path) -> None:
    """A closed writer raises LogstreamError on append."""
    w = Writer.open(tmp_path, "alpha")
    w.close()
    with pytest.raises(LogstreamError):
        w.append(1)


def test_close_makes_appends_durable(tmp_path: Path) -> None:
    """Closing a healthy writer flushes what was appended."""
    w = Writer.open(tmp_path, "alpha")
    w.append(1)
    w.close()
    assert w.durable_lsn == 1


def test_segments_rotate_at_the_configured_size(tmp_path: Path) -> None:
    """With a small segment size the series spans files named by their first LSN."""
    write_series(tmp_path, "alpha", 200, segment_size=4096)
    files = segments(tmp_path, "alpha")
    assert len(files) >= 3
    firsts = [int(p.name.split(".")[1]) for p in files]
    assert firsts[0] == 1 and firsts == sorted(firsts)
    assert all(p.stat().st_size <= 4096 for p in files)
    assert [r.lsn for r in read(tmp_path)] == list(range(1, 201))


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    """A record bigger than segment_size is written alone in its own segment."""
    with Writer.open(tmp_path, "alpha", segment_size=4096) as w:
        w.append("small")
        w.append(b"B" * 10_000)
        w.append("small again")
    sizes = [p.stat().st_size for p in segments(tmp_path, "alpha")]
    assert len(sizes) == 3 and sizes[1] > 10_000
    assert [r.lsn for r in read(tmp_path)] == [1, 2, 3]


def test_a_packed_append_writes_the_bytes_an_ordinary_one_does(tmp_path: Path) -> None:
    """Appended packed as parts (written around its binaries), a series has the same
    bytes; a packed body over MAX_BODY is refused."""
    block = bytes(range(256)) * 1024
    bodies = [{"e": [["B", n, 8 * n, memoryview(block)[n:]], ["P", n]]} for n in range(6)]
    for large in (False, True):
        with Writer.open(tmp_path / str(large), "alpha", segment_size=600_000) as w:
            for n, body in enumerate(bodies):
                if large:
                    packed = msgpack.packb(body, use_bin_type=True)
                    parts = [packed[:20], memoryview(packed)[20:-5], packed[-5:]]
                    assert w.append_packed(parts, timestamp=T0 + n) == n + 1
                else:
                    assert w.append(body, timestamp=T0 + n) == n + 1
            with pytest.raises(ValueError):
                w.append_packed([bytes(record.MAX_BODY), b"x"])
    files = {large: [p.read_bytes() for p in segments(tmp_path / str(large), "alpha")]
             for large in (False, True)}
    assert len(files[True]) == 3 and files[True] == files[False]
    assert [r.body["e"][0][3] for r in read(tmp_path / "True")] == [block[n:] for n in range(6)]


def test_rotation_makes_the_sealed_segment_durable(tmp_path: Path) -> None:
    """Rotation fsyncs the full segment, so the durable LSN moves without a flush."""
    with Writer.open(tmp_path, "alpha", segment_size=4096) as w:
        while w.stats().segments_created < 2:
            w.append("x" * 100)
        assert w.durable_lsn == w.appended_lsn - 1


def test_an_fsync_under_way_keeps_its_descriptor_through_a_rotation(tmp_path: Path) -> None:
    """A flush fsyncs the active fd outside the lock: a rotation meanwhile retires it
    rather than close it (its number could be reused for another file), and the
    flush closes it when done; an fd no flush holds closes at once."""
    with Writer.open(tmp_path, "alpha", segment_size=4096) as w:
        w.append("x")
        with w._lock:
            fd = w._borrow()  # as _sync_once does before its fdatasync
        while w.stats().segments_created < 2:
            w.append("x" * 100)
        first = segments(tmp_path, "alpha")[0]
        assert os.fstat(fd).st_ino == first.stat().st_ino  # open, and still the old segment
        w._give_back(fd)
        with pytest.raises(OSError):
            os.fstat(fd)
        active = w._fd
        while w.stats().segments_created < 3:
            w.append("x" * 100)
        with pytest.raises(OSError):
            os.fstat(active)
        assert w.flush() == w.appended_lsn
    assert [r.lsn for r in read(tmp_path)] == list(range(1, w.appended_lsn + 1))


def test_stale_temp_files_are_removed_on_open(tmp_path: Path) -> None:
    """A .tmp left by a crash during rotation is removed; other writers' are not."""
    write_series(tmp_path, "alpha", 1)
    mine = tmp_path / (segment_name("alpha", 2) + ".tmp")
    theirs = tmp_path / (segment_name("beta", 2) + ".tmp")
    mine.write_bytes(b"half a header")
    theirs.write_bytes(b"half a header")
    Writer.open(tmp_path, "alpha").close()
    assert not mine.exists() and theirs.exists()


def test_an_empty_last_segment_continues_the_timestamps_before_it(tmp_path: Path) -> None:
    """If the last segment holds no record, timestamps continue from the previous one."""
    write_series(tmp_path, "alpha", 100, segment_size=4096, start_ts=T0)
    last = segments(tmp_path, "alpha")[-1]
    first_lsn = int(last.name.split(".")[1])
    os.truncate(last, HEADER_SIZE)
    with Writer.open(tmp_path, "alpha", segment_size=4096) as w:
        assert w.appended_lsn == first_lsn - 1
        with pytest.raises(ValueError):
            w.append("early", timestamp=T0)
        assert w.append("on time", timestamp=T0 + 10 * 99) == first_lsn


def test_verify_scans_earlier_segments_too(tmp_path: Path) -> None:
    """Open with verify=True finds damage in a segment that is not the last."""
    write_series(tmp_path, "alpha", 100, segment_size=4096)
    first = segments(tmp_path, "alpha")[0]
    os.truncate(first, first.stat().st_size - 3)
    Writer.open(tmp_path, "alpha").close()  # only the last segment is scanned by default
    with pytest.raises(CorruptLog) as caught:
        Writer.open(tmp_path, "alpha", verify=True)
    assert caught.value.path == str(first) and caught.value.reason is Damage.SHORT_RECORD


def test_stats_count_what_happened(tmp_path: Path) -> None:
    """stats() reports LSNs, records, bytes, fsyncs, flushes and segments."""
    with Writer.open(tmp_path, "alpha") as w:
        w.append(b"x" * 10)
        w.flush()
        s = w.stats()
    assert (s.appended_lsn, s.durable_lsn, s.records, s.flushes, s.group_commits) == (1, 1, 1, 1, 1)
    assert s.bytes_written == 28 + 12 and s.segments_created == 1 and not s.failed
    # The new segment file, its directory entry, its preallocation, the flush.
    assert s.fsyncs == 4


def test_bytes_after_counts_the_records_a_reader_from_there_goes_through(tmp_path: Path) -> None:
    """bytes_after is exact at segment boundaries, within a segment of the truth
    elsewhere, and counts the records of the active, preallocated segment, not its
    zeros; a writer reopened after a crash (its last segment still preallocated)
    counts the same."""
    sizes = [0]
    with Writer.open(tmp_path / "live", "alpha", segment_size=4096) as w:
        for i in range(200):
            w.append("x" * (i % 50))
            sizes.append(w.stats().bytes_written)
        total = sizes[-1]
        assert w.bytes_after(0) == total and w.bytes_after(200) == 0
        firsts = [int(p.name.split(".")[1]) for p in segments(tmp_path / "live", "alpha")]
        for first in firsts:
            assert w.bytes_after(first - 1) == total - sizes[first - 1]
        for lsn in range(0, 201, 7):
            assert abs(w.bytes_after(lsn) - (total - sizes[lsn])) <= 4096
        w.flush()
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    with Writer.open(tmp_path / "crashed", "alpha", segment_size=4096) as again:
        assert again.bytes_after(firsts[-1] - 1) == total - sizes[firsts[-1] - 1]


def test_stats_survive_pickle_and_copy(tmp_path: Path) -> None:
    """A snapshot of the counters is a value: pickled or copied, it stays equal."""
    with Writer.open(tmp_path, "alpha") as w:
        w.append(1)
        stats = w.stats()
    for again in (pickle.loads(pickle.dumps(stats)), copy.copy(stats), copy.deepcopy(stats)):
        assert again == stats and again.records == 1
