"""A recoverable 100 MiB put against a non-recoverable one (issue 28).

An offloaded recoverable message larger than a log record is logged block by
block over several records before its entry's (docs/smds.md, "The record
limit"); a non-recoverable one is written to its data set only. For each kind,
alternating, on one daemon whose structure offloads to a data set big enough
for every put: the put's wall time as the client sees it (acknowledged), the
log bytes it added (the records' frames, scanned), and the bytes the daemon
caused to be written (/proc/PID/io write_bytes: log and data set), and the
daemon's peak RSS at the end. One JSON line per kind, then the ratios.

    .venv/bin/python benchmarks/large_put.py                 # 3 rounds of 100 MiB
    .venv/bin/python benchmarks/large_put.py --mib 50 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import _durability_servers as servers
import _procs
from smds import written_bytes

import cqsclient
from logstream.scan import scan_to_end
from logstream.series import list_segments

MiB = 1024 * 1024


def log_bytes(data: Path) -> int:
    """Bytes of records in the daemon's log (each segment scanned to its end)."""
    return sum(scan_to_end(seg, last=False).end_offset
               for seg in list_segments(data / "logstream", "cqsd"))


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100, help="message size (MiB)")
    parser.add_argument("--rounds", type=int, default=3, help="puts of each kind")
    args = parser.parse_args()
    where = Path(tempfile.mkdtemp(prefix="cqlarge"))
    dssize = (args.mib + 1) * 2 * args.rounds + 64
    config = _procs.cqsd_config(where, 4, "16MiB", "checkpoint_interval = 0\n"
                                "checkpoint_log_volume = 0\n",
                                f'offload = "smds"\ndssize = "{dssize}MiB"\n')
    data = os.urandom(args.mib * MiB)
    figures: dict[bool, list[tuple[float, int, int]]] = {True: [], False: []}
    try:
        with servers.daemon(config) as d:
            d.start()
            with cqsclient.connect(d.address, client="LARGE") as c:
                s = c.structure("MSGQ01")
                for _ in range(args.rounds):
                    for recoverable in (True, False):
                        log0, io0 = log_bytes(where / "data"), written_bytes(d.proc.pid)
                        started = time.perf_counter()
                        s.put("L", data, recoverable=recoverable)
                        seconds = time.perf_counter() - started
                        figures[recoverable].append((seconds, log_bytes(where / "data") - log0,
                                                     written_bytes(d.proc.pid) - io0))
            rss = peak_rss_mib(d.proc.pid)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    medians = {}
    for recoverable, rows in figures.items():
        medians[recoverable] = [statistics.median(r[i] for r in rows) for i in range(3)]
        seconds, logged, written = medians[recoverable]
        print(json.dumps({"recoverable": recoverable, "mib": args.mib, "rounds": args.rounds,
                          "seconds": round(seconds, 3), "log_mib": round(logged / MiB, 2),
                          "written_mib": round(written / MiB, 2),
                          "daemon_peak_rss_mib": round(rss)}))
    print(json.dumps({"recoverable_vs_not_seconds": round(medians[True][0] / medians[False][0], 2),
                      "recoverable_vs_not_written": round(medians[True][2] / medians[False][2],
                                                          2)}))


if __name__ == "__main__":
    main()
