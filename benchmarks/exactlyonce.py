"""What exactly-once puts cost (issue 27): W1, 1 KiB recoverable puts one at a
time per client (every put waits for its fsync), by 4 producer processes on one
daemon, with idempotency keys (the SDK's default against a daemon whose
``dedup_window`` is on) and without (the same SDK told to send none), in
alternating rounds of one run. Each line gives puts per second and the daemon's
CPU per put (user + system over the window, /proc/PID/stat).

Then the memory a remembered key takes: tracemalloc over 100,000 keys put into
the dedup memory (cqsd/dedup.py) as the daemon holds them, an incarnation string
decoded per request, a client name shared; per client, the window costs that
times its put rate times ``dedup_window``.

Run: .venv/bin/python benchmarks/exactlyonce.py [--rounds 3] [--seconds 10]
One JSON line per phase on stdout, then the medians (lines starting "# ").
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import traceback
import tracemalloc
from pathlib import Path
from typing import Any

import _durability_clients as clients
import _procs
from durability import Window, run_processes

PRODUCERS = 4
MODES = ("keys", "no keys")
WINDOW = 120  # seconds: the default dedup_window


def producer(address: str, index: int, queue: str, mode: str, seconds: float, reports: Any,
             start: Any) -> None:
    """Put 1 KiB recoverable messages one at a time for *seconds*; report how many."""
    import cqsclient

    with cqsclient.connect(address, client=f"PROD{index}") as c:
        assert c._keys.window == WINDOW  # the daemon takes keys
        if mode == "no keys":
            c._keys.window = 0  # what a client of a daemon without dedup_window sends
        s = c.structure(clients.STRUCTURE)
        reports.put(("ready", index))
        start.wait(clients.START_TIMEOUT)
        done, stop = 0, time.monotonic() + seconds
        while time.monotonic() < stop:
            s.put(queue, clients.payload(index, done))
            done += 1
    reports.put(("done", index, "put", done))


def phase(address: str, pid: int, mode: str, queue: str, seconds: float) -> dict:
    window = Window(pid)
    done = run_processes(_run, [(address, i, queue, mode, seconds) for i in range(PRODUCERS)],
                         seconds + 60, window)
    puts = sum(d[3] for d in done)
    return {"bench": "exactlyonce", "mode": mode, "seconds": round(window.seconds, 2),
            "puts": puts, "puts_per_s": round(puts / window.seconds, 1),
            "server_cpu_us_per_put": round(window.server / max(puts, 1) * 1e6, 1),
            "loadavg_1m": os.getloadavg()[0]}


def _run(*args: Any) -> None:
    reports = args[-2]
    try:
        producer(*args)
    except BaseException:
        reports.put(("error", args[1], traceback.format_exc()))


def bytes_per_key(n: int = 100_000) -> float:
    """Bytes of memory one remembered key holds, as the daemon keeps it."""
    from cqsd.dedup import Remembered

    memory = Remembered(WINDOW)
    client, incarnation = "PROD1", secrets.token_hex(8)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for seq in range(n):
        fresh = "".join(incarnation)  # a new str per request, as msgpack decodes it
        memory.remember((client, fresh, seq + 1_000_000), [seq + 10**18], time.time_ns())
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(memory) == n
    return used / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    lines: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cqsonce") as tmp, \
            _procs.cqsd(Path(tmp), PRODUCERS + 2, daemon_keys=f"dedup_window = {WINDOW}\n") as d:
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                record = phase(d.address, d.pid, mode, f"ONCE{r}{MODES.index(mode)}",
                               args.seconds) | {"round": r + 1}
                lines.append(record)
                print(json.dumps(record), flush=True)
    medians = {}
    for mode in MODES:
        mine = [x for x in lines if x["mode"] == mode]
        medians[mode] = statistics.median(x["puts_per_s"] for x in mine)
        print(f"# {mode}: median {medians[mode]:.0f} puts/s, "
              f"{statistics.median(x['server_cpu_us_per_put'] for x in mine):.0f} µs daemon "
              f"CPU/put over {len(mine)} rounds")
    print(f"# keys cost {100 * (1 - medians['keys'] / medians['no keys']):.1f}% of W1 "
          "throughput (target: at most 5%)")
    per_key = bytes_per_key()
    print(json.dumps({"bench": "exactlyonce", "bytes_per_key": round(per_key)}))
    print(f"# a remembered key: {per_key:.0f} bytes; a client putting 100/s holds "
          f"{per_key * 100 * WINDOW / 2**20:.1f} MiB over a {WINDOW} s window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
