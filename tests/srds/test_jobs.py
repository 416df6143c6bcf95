"""The checkpoint, recover and report jobs end to end, in process on the test session's
Spark, over real segment files written by several ``logstream.Writer``s."""

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from crc32c import crc32c

import logstream
from cqsd.engine import Structure
from cqsd.records import FoldError
from cqsd.recovery.fold import fold
from cqsd.srds import jobs, manifest, slotfiles, slots
from cqsd.storage import image, repository

from .histories import History, Seeded
from .test_slots import before_maps

S = "MSGQ01"


def write_log(data_dir: Path, records: list) -> None:
    """Append ``(writer, lsn, timestamp, body)`` records with small segments (many files)."""
    writers: dict[str, logstream.Writer] = {}
    try:
        for writer, lsn, ts, body in records:
            if writer not in writers:
                writers[writer] = logstream.Writer.open(data_dir / "logstream", writer,
                                                        segment_size=4096)
            assert writers[writer].append(body, timestamp=ts) == lsn
    finally:
        for w in writers.values():
            w.close()


def reference(data_dir: Path, structure: str) -> dict[int, list]:
    """The plain-Python fold of the whole log: what recovery must give."""
    return reference_with_last_id(data_dir, structure)[0]


def reference_with_last_id(data_dir: Path, structure: str) -> tuple[dict[int, list], int]:
    rows: dict[int, list] = {}
    last_id = fold(rows, (r.body for r in logstream.read(data_dir / "logstream")), structure,
                   materialise=True)
    return rows, last_id


@pytest.fixture
def history() -> History:
    return History(S, Seeded(2024)).run(600)


def test_checkpoints_alternate_slots_and_recovery_equals_the_reference_fold(spark, tmp_path,
                                                                            history):
    """Checkpoint, more records, checkpoint again: the slots alternate and each holds
    the fold up to its cut; recovery from the newest plus the tail gives the
    reference fold, the live engine's recoverable rows and its FIFO order."""
    half = history.safe(len(history.records) // 2)
    write_log(tmp_path, history.records[:half])
    first = jobs.checkpoint(spark, tmp_path, S)
    assert first["slot"] == "SRDS1"
    assert first["lsn"] == logstream.tail_positions(tmp_path / "logstream")
    assert slots.read_rows(slots.valid_slots(tmp_path / "srds", S)[0]) == reference(tmp_path, S)
    write_log(tmp_path, history.records[half:])
    second = jobs.checkpoint(spark, tmp_path, S)
    assert second["slot"] == "SRDS2"
    assert [s.name for s in slots.valid_slots(tmp_path / "srds", S)] == ["SRDS2", "SRDS1"]
    assert second["rows"] == len(history.expected()[S])
    done = jobs.recover(spark, tmp_path, S)
    assert done["from_slot"] == "SRDS2" and done["records"] == 0
    header, rows = image.read_rows(Path(done["image"]), S)
    assert rows == reference(tmp_path, S) == history.expected()[S]
    assert header["lsn"] == logstream.tail_positions(tmp_path / "logstream")
    assert header["last_id"] == reference_with_last_id(tmp_path, S)[1]
    # both at one time of the history's clock: a load ripens what is due by then
    now = history.primary.ids.clock()
    history.primary.ripen(now)
    rebuilt = Structure(S, 1 << 22, entry_max=300, clock=lambda: now)
    image.restore(rebuilt, rows)
    assert queues(rebuilt) == queues(history.primary, recoverable_only=True)


def queues(s: Structure, recoverable_only: bool = False) -> dict:
    """Every queue's entry ids in FIFO (browse) order."""
    found: dict = {}
    for e in s.browse(limit=100_000)[0]:
        if e.recoverable or not recoverable_only:
            found.setdefault((e.where, int(e.qtype), e.name, e.owner), []).append(e.entry_id)
    return found


def test_recovery_without_a_checkpoint_replays_the_whole_log(spark, tmp_path, history):
    """With no slot at all the recovery job folds every record from LSN 1, for the
    primary and, from the same log, for its overflow structure."""
    write_log(tmp_path, history.records)
    for s in history.names:
        done = jobs.recover(spark, tmp_path, s, to_image=tmp_path / f"{s}.img")
        assert done["from_slot"] is None and done["records"] > 0
        assert image.read_rows(tmp_path / f"{s}.img", s)[1] == history.expected()[s]


def test_a_damaged_newest_slot_falls_back_to_the_older_one(spark, tmp_path, history,
                                                           capsys):
    """A flipped byte in the newest slot's Parquet file: the slot is skipped with a
    warning naming the file, recovery starts from the older slot and its longer
    tail, and the next checkpoint replaces the damaged slot, not the good one."""
    third, two_thirds = (history.safe(len(history.records) * n // 3) for n in (1, 2))
    write_log(tmp_path, history.records[:third])
    jobs.checkpoint(spark, tmp_path, S)
    write_log(tmp_path, history.records[third:two_thirds])
    jobs.checkpoint(spark, tmp_path, S)
    write_log(tmp_path, history.records[two_thirds:])
    damaged = slots.valid_slots(tmp_path / "srds", S)[0].paths[0]
    flip(damaged, damaged.stat().st_size // 2)
    capsys.readouterr()
    assert [s.name for s in slots.valid_slots(tmp_path / "srds", S)] == ["SRDS1"]
    assert str(damaged) in capsys.readouterr().out  # structlog's default sink is stdout
    done = jobs.recover(spark, tmp_path, S)
    assert done["from_slot"] == "SRDS1"
    assert image.read_rows(Path(done["image"]), S)[1] == history.expected()[S]
    report = jobs.report(tmp_path, S)
    assert [(s["name"], s["valid"]) for s in report["slots"]] == [("SRDS2", False), ("SRDS1", True)]
    assert "CRC32C" in report["slots"][0]["problem"]
    assert jobs.checkpoint(spark, tmp_path, S)["slot"] == "SRDS2"
    assert [s.name for s in slots.valid_slots(tmp_path / "srds", S)] == ["SRDS2", "SRDS1"]


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


def test_a_fold_error_fails_the_checkpoint_and_keeps_the_old_slot(spark, tmp_path, history):
    """An effect on an entry nobody put fails the job with the structure and entry
    named; the previous slot stays current, and the repository says it failed."""
    write_log(tmp_path, history.records)
    jobs.checkpoint(spark, tmp_path, S)
    before = (tmp_path / "srds" / S / manifest.NAME).read_bytes()
    with logstream.Writer.open(tmp_path / "logstream", "cqsd") as w:
        w.append({"s": S, "e": [["L", 777, "IMS1"]]})
    with pytest.raises(FoldError, match=rf"structure {S}: effect L on entry 777 \(writer cqsd"):
        jobs.checkpoint(spark, tmp_path, S)
    assert (tmp_path / "srds" / S / manifest.NAME).read_bytes() == before
    assert not [p for p in (tmp_path / "srds" / S).iterdir() if p.name.startswith(".staging")]
    recorded = repository.backups(tmp_path / "repository.db", S)
    assert [b["status"] for b in recorded] == ["failed", "ok"]
    assert "entry 777" in recorded[0]["error"]


def test_corruption_in_the_middle_of_the_log_fails_the_job_naming_the_file(spark, tmp_path,
                                                                          history):
    """A bit flipped in a segment that is not the last of its series is corruption,
    never a torn tail: the job fails with CorruptLog naming that segment."""
    write_log(tmp_path, history.records)
    segment = min((tmp_path / "logstream").glob("cqsd.*.seg"))
    flip(segment, 64 + 40)  # inside the first record's body
    with pytest.raises(logstream.CorruptLog) as failed:
        jobs.checkpoint(spark, tmp_path, S)
    assert failed.value.path == str(segment)
    assert not (tmp_path / "srds" / S / manifest.NAME).exists()


def test_records_trimmed_after_the_slot_make_the_jobs_fail(spark, tmp_path, history):
    """If records after the newest slot were trimmed away, nothing is folded: the gap
    is reported (Trimmed), by the report too."""
    cut = history.safe(20)
    write_log(tmp_path, history.records[:cut])
    jobs.checkpoint(spark, tmp_path, S)
    write_log(tmp_path, history.records[cut:])
    for writer in logstream.tail_positions(tmp_path / "logstream"):
        logstream.trim(tmp_path / "logstream", writer, 10**9)
    with pytest.raises(logstream.Trimmed):
        jobs.recover(spark, tmp_path, S)
    assert jobs.report(tmp_path, S)["recoverable"] is False


def test_purge_makes_an_empty_slot_current_and_nothing_older_is_recovered(spark, tmp_path,
                                                                          history):
    """After a purge at the log's end the only slot is empty; recovery folds just the
    records logged after it, and ids continue above the purged ones."""
    write_log(tmp_path, history.records)
    jobs.checkpoint(spark, tmp_path, S)
    jobs.checkpoint(spark, tmp_path, S)
    end = logstream.tail_positions(tmp_path / "logstream")
    purged = slots.purge(tmp_path / "srds", S, end, history.primary.last_id)
    assert [s.name for s in slots.valid_slots(tmp_path / "srds", S)] == [purged.name]
    assert not (tmp_path / "srds" / S / slots.other(purged.name)).exists()
    with logstream.Writer.open(tmp_path / "logstream", "cqsd") as w:
        w.append({"s": S, "e": [["P", 10**7, 1, "NEW", b"after", 1]]})
    done = jobs.recover(spark, tmp_path, S)
    header, rows = image.read_rows(Path(done["image"]), S)
    assert list(rows) == [10**7] and header["last_id"] == 10**7


def test_a_cut_behind_the_current_slot_is_refused(spark, tmp_path, history):
    """A cut cannot go back before what the current slot already holds."""
    write_log(tmp_path, history.records)
    cut = {writer: lsn for writer, lsn, _, _ in history.records[:history.safe(20)]}
    jobs.checkpoint(spark, tmp_path, S, cut=cut)
    with pytest.raises(jobs.JobError, match="behind slot SRDS1"):
        jobs.checkpoint(spark, tmp_path, S, cut={**cut, "cqsd": cut["cqsd"] - 1})


def test_a_cut_includes_exactly_the_records_up_to_it(spark, tmp_path, history):
    """--cut: the slot holds the fold of the records up to the cut per writer."""
    write_log(tmp_path, history.records)
    upto = history.records[:history.safe(25)]
    cut = {writer: lsn for writer, lsn, _, _ in upto}
    done = jobs.checkpoint(spark, tmp_path, S, cut=cut)
    assert done["lsn"] == cut
    rows: dict = {}
    fold(rows, (body for *_, body in upto), S, materialise=True)
    assert slots.read_rows(slots.valid_slots(tmp_path / "srds", S)[0]) == rows


def test_the_repository_records_each_checkpoint(spark, tmp_path, history):
    """Each checkpoint is a row: structure, slot, LSN range, times, rows and records."""
    cut = history.safe(30)
    write_log(tmp_path, history.records[:cut])
    a = jobs.checkpoint(spark, tmp_path, S)
    write_log(tmp_path, history.records[cut:])
    b = jobs.checkpoint(spark, tmp_path, S)
    newest, oldest = repository.backups(tmp_path / "repository.db", S)
    assert (newest["slot"], newest["lsn_from"], newest["lsn_to"]) == ("SRDS2", a["lsn"], b["lsn"])
    assert (oldest["slot"], oldest["lsn_from"], oldest["rows"]) == ("SRDS1", {}, a["rows"])
    assert newest["records"] == b["records"] > 0 and newest["status"] == "ok"
    assert newest["started"] <= newest["finished"]


def test_structure_names_with_special_characters_work_as_paths(spark, tmp_path):
    """# and $ are legal in structure names and must survive Spark's path handling."""
    name = "Q#1$"
    write_log(tmp_path, [("cqsd", 1, 1, {"s": name, "e": [["P", 1, 1, "A", b"x", 1]]})])
    assert jobs.checkpoint(spark, tmp_path, name)["rows"] == 1
    assert jobs.checkpoint(spark, tmp_path, name)["rows"] == 1
    assert image.read_rows(Path(jobs.recover(spark, tmp_path, name)["image"]), name)[1] == {
        1: [1, 1, "A", b"x", True, 1, 0, "ready", None, None, None, None, None]}


def test_a_slot_written_before_data_maps_is_the_base_of_the_next_checkpoint(spark, tmp_path):
    """Slot files with a ``ref`` column instead of ``map`` (before SMDS) are read by
    Spark as rows with no map, under the offloaded puts logged since."""
    datamap = ["IMS1", 3, crc32c(b"big"), [64, 1]]
    write_log(tmp_path, [("cqsd", 1, 1, {"s": S, "e": [["P", 1, 1, "A", b"x", 1]]}),
                         ("cqsd", 2, 2, {"s": S, "e": [["P", 2, 1, "A", b"y", 2]]})])
    jobs.checkpoint(spark, tmp_path, S)
    slot = slots.valid_slots(tmp_path / "srds", S)[0]
    with slots.locked(tmp_path / "srds", S) as directory:
        staged = slots.staging_dir(directory, "old")
        staged.mkdir()
        old = before_maps(slotfiles.table_of(slots.read_rows(slot).values()))
        pq.write_table(old, staged / "part-0.parquet")
        slots.install(directory, staged, slot.name, slot.lsn, slot.last_id, slot.time)
    offloaded = [["B", 3, 64, b"big"], ["P", 3, 1, "A", b"", 4], ["M", 3, datamap]]
    write_log(tmp_path, [("cqsd", 3, 3, {"s": S, "e": [["L", 1, "IMS1"]]}),
                         ("cqsd", 4, 4, {"s": S, "e": offloaded})])
    jobs.checkpoint(spark, tmp_path, S)
    assert slots.read_rows(slots.valid_slots(tmp_path / "srds", S)[0]) == {
        1: [1, 1, "A", b"x", True, 1, 1, "locked", "IMS1", None, None, None, None],
        2: [2, 1, "A", b"y", True, 2, 0, "ready", None, None, None, None, None],
        3: [3, 1, "A", b"big", True, 4, 0, "ready", None, None, datamap, None, None]}


def test_a_lease_and_a_delay_go_through_a_checkpoint_and_a_recovery(spark, tmp_path):
    """A leased lock's lease and a delayed put's not_before are in the slot a
    checkpoint writes and in the image a recovery writes from it."""
    write_log(tmp_path, [("cqsd", 1, 1, {"s": S, "e": [["P", 1, 1, "A", b"x", 1], ["N", 1, 99],
                                                       ["P", 2, 1, "A", b"y", 2]]}),
                         ("cqsd", 2, 2, {"s": S, "e": [["L", 2, "IMS1"], ["T", 2, 5, 70]]})])
    jobs.checkpoint(spark, tmp_path, S)
    want = {1: [1, 1, "A", b"x", True, 1, 0, "ready", None, None, None, None, 99],
            2: [2, 1, "A", b"y", True, 2, 1, "locked", "IMS1", None, None, [5, 70], None]}
    assert slots.read_rows(slots.valid_slots(tmp_path / "srds", S)[0]) == want
    assert image.read_rows(Path(jobs.recover(spark, tmp_path, S)["image"]), S)[1] == want


def test_the_report_shows_slots_and_the_tail_per_writer(spark, tmp_path, history):
    """report: the current slot, its LSNs, and how many records each writer has after it."""
    cut = history.safe(40)
    write_log(tmp_path, history.records[:cut])
    jobs.checkpoint(spark, tmp_path, S)
    write_log(tmp_path, history.records[cut:])
    report = jobs.report(tmp_path, S)
    json.dumps(report)  # it is the CLI's output
    slot = report["slots"][0]
    assert report["current"] == "SRDS1" and slot["valid"] and report["recoverable"]
    ends = logstream.tail_positions(tmp_path / "logstream")
    assert report["tail"] == {w: {"after": slot["lsn"].get(w, 0), "end": ends[w],
                                  "records": ends[w] - slot["lsn"].get(w, 0)} for w in ends}
    assert report["backups"][0]["slot"] == "SRDS1"


def test_another_job_on_the_structure_is_refused_not_waited_for(spark, tmp_path):
    """Two checkpoints of one structure never run at once."""
    (tmp_path / "logstream").mkdir()
    with slots.locked(tmp_path / "srds", S), \
            pytest.raises(slots.SlotsBusy, match=f"pid {os.getpid()}"):
        jobs.checkpoint(spark, tmp_path, S)


def test_several_structures_recover_together_each_equal_to_its_reference_fold(spark, tmp_path,
                                                                              history):
    """RECOVER CFSTRUCT of a list: the primary from its checkpoint and the tail, the
    overflow structure from the whole log, folded in one job, each image equal to the
    reference fold; a structure whose checkpoint manifest is damaged is reported
    failed by name and gets no image, and the others are recovered all the same."""
    half = history.safe(len(history.records) // 2)
    write_log(tmp_path, history.records[:half])
    jobs.checkpoint(spark, tmp_path, S)
    write_log(tmp_path, history.records[half:])
    broken = slots.structure_dir(tmp_path / "srds", "BROKEN")
    broken.mkdir(parents=True)
    (broken / manifest.NAME).write_text("{not json")
    done = jobs.recover_together(spark, tmp_path, [*history.names, "BROKEN"])
    assert list(done["failed"]) == ["BROKEN"], done["failed"]
    assert "ManifestError" in done["failed"]["BROKEN"]
    assert not (tmp_path / "images" / "BROKEN.recovered").exists()
    assert sorted(done["recovered"]) == sorted(history.names)
    assert done["recovered"][S]["from_slot"] == "SRDS1"
    for s in history.names:
        header, rows = image.read_rows(Path(done["recovered"][s]["image"]), s)
        assert rows == reference(tmp_path, s) == history.expected()[s]
        assert header["last_id"] == reference_with_last_id(tmp_path, s)[1]
