"""Multi-node, multi-epoch logs (docs/group.md): the folds of a sealed log.

A generated engine history is written to real log series as a group would
write it: in epochs, each owned by one node incarnation (``NODE1-1``,
``NODE2-1``, ``NODE1-2`` ...), the first record of each epoch repeating the
seal it put on its predecessors; after each epoch the deposed owner goes on
writing late records (puts of messages nobody acknowledged) stamped among the
next owner's. Read back with the cuts the log itself names (``cut_of``), the
reference fold and the Spark fold both give exactly the history's rows, the
late writes nowhere; read without the cuts, the late writes would be there.
The recovery job, given those cuts as ``cqsctl recover`` gives them in a
group, rebuilds the same rows.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import logstream
from cqsd.recovery.sealed import cut_of
from cqsd.srds import jobs
from cqsd.storage import image

from .folds import log_order, python_fold, spark_fold
from .histories import Drawn, History, Seeded

FOLDS = {"python": python_fold, "spark": spark_fold}
NODES = ["NODE1", "NODE2", "NODE3"]
LATE_ID = 1 << 60  # entry ids of the deposed owners' late puts: never the history's


def write_epochs(log_dir, h: History, bounds: list[int], rng: random.Random) -> int:
    """Write ``h``'s records in epochs split at ``bounds``; the count of late records."""
    records = sorted(h.records, key=log_order)
    edges = [0, *bounds, len(records)]
    writers: dict[str, logstream.Writer] = {}
    incarnation = dict.fromkeys(NODES, 0)
    cut: dict[str, int] = {}
    ts, late, previous = 0, 0, None
    for epoch, (start, end) in enumerate(zip(edges, edges[1:], strict=False), 1):
        node = NODES[(epoch - 1) % len(NODES)]
        incarnation[node] += 1
        name = f"{node}-{incarnation[node]}"
        w = writers[name] = logstream.Writer.open(log_dir, name, segment_size=1 << 20)
        if previous is not None:
            cut[previous] = writers[previous].appended_lsn
        ts += 10
        w.append({"s": h.primary.name, "e": [], "n": epoch, "z": dict(cut)}, timestamp=ts)
        for i, (_, _, _, body) in enumerate(records[start:end]):
            ts += 10
            w.append(body, timestamp=ts)
            if previous is not None and i < 3:  # the deposed owner writes on, late
                late += 1
                eid = LATE_ID + late
                writers[previous].append(
                    {"s": h.primary.name,
                     "e": [["P", eid, 1, "LATE", b"late", 0]]},
                    timestamp=ts + rng.choice([-15, -5, 5] if i == 0 else [-5, 5]))
        previous = name
    for w in writers.values():
        w.flush()
        w.close()
    return late


def read_records(log_dir, cut=None):
    return [(r.writer, r.lsn, r.timestamp, r.body) for r in logstream.read(log_dir, cut=cut)
            if isinstance(r.body, dict)]


@pytest.mark.parametrize("fold_name", sorted(FOLDS))
def test_folds_of_a_sealed_multi_epoch_log_ignore_late_writes(fold_name, request, tmp_path):
    """Every fold of a log written over several epochs and node incarnations, read
    with the seals' cuts, gives the history's rows and none of the late writes."""
    spark = request.getfixturevalue("spark") if fold_name == "spark" else None
    fold = FOLDS[fold_name]
    cases = []

    @settings(max_examples=15, deadline=None, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(st.data())
    def generate(data):
        h = History(f"G{len(cases)}", Drawn(data)).run(data.draw(st.integers(20, 50)))
        n = len(h.records)
        bounds = sorted({h.safe(b) for b in data.draw(st.lists(st.integers(1, max(1, n - 1)),
                                                                min_size=1, max_size=4))})
        bounds = [b for b in bounds if 0 < b < n]
        log_dir = tmp_path / f"log{len(cases)}"
        log_dir.mkdir()
        late = write_epochs(log_dir, h, bounds, random.Random(len(cases)))
        cases.append((h, log_dir, late))

    generate()
    assert sum(late for *_, late in cases) > 10, "no late writes to ignore"
    for h, log_dir, late in cases:
        records = read_records(log_dir, cut_of(log_dir, h.primary.name))
        assert fold(spark, {}, records, h.names) == h.expected()
        if late:
            unsealed = fold(spark, {}, read_records(log_dir), h.names)
            assert any(eid > LATE_ID for rows in unsealed.values() for eid in rows)


def test_the_recovery_job_given_the_seals_cuts_leaves_the_late_writes_out(spark, tmp_path):
    """The recovery job (what ``cqsctl recover`` runs) over a log of three epochs and two
    takeovers, given the seals' cuts as ``--cut``, rebuilds each structure of the
    pair to the history's rows; given none, the deposed owners' late puts are in."""
    h = History("G", Seeded(26)).run(300)
    n = len(h.records)
    log_dir = tmp_path / "logstream"
    log_dir.mkdir()
    assert write_epochs(log_dir, h, [h.safe(n // 3), h.safe(2 * n // 3)], random.Random(26))
    cut = cut_of(log_dir, h.primary.name)
    assert len(cut) == 3, cut
    for s in h.names:
        done = jobs.recover(spark, tmp_path, s, to_image=tmp_path / f"{s}.img", cut=cut)
        assert done["lsn"] == cut
        assert image.read_rows(tmp_path / f"{s}.img", s)[1] == h.expected()[s]
    jobs.recover(spark, tmp_path, h.primary.name, to_image=tmp_path / "unsealed.img")
    unsealed = image.read_rows(tmp_path / "unsealed.img", h.primary.name)[1]
    assert any(eid > LATE_ID for eid in unsealed)
