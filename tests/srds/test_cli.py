"""``python -m cqsd.srds`` and ``spark-submit cqsd/srds/__main__.py`` as the daemon runs
them: exit codes, the result line, error events, and a job killed midway.

Most fail, or report, before any Spark is needed; the others start a JVM of
their own.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import logstream
from cqsd.srds import jobs, manifest, slots
from cqsd.srds.__main__ import NICE

ROOT = Path(__file__).resolve().parents[2]
S = "MSGQ01"


def run(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cqsd.srds", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, check=False, **kw)


def last_event(stderr: str) -> dict:
    return json.loads(stderr.strip().splitlines()[-1])


def fill(data_dir: Path, first: int, count: int, size: int = 1024) -> None:
    """Log ``count`` puts of ``size`` bytes, ids from ``first``, as the daemon would."""
    with logstream.Writer.open(data_dir / "logstream", "cqsd", segment_size=1 << 20) as w:
        for i in range(first, first + count):
            w.append({"s": S, "e": [["P", i, 1, "Q", b"%08d" % i * (size // 8), i]]})


def test_a_wrong_command_line_exits_2():
    """Usage errors (no structure, a cut that is not WRITER=LSN) exit 2 before any work."""
    assert run("checkpoint").returncode == 2
    bad_cut = run("checkpoint", "--structure", S, "--cut", "cqsd:5")
    assert bad_cut.returncode == 2 and "WRITER=LSN" in bad_cut.stderr


def test_a_bad_structure_name_fails_with_an_error_event_naming_it(tmp_path):
    """Exit 1, nothing on stdout, and a structlog error event whose error names it."""
    done = run("recover", "--structure", "../etc", "--data-dir", str(tmp_path))
    assert done.returncode == 1 and done.stdout == ""
    event = last_event(done.stderr)
    assert event["level"] == "error" and "'../etc'" in event["error"]


def test_report_prints_one_json_result_line(tmp_path):
    """report needs no Spark: its result is the last line of stdout."""
    fill(tmp_path, 1, 3)
    done = run("report", "--structure", S, "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["slots"] == [] and result["tail"]["cqsd"]["records"] == 3


def test_a_job_given_a_priority_lowers_its_own(tmp_path):
    """``--priority``: the job puts itself below the daemon (nice), or on idle CPU only
    as well (SCHED_IDLE), and the JVM it starts inherits both; so the daemon starts
    it without a ``preexec_fn``, which would fork the threaded daemon."""
    fill(tmp_path, 1, 3)
    code = ("import os, sys; from cqsd.srds.__main__ import main; "
            "rc = main(['report', '--structure', 'MSGQ01', '--data-dir', sys.argv[1], "
            "'--priority', sys.argv[2]]); "
            "print(rc, os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    niced = min(19, base + NICE)
    for priority, nice, policy in (("normal", base, os.SCHED_OTHER),
                                   ("nice", niced, os.SCHED_OTHER),
                                   ("idle", niced, os.SCHED_IDLE)):
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path), priority],
                              capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1].split() == ["0", str(nice), str(policy)]


def test_a_checkpoint_killed_midway_leaves_the_old_slot_current(spark, tmp_path):
    """SIGKILL to the job (driver, JVM and workers) while Spark writes the new slot:
    the manifest is untouched, the old slot is still valid and recoverable, and
    the next checkpoint clears what the dead one left."""
    fill(tmp_path, 1, 500)
    jobs.checkpoint(spark, tmp_path, S)
    before = (tmp_path / "srds" / S / manifest.NAME).read_bytes()
    fill(tmp_path, 501, 3_000)
    job = subprocess.Popen(
        [sys.executable, "-m", "cqsd.srds", "checkpoint", "--structure", S, "--data-dir",
         str(tmp_path), "--master", "local[2]"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        staging = wait_for(lambda: [p for p in (tmp_path / "srds" / S).iterdir()
                                    if p.name.startswith(slots.STAGING_PREFIX)], job)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert staging, "the job ended before it was killed"
    assert (tmp_path / "srds" / S / manifest.NAME).read_bytes() == before
    assert [s.name for s in slots.valid_slots(tmp_path / "srds", S)] == ["SRDS1"]
    assert len(slots.read_rows(slots.valid_slots(tmp_path / "srds", S)[0])) == 500
    assert jobs.checkpoint(spark, tmp_path, S)["rows"] == 3_500
    assert not [p for p in (tmp_path / "srds" / S).iterdir() if p.name.startswith(".")
                and p.name != slots.LOCK_NAME]


def wait_for(found, job: subprocess.Popen, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.poll() is None:
        if result := found():
            return result
        time.sleep(0.01)
    return None


def test_spark_submit_runs_the_same_job(tmp_path):
    """spark-submit cqsd/srds/__main__.py checkpoint ...: same result line."""
    fill(tmp_path, 1, 10)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("spark-submit")), "--master", "local[2]",
         "cqsd/srds/__main__.py", "checkpoint", "--structure", S, "--data-dir", str(tmp_path),
         "--master", "local[2]", "--cut", "cqsd=7"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["slot"], result["rows"], result["lsn"]) == ("SRDS1", 7, {"cqsd": 7})
    assert {"session", "plan", "read", "fold", "commit"} <= set(result["stages"])


def children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()]


def test_a_job_given_its_parent_ends_with_its_jvm_when_the_parent_is_killed(tmp_path):
    """With --parent (as the daemon runs it) a job whose parent is SIGKILLed once its
    JVM runs ends within a second or so, and its JVM with it (one lived on for
    minutes in the fault loop), releasing the structure's lock for the next job."""
    fill(tmp_path, 1, 3)
    parent = subprocess.Popen(
        ["sh", "-c", (f'"{sys.executable}" -m cqsd.srds checkpoint --structure {S} '
                      f"--data-dir {tmp_path} --parent $$ & echo $!; wait")],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    job = int(parent.stdout.readline())
    deadline = time.monotonic() + 120
    while not (jvm := children(job)):  # no event says a child was started: look
        assert time.monotonic() < deadline, "the job started no JVM"
        time.sleep(0.1)
    exited = [os.pidfd_open(pid) for pid in (job, *jvm)]
    try:
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        for fd in exited:
            assert select.select([fd], [], [], max(0, deadline - time.monotonic()))[0], \
                "the job or its JVM outlived the job's parent"
    finally:
        for fd in exited:
            os.close(fd)
    with slots.locked(tmp_path / "srds", S):
        pass  # free


def test_a_job_run_as_the_daemon_runs_it_leaves_nothing_in_its_jvms_temporary_directory(
        tmp_path):
    """With --parent a job kills what is left of its process group as it exits. Its
    JVM exits by itself first, so its shutdown hooks delete the native libraries it
    unpacked and Spark's local directories: killed, it left them in /tmp each job."""
    fill(tmp_path / "data", 1, 10)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = run("checkpoint", "--structure", S, "--data-dir", str(tmp_path / "data"),
               "--parent", str(os.getpid()), "--conf", f"spark.local.dir={scratch}",
               "--conf", f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={scratch}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in scratch.iterdir()) == []


def test_a_job_that_fails_while_its_jvm_starts_leaves_no_jvm(tmp_path):
    """A job whose driver fails before its JVM is up (here libfaketime, as the group's
    fault loop runs nodes, makes the driver's sleep fail with EINVAL) ends its JVM as
    it exits: that JVM never learnt of its driver and lived on for good."""
    clock = tmp_path / "clock"
    clock.write_text("+0\n")
    env = {**os.environ, "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
           "FAKETIME_TIMESTAMP_FILE": str(clock), "FAKETIME_NO_CACHE": "1",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    job = subprocess.Popen([sys.executable, "-m", "cqsd.srds", "checkpoint", "--structure", S,
                            "--data-dir", str(tmp_path), "--parent", str(os.getpid())],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (jvm := children(job.pid)) and job.poll() is None:
        assert time.monotonic() < deadline, "the job started no JVM"
        time.sleep(0.05)
    assert jvm, "the job failed before it started its JVM"
    exited = [os.pidfd_open(pid) for pid in jvm]
    try:
        assert job.wait(60) == 1, job.stderr.read()[-2000:]
        assert "srds_job_failed" in job.stderr.read()
        for fd in exited:
            assert select.select([fd], [], [], 10)[0], "the JVM outlived its failed job"
    finally:
        for fd in exited:
            os.close(fd)


def test_a_jvm_error_is_named_by_its_exception_and_root_cause():
    """A Py4J error's first line only names the failing call: the event gives the Java
    exception under it and the last "Caused by:" of its trace."""
    from cqsd.srds.__main__ import _first_line

    trace = ("An error occurred while calling o304.parquet.\n"
             ": org.apache.spark.SparkException: Task failed while writing rows to file:/x\n"
             "\tat org.apache.spark.A.b(A.scala:1)\n"
             "Caused by: org.apache.hadoop.fs.FSError: java.io.IOException: No space left\n"
             "\tat org.apache.hadoop.C.d(C.java:2)\n"
             "Caused by: java.io.IOException: No space left on device\n")
    assert _first_line(Exception(trace)) == (
        "org.apache.spark.SparkException: Task failed while writing rows to file:/x; "
        "caused by java.io.IOException: No space left on device")
    assert _first_line(ValueError("one line\nand more")) == "one line"
