"""The traffic report (``python -m cqsd.srds report --out``) over the log of a real
daemon that did a known traffic pattern: its Parquet figures, its page and plots.
(test_cluster.py runs the command on a Spark cluster too.)"""

import json
import re
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import cqsclient
from cqsclient.errors import CQSError
from cqsd.srds import effects
from cqsd.srds import traffic as traffic_report
from cqsd.srds.traffic import report
from cqsd.storage import repository
from tests.daemon.harness import STRUCTURES, Daemon

ROOT = Path(__file__).resolve().parents[2]
KEYS = "max_deliveries = 2\n"
TINY = '[[structure]]\nname = "TINY"\nsize = "8KiB"\nentry_max = "1KiB"\noverflow_threshold = 100\n'


def srds(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cqsd.srds", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """A daemon's log after: 21 puts to TRAN A (one of 5000 bytes), 10 of them read
    and deleted; 5 puts to TRAN B, one read and unlocked as failed twice (redelivered
    once, then suspended, max_deliveries 2); TINY filled until STRUCTURE_FULL, then
    relieved; SMALL filled until its queue is in overflow status; a non-recoverable put
    (not logged). Its event log is kept as a file."""
    d = Daemon(KEYS, STRUCTURES + TINY).start()
    began = time.time()
    try:
        with cqsclient.connect(d.address, client="APP") as c:
            s = c.structure("MSGQ01")
            for i in range(20):
                s.put("A", b"%03d" % i + b"." * 97)
            s.put("A", b"L" * 5000)
            s.put("A", b"not logged", recoverable=False)
            for _ in range(10):
                s.delete(s.read("A").entry_id)
            middle = time.time()
            for i in range(5):
                s.put("B", b"b%d" % i)
            first = s.read("B")
            s.unlock(first.entry_id, failed=True)
            again = s.read("B")
            assert again.entry_id == first.entry_id and again.delivery_count == 2
            assert s.unlock(again.entry_id, failed=True).qtype == "TRAN_SUSPEND"
            fill(c.structure("SMALL"), "OVERFLOW_REJECTED")  # in overflow status, no overflow
            tiny = c.structure("TINY")
            fill(tiny, "STRUCTURE_FULL")
            tiny.delete(tiny.read("F").entry_id)
            tiny.put("F", b"fits again")
        d.wait_for("structure_not_full", structure="TINY")
        ended = time.time()
        assert d.stop() == 0
        events = d.dir / "events.jsonl"
        events.write_text("".join(json.dumps(e) + "\n" for e in d.lines))
        yield d.data, events, began, middle, ended
    finally:
        d.cleanup()


def fill(structure, reason: str) -> None:
    """Put 900-byte messages to queue F until a put is refused for ``reason``."""
    with pytest.raises(CQSError) as refused:
        for _ in range(100):
            structure.put("F", b"f" * 900)
    assert refused.value.reason == reason


@pytest.fixture(scope="module")
def made(traffic, spark, tmp_path_factory):
    """The report of the daemon's data, made as the command line makes it, on the test
    session's Spark (the command line itself runs in test_cluster and below)."""
    data, events, *_ = traffic
    out = tmp_path_factory.mktemp("report")
    return out, traffic_report.run(data, out, lambda conf: nullcontext(spark), events=events)


def queues(out: Path) -> dict[tuple, dict]:
    return {(r["structure"], r["qtype"], r["queue"]): r
            for r in pq.read_table(out / "queues.parquet").to_pylist()}


def test_the_report_counts_each_queues_puts_reads_deletes_redeliveries_and_suspends(made):
    """Per queue, what the daemon was asked; the non-recoverable put is not there."""
    out, result = made
    rows = queues(out)
    a, b = rows["MSGQ01", "TRAN", "A"], rows["MSGQ01", "TRAN", "B"]
    assert (a["puts"], a["reads"], a["deletes"], a["redeliveries"], a["suspends"]) == \
        (21, 10, 10, 0, 0)
    assert (b["puts"], b["reads"], b["deletes"], b["redeliveries"], b["suspends"]) == \
        (5, 2, 0, 1, 1)
    tiny = rows["TINY", "TRAN", "F"]
    assert (tiny["reads"], tiny["deletes"]) == (1, 1) and tiny["puts"] > 1
    minutes = pq.read_table(out / "minutes.parquet").to_pylist()
    assert sum(m["puts"] for m in minutes if m["queue"] == "A") == 21
    assert result["records"] > 0 and result["problems"] == []


def test_residence_and_lock_hold_percentiles_are_plausible(made, traffic):
    """Ten deletes from A, each after its put and within the run: p50 <= p90 <= p99 <=
    max; the locks held before them likewise."""
    out, _ = made
    _, _, began, _, ended = traffic
    for table in ("residence", "locks"):
        a = [r for r in pq.read_table(out / f"{table}.parquet").to_pylist()
             if r["queue"] == "A"]
        assert len(a) == 1 and a[0]["count"] == 10, table
        row = a[0]
        assert 0 <= row["p50"] <= row["p90"] <= row["p99"] <= row["max"] <= ended - began
    assert queues(out)["MSGQ01", "TRAN", "A"]["residence_max"] > 0


def test_the_largest_message_and_the_full_episode_are_reported(made):
    """The 5000-byte put heads the largest messages; TINY's full episode (ended) and
    SMALL's queue in overflow status come from the event log."""
    out, _ = made
    largest = pq.read_table(out / "largest.parquet").to_pylist()
    assert largest[0]["bytes"] == 5000 and largest[0]["queue"] == "A"
    episodes = pq.read_table(out / "episodes.parquet").to_pylist()
    full = [e for e in episodes if e["kind"] == "full"]
    assert [e["structure"] for e in full] == ["TINY"] and full[0]["end"] >= full[0]["start"]
    assert [(e["structure"], e["queue"]) for e in episodes if e["kind"] == "overflow status"] \
        == [("SMALL", "TRAN F")]


def test_the_page_shows_plots_that_exist(made):
    """index.html references PNGs, each a real file beside it, and the queues' table."""
    out, result = made
    page = (out / "index.html").read_text()
    images = re.findall(r"<img src='([^']+)'", page)
    assert {"traffic.png", "redeliveries.png", "residence.png", "locks.png",
            "largest.png"} <= set(images)
    for name in images:
        assert (out / name).read_bytes().startswith(b"\x89PNG"), name
    assert sorted(result["plots"]) == sorted(images)
    assert "queues.parquet" in result["parquet"]


def test_since_and_structure_keep_only_later_effects_of_that_structure(spark, traffic):
    """--since between A's traffic and B's, --structure MSGQ01: B's effects only, though
    the whole log was read; TINY's later traffic is left out."""
    data, _, _, middle, _ = traffic
    later = report.build(spark, data, report.plan(data / "logstream"), since=middle,
                         structure="MSGQ01")
    rows = {(r["structure"], r["queue"]): r for r in later.tables["queues"].to_pylist()}
    assert list(rows) == [("MSGQ01", "B")] and rows["MSGQ01", "B"]["puts"] == 5
    assert later.span[0] >= middle and later.records > 0


def test_payloads_do_not_travel_only_their_length():
    """A put's size is its payload's length, an offloaded one's (empty data, M map) the
    map's; its blocks are dropped."""
    body = {"s": "S", "e": [["B", 7, 0, b"x" * 300], ["P", 7, 1, "Q", b"", 5],
                            ["M", 7, ["IMS1", 300, 42, [0, 1]]], ["P", 8, 1, "Q", b"abc", 6]]}
    slim = report.slim(effects.batch(effects.rows_of(body, {"S"}, 1, "cqsd", 1)))
    assert "data" not in slim.schema.names
    assert list(zip(slim.column("kind").to_pylist(), slim.column("size").to_pylist(),
                    strict=True)) == [("P", 0), ("M", 300), ("P", 3)]


def test_a_leased_reads_lock_ends_at_its_delete_not_at_its_lease():
    """Leases (T, a leased read's and a renew's) and delays (N) are dropped, so the row
    after a read's L is what ended its lock."""
    body = {"s": "S", "e": [["P", 7, 1, "Q", b"abc", 5], ["N", 7, 9 * 10**18],
                            ["L", 7, "APP"], ["T", 7, 30 * 10**9, 9 * 10**18],
                            ["T", 7, 60 * 10**9, 9 * 10**18], ["D", 7]]}
    slim = report.slim(effects.batch(effects.rows_of(body, {"S"}, 1, "cqsd", 1)))
    assert slim.column("kind").to_pylist() == ["P", "L", "D"]


def test_a_data_dir_without_a_log_gets_a_page_saying_so(tmp_path):
    """No traceback, no Spark: exit 0, a warning naming the missing log, and a page."""
    done = srds("report", "--data-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "r"),
                "--since", "2026-11-24T09:30:00+01:00")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "no logstream here" in result["problems"][0]
    assert "no logstream here" in (tmp_path / "r" / "index.html").read_text()
    assert "traffic_report_problem" in done.stderr


def test_a_bad_since_or_no_out_and_no_structure_exits_2_naming_it():
    """A --since that is no time, and a report asked for neither --out nor --structure."""
    bad = srds("report", "--since", "yesterday", "--out", "/nonexistent")
    assert bad.returncode == 2 and "'yesterday' is neither an ISO 8601 time" in bad.stderr
    neither = srds("report")
    assert neither.returncode == 2 and "--out DIR" in neither.stderr


def test_checkpoint_durations_come_from_the_repository_read_only(tmp_path):
    """Each recorded checkpoint with its duration and outcome (--since by its start);
    the repository file is not written to."""
    db = tmp_path / "repository.db"
    for started, status in ((1000.25, "ok"), (2000.5, "failed")):
        repository.record_backup(db, structure="MSGQ01", slot="SRDS1", lsn_from={},
                                 lsn_to={"cqsd": 5}, started=started, finished=started + 1.5,
                                 rows=3, records=5, status=status)
    before = db.read_bytes()
    problems: list[str] = []
    rows = report.checkpoints(db, None, None, problems).to_pylist()
    assert [(r["started"].timestamp(), r["seconds"], r["status"]) for r in rows] == [
        (1000.25, 1.5, "ok"), (2000.5, 1.5, "failed")]
    assert [r["status"] for r in report.checkpoints(db, 1500, None, problems).to_pylist()] == \
        ["failed"]
    assert problems == [] and db.read_bytes() == before
