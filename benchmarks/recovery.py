"""Structure recovery on Spark against the plain-Python fold, and where Spark overtakes it.

For each size N: a log of N recoverable 1 KiB puts, one record each as the daemon
logs them, then a delete of every other one (so 1.5 N records, N/2 messages
left), written by ``logstream.Writer`` with the daemon's 64 MiB segments. Then:

- python: ``cqsd.recovery.fold.fold`` over ``logstream.read`` (what a restart
  does), then the same image the job writes (``image.write_rows``);
- spark: ``python -m cqsd.srds recover --master local[2]`` in its own process,
  as the daemon runs it, with its own stage times: JVM start (``session``),
  ``read`` (decoding segments in Python workers), ``fold`` (shuffle, window,
  Parquet of the result), ``image`` (writing the image on the driver), and the
  CPU seconds of the job's processes (driver, JVM, Python workers): on a shared
  machine, the figure that does not depend on what else runs.

Run: .venv/bin/python benchmarks/recovery.py [--records 100000 300000 1000000]
     [--master local[2]] [--conf spark.driver.memory=2g ...] [--keep DIR]
One JSON line per size on stdout, then a summary (lines starting "# "). Every
line carries the 1-minute load average: the figures are wall clock.
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

import logstream
from cqsd.recovery.fold import fold
from cqsd.storage import image

S = "BENCH"
PAYLOAD = 1024


def write_log(log_dir: Path, puts: int) -> int:
    """N puts, then deletes of the even ids; returns the number of records.

    Payloads are slices of random bytes: a repeated byte would let Spark's
    shuffle and Parquet compression make the job look cheaper than it is.
    """
    noise = os.urandom(1 << 20)
    with logstream.Writer.open(log_dir, "cqsd") as w:
        for i in range(1, puts + 1):
            at = (i * 7919) % (len(noise) - PAYLOAD)
            w.append({"s": S, "e": [["P", i, 1, "TRANX", noise[at:at + PAYLOAD], i]]})
        for i in range(2, puts + 1, 2):
            w.append({"s": S, "e": [["D", i]]})
        return w.appended_lsn


def python_recovery(data_dir: Path) -> dict:
    cpu0, t0 = time.process_time(), time.perf_counter()
    rows: dict[int, list] = {}
    last_id = fold(rows, (r.body for r in logstream.read(data_dir / "logstream")), S)
    t1 = time.perf_counter()
    image.write_rows(data_dir / "python.img", S, (rows[i] for i in sorted(rows)), len(rows),
                     logstream.tail_positions(data_dir / "logstream"), last_id)
    t2 = time.perf_counter()
    return {"rows": len(rows), "read_fold_s": round(t1 - t0, 2), "image_s": round(t2 - t1, 2),
            "total_s": round(t2 - t0, 2), "cpu_s": round(time.process_time() - cpu0, 1)}


def spark_recovery(data_dir: Path, master: str, conf: list[str]) -> dict:
    command = [sys.executable, "-m", "cqsd.srds", "recover", "--structure", S, "--data-dir",
               str(data_dir), "--master", master, "--to-image", str(data_dir / "spark.img")]
    for setting in conf:
        command += ["--conf", setting]
    t0 = time.perf_counter()
    # files, not pipes: nobody reads a pipe while the job runs
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        with subprocess.Popen(command, stdout=out, stderr=err, text=True) as job:
            cpu = cpu_of_tree(job)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    wall = time.perf_counter() - t0
    if job.returncode != 0:
        raise SystemExit(f"the recovery job failed: {stderr.strip().splitlines()[-1:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    stages = result["stages"]
    return {"rows": result["rows"], "total_s": round(wall, 2), "cpu_s": round(cpu, 1),
            "without_jvm_start_s": round(wall - stages["session"], 2),
            **{f"{k}_s": v for k, v in stages.items()}}


def cpu_of_tree(job: subprocess.Popen, every: float = 0.2) -> float:
    """CPU seconds of ``job`` and all its descendants until it ends, sampled every
    ``every`` s (a process's last sample counts, so one that lives less is missed)."""
    root, seen = psutil.Process(job.pid), {}
    while job.poll() is None:
        with contextlib.suppress(psutil.Error):
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = p.cpu_times()
                    seen[p.pid] = times.user + times.system
        time.sleep(every)
    return sum(seen.values())


def measure(puts: int, master: str, conf: list[str], keep: Path | None) -> dict:
    data_dir = Path(tempfile.mkdtemp(prefix="cqsd-recovery-", dir=keep))
    try:
        t0 = time.perf_counter()
        records = write_log(data_dir / "logstream", puts)
        written = time.perf_counter() - t0
        python = python_recovery(data_dir)
        spark = spark_recovery(data_dir, master, conf)
        if image.read_rows(data_dir / "spark.img", S)[1] != image.read_rows(
                data_dir / "python.img", S)[1]:
            raise SystemExit(f"at {puts} puts the Spark and Python images differ")
        return {
            "puts": puts, "records": records, "rows": python["rows"],
            "log_mib": round(sum(p.stat().st_size for p in (data_dir / "logstream").iterdir())
                             / 2**20),
            "log_write_s": round(written, 2),
            "python": {**python, "records_per_s": round(records / python["total_s"])},
            "spark": {**spark, "records_per_s": round(records / spark["total_s"]),
                      "records_per_s_without_jvm_start": round(
                          records / spark["without_jvm_start_s"])},
            "spark_over_python": round(spark["total_s"] / python["total_s"], 2),
            "load": round(os.getloadavg()[0], 2),
        }
    finally:
        if keep is None:
            shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[100_000, 300_000, 1_000_000],
                        help="puts per log (each size is a separate run)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--conf", action="append", default=[], help="a Spark setting, KEY=VALUE")
    parser.add_argument("--keep", type=Path, help="make the logs under DIR and keep them")
    args = parser.parse_args()
    results = []
    for puts in args.records:
        result = measure(puts, args.master, args.conf, args.keep)
        print(json.dumps(result), flush=True)
        results.append(result)
    for r in results:
        print(f"# {r['puts']:>9,} puts, {r['records']:>9,} records: python {r['python']['total_s']}"
              f" s, spark {r['spark']['total_s']} s, {r['spark']['cpu_s']} CPU-s"
              f" (JVM start {r['spark']['session_s']} s,"
              f" read {r['spark']['read_s']}, fold {r['spark']['fold_s']},"
              f" image {r['spark']['image_s']}), load {r['load']}")
    faster = [r["puts"] for r in results if r["spark_over_python"] < 1]
    print(f"# spark is faster from {min(faster):,} puts" if faster else
          "# spark is not faster at any size measured")


if __name__ == "__main__":
    main()
