"""Checkpoint pause: put latency while a structure checkpoint runs, against without.

IMS quiesces a structure for its checkpoint; cqsd does not (the Spark job folds
the previous slot and the log in a child process on idle CPU only). Target: p99 put latency
during a checkpoint at most 2x the p99 without one.

    .venv/bin/python benchmarks/checkpoint_pause.py [--preload 200000] [--seconds 5]

One client puts recoverable 1 KiB messages one at a time (each waits for its
fsync) on a structure preloaded with --preload messages, first for --seconds
without a checkpoint, then for as long as a checkpoint of it takes.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cqsclient

PAYLOAD = b"x" * 1024


def start_daemon(root: Path) -> tuple[subprocess.Popen, str]:
    sock = root / "s"
    config = root / "cqsd.toml"
    config.write_text(
        f'[daemon]\ndata_dir = "{root / "data"}"\nsocket = "{sock}"\n'
        'spark_master = "local[2]"\ncheckpoint_interval = 0\ncheckpoint_log_volume = 0\n'
        '[[structure]]\nname = "MSGQ01"\nsize = "2GiB"\n'
    )
    proc = subprocess.Popen([sys.executable, "-m", "cqsd", "run", "--config", str(config)],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if '"ready"' in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
            return proc, f"unix://{sock}"
    raise RuntimeError("the daemon did not start")


def put_latencies(s, until) -> list[float]:
    samples = []
    while not until():
        t0 = time.perf_counter()
        s.put("BENCH", PAYLOAD)
        samples.append(time.perf_counter() - t0)
    return samples


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preload", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cqbench") as tmp:
        proc, address = start_daemon(Path(tmp))
        try:
            with cqsclient.connect(address, client="LOAD") as c, \
                    cqsclient.connect(address, client="OPER") as operator:
                s = c.structure("MSGQ01")
                for _ in range(0, args.preload, 10_000):
                    s.put_batch("PRELOAD", [PAYLOAD] * 10_000)
                end = time.monotonic() + args.seconds
                quiet = put_latencies(s, lambda: time.monotonic() > end)
                report = {}
                job = threading.Thread(target=lambda: report.update(operator.checkpoint("MSGQ01")))
                job.start()
                during = put_latencies(s, lambda: not job.is_alive())
        finally:
            proc.terminate()
            proc.wait(60)
    ms = lambda v: round(v * 1000, 3)  # noqa: E731
    print(json.dumps({
        "preloaded": args.preload,
        "checkpoint_rows": report.get("rows"), "checkpoint_seconds": report.get("seconds"),
        "without": {"puts": len(quiet), "p50_ms": ms(percentile(quiet, 50)),
                    "p99_ms": ms(percentile(quiet, 99))},
        "during": {"puts": len(during), "p50_ms": ms(percentile(during, 50)),
                   "p99_ms": ms(percentile(during, 99))},
        "p99_ratio": round(percentile(during, 99) / percentile(quiet, 99), 2),
    }, indent=2))


if __name__ == "__main__":
    main()
