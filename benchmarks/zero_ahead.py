"""A small group commit into preallocated space against one into zeros written ahead.

The log's segments are preallocated (posix_fallocate: unwritten extents), so the
first record in a block changes the extent map and its commit's fdatasync writes
the inode too; a writer opened with ``zero_ahead`` keeps the blocks ahead written
(docs/logstream.md, "Zeroing ahead"). This times one writer's commits of one
record each, the daemon's small-commit case, both ways, alternating.

Run: .venv/bin/python benchmarks/zero_ahead.py [--commits 2000] [--size 3000] [--rounds 2]
in the data directory's file system (``--dir``, default the working directory's).
One JSON line per run: wall µs per commit (p50, mean), the process's CPU µs per
commit (the zeroing thread's included), and bytes written per commit
(/proc/self/io write_bytes).
"""

import argparse
import json
import os
import statistics
import tempfile
import time

from smds import written_bytes

from cqsd.server.journal import ZERO_AHEAD  # also chooses logstream's build first
from logstream import Writer


def run(directory: str, zero_ahead: int, commits: int, size: int) -> dict:
    body = b"x" * size
    with tempfile.TemporaryDirectory(dir=directory) as where, \
            Writer.open(where, "bench", zero_ahead=zero_ahead) as w:
        w.append(body)
        w.flush()  # a small commit: the zeros are asked for
        if zero_ahead and not w.wait_zeroed(60):
            raise RuntimeError("the zeros were not in place within 60 s")
        samples = []
        cpu, disk = time.process_time_ns(), written_bytes(os.getpid())
        for _ in range(commits):
            started = time.perf_counter_ns()
            w.append(body)
            w.flush()
            samples.append(time.perf_counter_ns() - started)
        cpu, disk = time.process_time_ns() - cpu, written_bytes(os.getpid()) - disk
        zeros = w.stats().zero_bytes
    return {"bench": "zero_ahead", "zero_ahead": zero_ahead, "commits": commits,
            "record": size, "p50_us": round(statistics.median(samples) / 1000, 1),
            "mean_us": round(statistics.mean(samples) / 1000, 1),
            "cpu_us": round(cpu / commits / 1000, 1),
            "written_per_commit": round(disk / commits), "zero_bytes": zeros}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commits", type=int, default=2000)
    p.add_argument("--size", type=int, default=3000, help="bytes a record carries")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dir", default=".", help="where the log's files go")
    args = p.parse_args()
    for _ in range(args.rounds):
        for ahead in (0, ZERO_AHEAD):
            print(json.dumps(run(args.dir, ahead, args.commits, args.size)), flush=True)


if __name__ == "__main__":
    main()
