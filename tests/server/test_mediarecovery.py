"""A recovery's Plan writes each recoverable offloaded row's blocks back into the data
set of its owner, opened for recovery, and keeps count; a row whose data set is not
being restored, or whose bytes are not in the log, is left for restart processing;
a write that fails marks that data set failed with the reason (docs/smds.md).

Real data sets on temporary files; the rows are image rows as the loading of a
structure hands them to ``Plan.writer``.
"""

import errno
import os

from cqsd.records import DATA, ID, MAP, ROW_FIELDS
from cqsd.server.smds.mediarecovery import Plan
from cqsd.smds import DataMap
from cqsd.smds.dataset import DataSet
from cqsd.smds.pages import PAGE

DSBLOCK = 2 * PAGE
DSSIZE = 16 * DSBLOCK
STRUCTURE = "S1"
QUEUE = ("L", "Q1")


def recovering(tmp_path, owner: str) -> DataSet:
    """A data set opened for recovery with PARTIAL_RECOVERY set, as ``start`` leaves it."""
    DataSet.create(tmp_path, STRUCTURE, owner, dsblock=DSBLOCK, dssize=DSSIZE).abandon()
    dataset = DataSet.open(tmp_path, STRUCTURE, owner, map_time=None, recovering=True)
    dataset.mark_recovery(True)
    return dataset


def row(entry_id: int, payload: bytes, datamap: DataMap) -> list:
    """An offloaded row with its payload materialised from the log."""
    r: list = [None] * ROW_FIELDS
    r[ID], r[DATA], r[MAP] = entry_id, payload, datamap.encode()
    return r


def mapped(tmp_path, owner: str, payload: bytes) -> DataMap:
    """Where ``payload`` was stored before the data set was lost: a map allocated on a
    scratch copy of the data set, as the put that offloaded it made."""
    scratch = DataSet.create(tmp_path / "before", STRUCTURE, owner, dsblock=DSBLOCK,
                             dssize=DSSIZE)
    try:
        return DataMap.of(owner, payload, scratch.space.allocate(QUEUE, len(payload)))
    finally:
        scratch.abandon()


def test_a_recoverable_offloaded_row_is_written_back_into_its_data_set(tmp_path):
    """The row's blocks land at its map's pages: the data set reads the payload back."""
    payload = bytes(range(256)) * 40  # crosses several blocks
    dmap = mapped(tmp_path, "C1", payload)
    dataset = recovering(tmp_path, "C1")
    plan = Plan(datasets={(STRUCTURE, "C1"): dataset})
    plan.writer(STRUCTURE)(row(7, payload, dmap))
    try:
        assert dataset.read(dmap, 7) == payload
    finally:
        dataset.abandon()
    assert plan.written == {(STRUCTURE, "C1"): 1}
    assert plan.failed == {}


def test_each_row_goes_to_its_owners_data_set(tmp_path):
    """Two owners' rows are written into their own data sets, and counted apart."""
    first, second = b"a" * 3000, b"b" * 5000
    maps = {owner: mapped(tmp_path / owner, owner, p)
            for owner, p in (("C1", first), ("C2", second))}
    datasets = {(STRUCTURE, o): recovering(tmp_path, o) for o in ("C1", "C2")}
    plan = Plan(datasets=dict(datasets))
    write = plan.writer(STRUCTURE)
    write(row(1, first, maps["C1"]))
    write(row(2, second, maps["C2"]))
    try:
        assert datasets[STRUCTURE, "C1"].read(maps["C1"], 1) == first
        assert datasets[STRUCTURE, "C2"].read(maps["C2"], 2) == second
    finally:
        for d in datasets.values():
            d.abandon()
    assert plan.written == {(STRUCTURE, "C1"): 1, (STRUCTURE, "C2"): 1}


def test_a_row_whose_data_set_is_not_restored_is_skipped(tmp_path):
    """An owner with no data set in the plan (ACTIVE and sound, or EMPTY) gets no write."""
    payload = b"x" * 2000
    dmap = mapped(tmp_path, "C2", payload)
    dataset = recovering(tmp_path, "C1")
    plan = Plan(datasets={(STRUCTURE, "C1"): dataset})
    plan.writer(STRUCTURE)(row(3, payload, dmap))
    dataset.abandon()
    assert plan.written == {}
    assert plan.failed == {}


def test_a_row_of_another_structure_is_skipped(tmp_path):
    """The plan's data sets are keyed by structure too: the same owner elsewhere is not written."""
    payload = b"y" * 2000
    dmap = mapped(tmp_path, "C1", payload)
    dataset = recovering(tmp_path, "C1")
    plan = Plan(datasets={(STRUCTURE, "C1"): dataset})
    plan.writer("S2")(row(4, payload, dmap))
    dataset.abandon()
    assert plan.written == {}


def test_a_row_whose_bytes_are_not_in_the_log_is_skipped(tmp_path):
    """A row with less data than its map's length (an image row keeps only the map) is
    left for restart processing to delete, and nothing is written."""
    payload = b"z" * 2000
    dmap = mapped(tmp_path, "C1", payload)
    dataset = recovering(tmp_path, "C1")
    plan = Plan(datasets={(STRUCTURE, "C1"): dataset})
    plan.writer(STRUCTURE)(row(5, b"", dmap))
    dataset.abandon()
    assert plan.written == {}
    assert plan.failed == {}


def test_a_write_error_marks_that_data_set_failed_with_the_reason(tmp_path, monkeypatch):
    """A failed write records the entry and the error against its data set, counts
    nothing, and later rows of that data set are not tried."""
    payload = b"w" * 3000
    dmap = mapped(tmp_path, "C1", payload)
    dataset = recovering(tmp_path, "C1")
    plan = Plan(datasets={(STRUCTURE, "C1"): dataset})
    calls = []

    def broken(fd, buffers, position):
        calls.append(position)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "pwritev", broken)
    write = plan.writer(STRUCTURE)
    write(row(9, payload, dmap))
    tried = len(calls)
    write(row(10, payload, dmap))
    dataset.abandon()
    key = (STRUCTURE, "C1")
    assert plan.failed[key].startswith("entry 9: ")
    assert os.strerror(errno.EIO) in plan.failed[key]
    assert plan.written == {}
    assert tried == 1 and len(calls) == tried  # the second row was not tried


def test_a_write_error_leaves_the_other_data_sets_restoring(tmp_path, monkeypatch):
    """One data set's failure is its own: another owner's rows are still written."""
    payload = b"v" * 2000
    maps = {o: mapped(tmp_path / o, o, payload) for o in ("C1", "C2")}
    datasets = {(STRUCTURE, o): recovering(tmp_path, o) for o in ("C1", "C2")}
    plan = Plan(datasets=dict(datasets))
    plan.failed[STRUCTURE, "C1"] = "entry 1: Input/output error"  # failed earlier
    plan.writer(STRUCTURE)(row(2, payload, maps["C1"]))
    plan.writer(STRUCTURE)(row(3, payload, maps["C2"]))
    try:
        assert datasets[STRUCTURE, "C2"].read(maps["C2"], 3) == payload
    finally:
        for d in datasets.values():
            d.abandon()
    assert plan.written == {(STRUCTURE, "C2"): 1}
    assert plan.failed == {(STRUCTURE, "C1"): "entry 1: Input/output error"}


def test_a_map_beyond_the_data_set_grows_it_to_hold_the_blocks(tmp_path):
    """A data set made anew smaller than the one lost is expanded to the map's last page."""
    payload = b"u" * 3000
    big = DataSet.create(tmp_path / "before", STRUCTURE, "C1", dsblock=DSBLOCK,
                         dssize=4 * DSSIZE)
    big.space.allocate(QUEUE, 2 * DSSIZE)  # fill past the small data set's end
    dmap = DataMap.of("C1", payload, big.space.allocate(QUEUE, len(payload)))
    big.abandon()
    dataset = recovering(tmp_path, "C1")
    end = max(r.page + r.pages for r in dmap.ranges) * PAGE
    assert end > dataset.size
    plan = Plan(datasets={(STRUCTURE, "C1"): dataset})
    plan.writer(STRUCTURE)(row(6, payload, dmap))
    try:
        assert dataset.size >= end
        assert dataset.read(dmap, 6) == payload
    finally:
        dataset.abandon()
    assert plan.written == {(STRUCTURE, "C1"): 1}
