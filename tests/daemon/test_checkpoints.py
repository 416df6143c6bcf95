"""Structure checkpoints and recovery through a real daemon: the Spark jobs run as
its subprocesses, operators drive them with the SDK and cqsctl, and a crash
restart starts from the newest checkpoint."""

import json
import subprocess
import sys
import threading
import time

import pytest

import cqsclient
from cqsclient.errors import CQSError

from .test_crash import check, start_workers, survivors
from .test_sharing import wait_until_waiting

# no idempotency keys remembered: the dedup window would keep its segments from trimming
# (docs/datadir.md), and these tests watch the log trimmed right after a checkpoint
NO_WINDOW = "dedup_window = 0\n"
JOBS = 'spark_master = "local[2]"\nlog_segment = "64KiB"\n' + NO_WINDOW
ONE = '[[structure]]\nname = "MSGQ01"\nsize = "16MiB"\n'
SMALL = '[[structure]]\nname = "SMALL"\nsize = "8KiB"\nentry_max = "1KiB"\n'
PAIR = ('[[structure]]\nname = "PRIM"\nsize = "1MiB"\noverflow = "PRIMOV"\n'
        '[[structure]]\nname = "PRIMOV"\nsize = "1MiB"\n')


def contents(address, queue="Q", structure="MSGQ01"):
    with cqsclient.connect(address, client="LOOK") as c:
        return [(m.entry_id, m.data, m.delivery_count)
                for m in c.structure(structure).browse(queue, limit=10_000)]


def ctl(d, *args):
    return subprocess.run([sys.executable, "-m", "cqsclient.ctl", "--address", d.address, "--json",
                           *args], capture_output=True, text=True, timeout=300)


def test_checkpoint_is_recorded_and_a_crash_restarts_from_it(make_daemon):
    """cqsctl checkpoint waits for the job; display backups shows it (and the empty
    slots the empty structures got at once); after more work and a SIGKILL the
    restart folds the checkpoint and the tail (plain-Python path), and the log
    behind the checkpoint has been trimmed."""
    d = make_daemon(JOBS).start()
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure("MSGQ01")
        first = [s.put("Q", b"%04d" % i + b"x" * 1000) for i in range(300)]  # 5 segments
        s.put("Q", b"not logged", recoverable=False)
    done = ctl(d, "checkpoint", "MSGQ01")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["rows"] == 300 and report["slot"] in ("SRDS1", "SRDS2")
    backups = json.loads(ctl(d, "display", "backups").stdout)
    # the empty structures were given empty slots at once, to let the log be trimmed
    assert {b["structure"]: b["rows"] for b in backups} == {"MSGQ01": 300, "MSGQ01OV": 0,
                                                            "SMALL": 0}
    assert d.events("log_trimmed"), "segments wholly behind the checkpoint were not trimmed"
    c = cqsclient.connect(d.address, client="A")
    s = c.structure("MSGQ01")
    for _ in range(10):
        s.delete(s.read("Q").entry_id)
    later = s.put("Q", b"after the checkpoint")
    held = s.read("Q")
    d.kill()
    c.close()
    d.restart()
    rebuilt = [e for e in d.events("structure_rebuilt") if e["structure"] == "MSGQ01"][-1]
    assert rebuilt["source"] == "srds"
    got = contents(d.address)
    assert [eid for eid, _, _ in got] == first[10:] + [later]
    assert got[0] == (held.entry_id, held.data, 1)  # locked at the crash: back at its place


def test_checkpointing_a_primary_checkpoints_its_overflow_structure_too(make_daemon):
    """cqsctl checkpoint MSGQ01 checkpoints the pair: MSGQ01OV is taken in the same
    run, each time, so the two stay on the same slot, and display backups lists both."""
    d = make_daemon(JOBS).start()
    for slot in ("SRDS1", "SRDS2"):
        done = ctl(d, "checkpoint", "MSGQ01")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert (report["slot"], report["overflow"]["structure"],
                report["overflow"]["slot"]) == (slot, "MSGQ01OV", slot)
    backups = json.loads(ctl(d, "display", "backups").stdout)
    for name in ("MSGQ01", "MSGQ01OV"):  # newest first
        assert [b["slot"] for b in backups if b["structure"] == name] == ["SRDS2", "SRDS1"]
    text = subprocess.run([sys.executable, "-m", "cqsclient.ctl", "--address", d.address,
                           "checkpoint", "MSGQ01"], capture_output=True, text=True, timeout=300)
    assert "checkpoint of MSGQ01 in SRDS1" in text.stdout and "MSGQ01OV in SRDS1" in text.stdout


def test_crash_restart_uses_the_spark_job_for_a_long_tail(make_daemon):
    """With spark_recovery_records = 0 every tail is long: the recovery job folds it."""
    d = make_daemon(JOBS + "spark_recovery_records = 0\n", structures=ONE).start()
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure("MSGQ01")
        kept = s.put_batch("Q", [b"a", b"b", b"c"])
        s.delete(s.read("Q").entry_id)
        c.checkpoint("MSGQ01")
        more = s.put("Q", b"d")
    d.kill()
    d.start(timeout=180)  # a JVM starts before the daemon is ready
    assert d.events("spark_recovery_done")
    assert [eid for eid, _, _ in contents(d.address)] == kept[1:] + [more]


def test_recover_fails_the_structure_meanwhile_and_keeps_live_locks(make_daemon):
    """RECOVER CFSTRUCT: requests on the structure get STRUCTURE_FAILED while the job
    runs, other structures carry on, the recoverable content comes back, a registered
    client keeps its lock, and non-recoverable messages are gone."""
    d = make_daemon(JOBS).start()
    holder = cqsclient.connect(d.address, client="HOLDER")
    s = holder.structure("MSGQ01")
    ids = s.put_batch("Q", [b"1", b"2", b"3"])
    holder.checkpoint("MSGQ01")
    ids.append(s.put("Q", b"4"))
    s.put("Q", b"lost", recoverable=False)
    held = s.read("Q")
    result = {}
    operator = cqsclient.connect(d.address, client="OPER")
    t = threading.Thread(target=lambda: result.update(operator.recover("MSGQ01")))
    t.start()
    d.wait_for("structure_failed")
    with cqsclient.connect(d.address, client="OTHER") as c:
        with pytest.raises(CQSError) as failed:
            c.structure("MSGQ01").put("Q", b"refused")
        assert failed.value.reason == "STRUCTURE_FAILED"
        assert c.structure("SMALL").put("Q", b"carries on")
        assert {r["name"]: r["status"] for r in c.query("structures")}["MSGQ01"] == "failed"
    t.join(300)
    assert result["source"] == "checkpoint and log" and result["messages"] == 4
    s.delete(held.entry_id)  # still held by the client that read it
    assert [eid for eid, _, _ in contents(d.address)] == ids[1:]
    holder.close()
    operator.close()


def test_an_operator_fails_a_structure_for_a_drill_and_recover_ends_it(make_daemon):
    """cqsctl fail (MQ's RESET CFSTRUCT ACTION(FAIL)): the structure's requests get
    STRUCTURE_FAILED, a read waiting on it too, other structures carry on, and it stays
    failed across a restart; cqsctl recover brings back its recoverable messages from
    the checkpoint and the log."""
    d = make_daemon(JOBS, structures=ONE + SMALL + PAIR).start()
    app, waiter = (cqsclient.connect(d.address, client=n) for n in ("APP", "WAITER"))
    s = app.structure("MSGQ01")
    kept = s.put("Q", b"recoverable")
    s.put("Q", b"not logged", recoverable=False)
    outcome = {}

    def wait():
        try:
            waiter.structure("MSGQ01").read("EMPTY", wait=60)
        except CQSError as err:
            outcome["reason"] = err.reason

    reader = threading.Thread(target=wait)
    reader.start()
    wait_until_waiting(app, "EMPTY", 1)
    failed = ctl(d, "fail", "MSGQ01")
    assert failed.returncode == 0, failed.stderr
    assert json.loads(failed.stdout) == {"structure": "MSGQ01", "status": "failed",
                                         "messages": 2}
    reader.join(30)
    assert outcome == {"reason": "STRUCTURE_FAILED"}
    with pytest.raises(CQSError) as refused:
        s.put("Q", b"refused")
    assert refused.value.reason == "STRUCTURE_FAILED"
    assert app.structure("SMALL").put("Q", b"carries on")
    assert {r["name"]: r["status"] for r in app.query("structures")}["MSGQ01"] == "failed"
    assert "STRUCTURE_FAILED" in ctl(d, "fail", "MSGQ01").stderr
    overflow = ctl(d, "fail", "PRIMOV")
    assert overflow.returncode == 1 and "fail PRIM," in overflow.stderr
    d.wait_for("structure_failed", why="operator fail")
    app.close()
    waiter.close()
    d.stop()
    before = d.mark()
    d.restart()
    assert d.events("structure_failed", before, structure="MSGQ01", why="operator fail")
    assert "STRUCTURE_FAILED" in ctl(d, "put", "MSGQ01", "Q", "refused").stderr
    recovered = ctl(d, "recover", "MSGQ01")
    assert recovered.returncode == 0, recovered.stderr
    assert contents(d.address) == [(kept, b"recoverable", 0)]
    d.stop()
    d.restart()  # recovered for good
    assert contents(d.address) == [(kept, b"recoverable", 0)]


def test_recover_purge_empties_it_for_good(make_daemon):
    """--purge empties the structure; neither a checkpoint nor the log brings anything
    back, even after a crash."""
    d = make_daemon(JOBS).start()
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure("MSGQ01")
        old = s.put_batch("Q", [b"x", b"y"])
        c.checkpoint("MSGQ01")
        s.put("Q", b"z")
    done = ctl(d, "recover", "MSGQ01", "--purge")
    assert done.returncode == 0, done.stderr
    assert contents(d.address) == []
    with cqsclient.connect(d.address, client="A") as c:
        new = c.structure("MSGQ01").put("Q", b"after the purge")
    assert new > max(old)
    d.kill()
    d.restart()
    assert [eid for eid, _, _ in contents(d.address)] == [new]


PACE = 0.005  # seconds a live-load worker waits before each request: ~200 requests/s each


def test_checkpoint_under_live_load_loses_nothing(make_daemon):
    """Workers keep putting, reading and committing while a checkpoint runs; a
    recovery from it plus the log holds every acknowledged operation. (One job
    under load: each more is a minute of a loaded 2-core machine, and the
    operator's checkpoint is the same job, tested on its own above. The workers
    pace themselves: flat out, three of them and the daemon kept Spark's JVM off
    both cores, and the job took three minutes under CI's other tests.)"""
    d = make_daemon(JOBS + 'checkpoint_log_volume = "256KiB"\n').start()
    procs, journals, stop = start_workers(d, 3, seed=7, pace=PACE)
    try:
        d.wait_for("checkpoint_taken", timeout=180, structure="MSGQ01")  # the volume trigger
    finally:
        stop.touch()
        for p in procs:
            p.wait(60)
    with cqsclient.connect(d.address, client="OPER") as c:
        c.recover("MSGQ01")
    puts, _, _ = check(journals, survivors(d))
    assert puts > 50
    assert any(e["why"] == "log_volume" for e in d.events("checkpoint_started"))


PAYLOAD = 1000  # bytes a put carries; its log record is a few dozen bytes more
PUTS = 32  # a run's puts: an eighth of the volume, so no run logs it alone
VOLUME, SEGMENT = 240_000, 64 * 1024
OFTEN = (f'spark_master = "local[2]"\nlog_segment = {SEGMENT}\n'
         f"checkpoint_log_volume = {VOLUME}\ncheckpoint_interval = 0\n{NO_WINDOW}")


def put_some(d, n: int) -> list[int]:
    with cqsclient.connect(d.address, client="A") as c:
        s = c.structure("MSGQ01")
        return [s.put("Q", b"%06d" % i + b"x" * PAYLOAD) for i in range(n)]


def test_restart_replay_stays_bounded_when_the_daemon_is_killed_often(make_daemon):
    """A daemon SIGKILLed after every few dozen puts, long before a checkpoint job could
    finish, replays at each restart no more than the volume plus one run's records
    and a segment, however many times it restarts: a restart that folded the volume
    saves the structure as its crash-recovery base at once."""
    d = make_daemon(OFTEN, structures=ONE)
    replayed, seconds, acked = [], [], []
    for _ in range(20):
        run = d.mark()
        began = time.monotonic()
        d.start()
        seconds.append(round(time.monotonic() - began, 2))
        (rebuilt,) = d.events("structure_rebuilt", after=run)
        replayed.append(rebuilt["records_replayed"])
        acked += put_some(d, PUTS)
        if d.events("base_image_due", after=run):
            d.wait_for("base_image_saved", after=run)
        d.kill()
    print(f"records replayed per restart {replayed}\nseconds to ready {seconds}")
    bound = (VOLUME + SEGMENT) // PAYLOAD + PUTS
    assert max(replayed) <= bound, f"a restart replayed more than {bound} records"
    assert len(d.events("base_image_saved")) >= 2
    d.start()
    assert [eid for eid, _, _ in contents(d.address)] == acked


def test_a_checkpoint_a_crash_interrupted_starts_again_at_the_next_start(make_daemon):
    """The volume is reached, its checkpoint starts, and the daemon is SIGKILLed while
    the job runs: the job ends with it, and the next start owes the checkpoint from
    the log and the slots on disk, so it takes it at once and trims the log."""
    d = make_daemon(OFTEN, structures=ONE).start()
    acked = put_some(d, VOLUME // PAYLOAD + 10)
    d.wait_for("checkpoint_started", why="log_volume")
    d.kill()
    run = d.mark()
    d.start()
    assert d.events("checkpoint_due", after=run, why="log_volume")
    taken = d.wait_for("checkpoint_taken", after=run, timeout=120)
    assert taken[0]["rows"] == len(acked)
    d.wait_for("log_trimmed", after=run)
    assert not d.events("checkpoint_failed")  # the interrupted job left no lock behind
    assert [eid for eid, _, _ in contents(d.address)] == acked



def test_several_structures_recover_together_and_one_that_fails_stays_failed(make_daemon):
    """cqsctl recover with a list runs one recovery job for them all (RECOVER CFSTRUCT
    of a list): the pair (with its overflow structure) and SMALL come back with their
    recoverable messages, while ONE, whose checkpoint manifest is damaged, is named,
    stays failed and makes cqsctl exit 1, never half-recovered."""
    d = make_daemon(JOBS, structures=PAIR + SMALL + ONE).start()
    with cqsclient.connect(d.address, client="A") as c:
        kept = c.structure("PRIM").put("Q", b"in PRIM")
        c.structure("PRIM").put("Q", b"lost", recoverable=False)
        small = c.structure("SMALL").put("Q", b"in SMALL")
        c.structure("MSGQ01").put("Q", b"in ONE")
    damaged = d.data / "srds" / "MSGQ01"
    damaged.mkdir(parents=True, exist_ok=True)
    (damaged / "manifest.json").write_text("{damaged")
    done = ctl(d, "recover", "PRIM", "SMALL", "MSGQ01")
    assert done.returncode == 1
    assert "STRUCTURE_FAILED" in done.stderr and "MSGQ01" in done.stderr
    result = json.loads(done.stdout)
    assert [r["structure"] for r in result["recovered"]] == ["PRIM", "SMALL"]
    assert list(result["failed"]) == ["MSGQ01"] and "ManifestError" in result["failed"]["MSGQ01"]
    assert len(d.events("job_started", kind="recover")) == 1
    assert d.events("job_started", kind="recover")[0]["structure"] == "PRIM,PRIMOV,SMALL,MSGQ01"
    assert [e for e, _, _ in contents(d.address, structure="PRIM")] == [kept]
    assert [e for e, _, _ in contents(d.address, structure="SMALL")] == [small]
    with cqsclient.connect(d.address, client="A") as c:
        status = {r["name"]: r["status"] for r in c.query("structures")}
    assert status["MSGQ01"] == "failed" and status["PRIM"] == status["SMALL"] == "available"
