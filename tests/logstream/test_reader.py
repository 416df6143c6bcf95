"""Reading: merging writers, start positions, cuts, timestamps, streaming."""

from __future__ import annotations

import builtins
import tempfile
from pathlib import Path
from typing import Self

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstream import Record, Trimmed, Writer, read, record, tail_positions, trim
from logstream import scan as scan_module

from .ondisk import T0, body_for, segments, write_series
from .test_record import bodies


def order(r: Record) -> tuple[int, str, int]:
    return (r.timestamp, r.writer, r.lsn)


@pytest.fixture
def two_writers(tmp_path: Path) -> Path:
    """alpha and beta, interleaved in time with some timestamps tied across writers."""
    write_series(tmp_path, "beta", 150, start_ts=T0, step=10, segment_size=4096)
    write_series(tmp_path, "alpha", 200, start_ts=T0 + 5, step=5, segment_size=4096)
    return tmp_path


def test_two_writers_merge_by_timestamp_writer_lsn(two_writers: Path) -> None:
    """Records of both writers come out ordered by (timestamp, writer, lsn), ties included."""
    records = list(read(two_writers))
    assert len(records) == 350
    assert records == sorted(records, key=order)
    assert any(a.timestamp == b.timestamp for a, b in zip(records, records[1:], strict=False))
    assert all(r.body == body_for(r.writer, r.lsn) for r in records)


def test_start_positions_are_inclusive_per_writer(two_writers: Path) -> None:
    """A start LSN is the first yielded for its writer; other writers start at the beginning."""
    records = list(read(two_writers, start={"alpha": 25}))
    assert [r.lsn for r in records if r.writer == "alpha"] == list(range(25, 201))
    assert [r.lsn for r in records if r.writer == "beta"] == list(range(1, 151))
    assert records == sorted(records, key=order)


def test_a_cut_stops_each_writer_and_leaves_out_absent_ones(two_writers: Path) -> None:
    """A cut's LSN is the last yielded for its writer; writers not in the cut yield nothing."""
    records = list(read(two_writers, cut={"alpha": 7}))
    assert [(r.writer, r.lsn) for r in records] == [("alpha", n) for n in range(1, 8)]


def test_start_and_cut_together_read_a_window(two_writers: Path) -> None:
    """start and cut bound a window of each series."""
    records = list(read(two_writers, start={"alpha": 3, "beta": 10}, cut={"alpha": 5, "beta": 11}))
    assert sorted((r.writer, r.lsn) for r in records) == [
        ("alpha", 3), ("alpha", 4), ("alpha", 5), ("beta", 10), ("beta", 11),
    ]


def test_a_series_the_start_already_covers_to_its_cut_is_not_opened(two_writers: Path) -> None:
    """A start past a writer's cut (a base covering a group's long dead series) reads
    nothing of it, and does not even open its files: a takeover in a group with
    many series reads only those it needs."""
    opened = []
    real_open = builtins.open

    def watching(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    builtins.open = watching
    try:
        records = list(read(two_writers, start={"alpha": 8, "beta": 3},
                            cut={"alpha": 7, "beta": 4}))
    finally:
        builtins.open = real_open
    assert [(r.writer, r.lsn) for r in records] == [("beta", 3), ("beta", 4)]
    assert opened and not any("alpha" in p for p in opened)

def test_a_cut_beyond_the_tail_just_ends_the_series(two_writers: Path) -> None:
    """A cut LSN past the last record yields the whole series."""
    assert len(list(read(two_writers, cut={"alpha": 10**6, "beta": 10**6}))) == 350


def test_since_yields_records_stamped_at_or_after_it(two_writers: Path) -> None:
    """since filters by timestamp, inclusively, across writers."""
    records = list(read(two_writers, since=T0 + 100))
    assert records and all(r.timestamp >= T0 + 100 for r in records)
    assert len(records) == sum(1 for r in read(two_writers) if r.timestamp >= T0 + 100)


def test_tail_positions_name_each_writers_last_lsn(two_writers: Path) -> None:
    """tail_positions maps each writer to the LSN of its last record."""
    assert tail_positions(two_writers) == {"alpha": 200, "beta": 150}


def test_a_writer_with_no_records_is_at_zero(tmp_path: Path) -> None:
    """A series that was opened but never written has tail position 0."""
    Writer.open(tmp_path, "idle").close()
    assert tail_positions(tmp_path) == {"idle": 0}
    assert list(read(tmp_path)) == []


def test_a_cut_from_tail_positions_ignores_later_appends(tmp_path: Path) -> None:
    """Reading up to a cut taken earlier excludes what live writers appended since."""
    with Writer.open(tmp_path, "alpha") as w:
        for i in range(5):
            w.append(i)
        cut = tail_positions(tmp_path)
        for i in range(5):
            w.append(i)
        Writer.open(tmp_path, "late").close()
        assert [r.lsn for r in read(tmp_path, cut=cut)] == [1, 2, 3, 4, 5]


def test_starting_before_trimmed_records_is_refused(tmp_path: Path) -> None:
    """Asking for records that trim deleted raises Trimmed rather than silently skipping them."""
    write_series(tmp_path, "alpha", 200, segment_size=4096)
    trim(tmp_path, "alpha", 150)
    first = int(segments(tmp_path, "alpha")[0].name.split(".")[1])
    with pytest.raises(Trimmed):
        read(tmp_path, start={"alpha": first - 1})
    assert next(iter(read(tmp_path, start={"alpha": first}))).lsn == first


def test_reading_is_streaming(two_writers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking the first record opens one segment per writer, not the whole log."""
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(scan_module, "open", counting_open, raising=False)
    stream = read(two_writers)
    assert opened == []
    next(stream)
    assert len(opened) == 2
    assert len(segments(two_writers, "alpha")) > 1 and len(segments(two_writers, "beta")) > 1


def test_a_start_skips_whole_segments_without_opening_them(
    two_writers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments wholly before a start position are not read at all."""
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(Path(path).name)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(scan_module, "open", counting_open, raising=False)
    list(read(two_writers, start={"alpha": 200}, cut={"alpha": 200}))
    assert opened == [segments(two_writers, "alpha")[-1].name]


@settings(max_examples=40, deadline=None)
@given(st.lists(bodies, max_size=30), st.sampled_from([4096, 1 << 20]))
def test_any_bodies_round_trip_through_real_files(body_list: list[object], size: int) -> None:
    """Whatever msgpack bodies are appended come back from the files, in order."""
    with tempfile.TemporaryDirectory() as where:
        with Writer.open(where, "prop", segment_size=size) as w:
            lsns = [w.append(body) for body in body_list]
        assert lsns == list(range(1, len(body_list) + 1))
        assert [r.body for r in read(where)] == body_list


def test_a_record_finished_while_the_reader_looks_is_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If a live writer completes a record just as the reader hits end of file, the read
    just ends."""
    write_series(tmp_path, "alpha", 3)
    [path] = segments(tmp_path, "alpha")
    whole = path.read_bytes()
    path.write_bytes(whole[:-5])  # the reader first sees record 3 half written
    real_open = builtins.open

    class RacingFile:
        """Reports end of file once, at the moment the writer finishes (and adds) records."""

        def __init__(self, f) -> None:  # type: ignore[no-untyped-def]
            self.f, self.reads = f, 0

        def read(self, size: int = -1) -> bytes:
            self.reads += 1
            if self.reads == 3:
                with real_open(path, "ab") as live:
                    live.write(whole[-5:] + record.encode(4, 2**62, "four"))
                return b""
            return self.f.read(size)

        def seek(self, offset: int) -> int:
            return self.f.seek(offset)

        def __enter__(self) -> RacingFile:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

    monkeypatch.setattr(scan_module, "open", lambda p, mode: RacingFile(real_open(p, mode)),
                        raising=False)
    assert [r.lsn for r in read(tmp_path)] == [1, 2]


def test_a_zero_tail_is_read_a_chunk_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a mostly preallocated segment checks every zero, never holding more than a chunk."""
    sizes: list[int] = []
    real_open = builtins.open

    class CountingFile:
        """Notes how many bytes each read returned."""

        def __init__(self, f) -> None:  # type: ignore[no-untyped-def]
            self.f = f

        def read(self, size: int = -1) -> bytes:
            data = self.f.read(size)
            sizes.append(len(data))
            return data

        def seek(self, offset: int) -> int:
            return self.f.seek(offset)

        def __enter__(self) -> Self:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

    with Writer.open(tmp_path, "alpha", segment_size=4 * scan_module.CHUNK) as w:
        w.append("one")
        w.append("two")
        monkeypatch.setattr(scan_module, "open", lambda p, mode: CountingFile(real_open(p, mode)),
                            raising=False)
        assert [r.body for r in read(tmp_path)] == ["one", "two"]
        assert max(sizes) <= scan_module.CHUNK
        assert sum(sizes) >= 4 * scan_module.CHUNK
