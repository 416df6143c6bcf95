"""Trimming: only whole segments before the LSN go, and never the active one."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstream import Writer, read, tail_positions, trim

from .ondisk import segments, write_series


def first_lsns(directory: Path) -> list[int]:
    return [int(p.name.split(".")[1]) for p in segments(directory, "alpha")]


@pytest.fixture
def rotated(tmp_path: Path) -> Path:
    """A series of 300 records across several small segments."""
    write_series(tmp_path, "alpha", 300, segment_size=4096)
    assert len(segments(tmp_path, "alpha")) >= 4
    return tmp_path


def test_trim_deletes_the_segments_wholly_before_the_lsn(rotated: Path) -> None:
    """Segments whose every LSN is below the trim point go, oldest first."""
    firsts = first_lsns(rotated)
    gone = trim(rotated, "alpha", firsts[2])
    assert [int(p.name.split(".")[1]) for p in gone] == firsts[:2]
    assert first_lsns(rotated) == firsts[2:]
    assert [r.lsn for r in read(rotated)] == list(range(firsts[2], 301))


def test_a_segment_holding_the_trim_lsn_stays(rotated: Path) -> None:
    """A segment with any record at or above the trim point is kept."""
    firsts = first_lsns(rotated)
    trim(rotated, "alpha", firsts[2] - 1)
    assert first_lsns(rotated) == firsts[1:]


def test_trim_never_deletes_the_last_segment(rotated: Path) -> None:
    """Even trimming past every record leaves the last (active) segment and its tail."""
    firsts = first_lsns(rotated)
    trim(rotated, "alpha", 10**9)
    assert first_lsns(rotated) == firsts[-1:]
    assert tail_positions(rotated) == {"alpha": 300}


def test_a_writer_trims_while_it_appends(rotated: Path) -> None:
    """Writer.trim keeps the active segment, fsyncs the directory, and appends go on."""
    with Writer.open(rotated, "alpha", segment_size=4096) as w:
        before = w.stats().fsyncs
        gone = w.trim(w.appended_lsn + 1)
        assert gone and w.stats().fsyncs == before + 1
        assert w.append("after trim") == 301
    assert [r.lsn for r in read(rotated)][-1] == 301


def test_trimming_nothing_does_not_fsync(rotated: Path, fsync_counter: list[int]) -> None:
    """A trim point inside the first segment deletes nothing and syncs nothing."""
    assert trim(rotated, "alpha", 2) == []
    assert fsync_counter == []


def test_trim_leaves_other_writers_and_broken_copies_alone(rotated: Path) -> None:
    """Only the named writer's segments are candidates; diagnostics stay."""
    write_series(rotated, "beta", 300, segment_size=4096)
    broken = rotated / (segments(rotated, "alpha")[0].name + ".broken-64")
    broken.write_bytes(b"evidence")
    beta_before = segments(rotated, "beta")
    trim(rotated, "alpha", 10**9)
    assert segments(rotated, "beta") == beta_before and broken.exists()
