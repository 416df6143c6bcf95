"""Planning the segment tasks, scanning one, and checking that they read everything."""

import pytest

import logstream
from cqsd.records import FoldError
from cqsd.srds import segments

S = "MSGQ01"


@pytest.fixture
def log(tmp_path):
    """Writer "a" with 40 records over several 4 KiB segments, writer "b" with 3."""
    with logstream.Writer.open(tmp_path, "a", segment_size=4096) as a:
        for i in range(1, 41):
            a.append({"s": S, "e": [["P", i, 1, "Q", b"x" * 300, i]]}, timestamp=i)
    with logstream.Writer.open(tmp_path, "b", segment_size=4096) as b:
        for i in range(1, 4):
            b.append({"s": "OTHER", "e": [["D", i]]}, timestamp=i)
    return tmp_path


def read_all(tasks):
    summaries, rows = [], 0
    for task in tasks:
        summary: dict = {}
        rows += sum(b.num_rows for b in segments.scan(task, {S}, summary))
        summaries.append(summary)
    return summaries, rows


def test_segments_wholly_outside_the_range_are_not_planned(log):
    """Segments entirely at or before the start, or after the cut, get no task."""
    every = segments.plan(log, {}, {"a": 40})
    some = segments.plan(log, {"a": 20}, {"a": 30})
    assert len(every) > len(some) >= 1
    assert some[0].first_lsn <= 21 and all(t.first_lsn <= 30 for t in some)
    summaries, rows = read_all(some)
    coverage = segments.check(some, summaries)
    assert (coverage.records, coverage.matched, rows) == (10, 10, 10)
    assert coverage.last_ids == {S: 30}


def test_writers_not_in_the_cut_are_not_read(log):
    """As in logstream.read, a cut without writer b reads nothing of b."""
    assert {t.writer for t in segments.plan(log, {}, {"a": 40})} == {"a"}


def test_a_missing_segment_is_a_gap(log):
    """The tasks' summaries must chain: a missing middle segment is corruption."""
    tasks = segments.plan(log, {}, {"a": 40})
    summaries, _ = read_all(tasks)
    del tasks[1]
    with pytest.raises(logstream.CorruptLog, match="lsn-gap"):
        segments.check(tasks, summaries)


def test_a_log_that_ends_before_the_cut_is_too_short(log):
    """A cut beyond a writer's last record promises records that are not there."""
    tasks = segments.plan(log, {}, {"a": 45})
    with pytest.raises(segments.LogTooShort, match="ends at LSN 40, before the cut at LSN 45"):
        segments.check(tasks, read_all(tasks)[0])


def test_records_trimmed_after_the_start_are_reported(log):
    """Asking for records the log no longer has raises Trimmed at planning."""
    logstream.trim(log, "a", 30)
    with pytest.raises(logstream.Trimmed):
        segments.plan(log, {"a": 5}, {"a": 40})


def test_damage_is_reported_in_the_summary_not_raised_by_the_task(log):
    """A task never raises for damage: it stops and its summary says where."""
    tasks = segments.plan(log, {}, {"a": 40})
    path = tasks[0].path
    with open(path, "r+b") as f:
        f.seek(64 + 30)
        f.write(b"\xff")
    summaries, _ = read_all(tasks)
    assert summaries[0]["problem"]["type"] == "corrupt"
    with pytest.raises(logstream.CorruptLog) as failed:
        segments.check(tasks, summaries)
    assert failed.value.path == path
    with pytest.raises(logstream.CorruptLog):
        segments.raise_reported(summaries)


def test_an_effect_that_is_not_one_is_reported_as_a_fold_error(tmp_path):
    """A record that decodes but holds no proper effect is the fold's error."""
    with logstream.Writer.open(tmp_path, "a") as a:
        a.append({"s": S, "e": [["Z", 1]]})
    tasks = segments.plan(tmp_path, {}, {"a": 1})
    with pytest.raises(FoldError, match="is not an effect"):
        segments.check(tasks, read_all(tasks)[0])
