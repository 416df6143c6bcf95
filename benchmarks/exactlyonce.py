"""What exactly-once puts cost (issue 27): W1, 1 KiB recoverable puts one at a
time per client (every put waits for its fsync), by 4 producer processes on one
daemon, with idempotency keys (the SDK's default against a daemon whose
``dedup_window`` is on) and without (the same SDK told to send none), in
alternating rounds of one run. Each line gives puts per second and the daemon's
CPU per put (user + system over the window, /proc/PID/stat).

On a loaded 2-core machine the rates swing more than the cost, so it also
times, in process, what a key adds to a put on the daemon's path (checking it,
looking it up, writing it into the record and remembering it, and packing the
longer record) against that put's daemon CPU.

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


def hot_path_us(n: int = 200_000) -> tuple[float, float]:
    """Microseconds a key adds to one put in the daemon: the dedup room's calls, and
    packing the record's key field (logstream packs every record body)."""
    from types import SimpleNamespace

    import msgpack

    from cqsd.server.dedup import Dedup

    dedup, session = Dedup(WINDOW), SimpleNamespace(client="PROD1")
    incarnation = secrets.token_hex(8)
    record = {"s": "MSGQ01", "e": [["P", 10**18, 1, "ONCE0", b"x" * 1024, time.time_ns()]]}
    t0 = time.process_time()
    for seq in range(n):
        key = dedup.key(session, "put", [incarnation, seq])  # type: ignore[arg-type]
        dedup.recall("MSGQ01", key)
        dedup.note("MSGQ01", key, [10**18 + seq])
        noted = dedup.stamp("MSGQ01", dict(record))
        dedup.remember("MSGQ01", noted, seq)  # type: ignore[arg-type]
    calls = (time.process_time() - t0) / n * 1e6
    keyed = dict(record, k=["PROD1", incarnation, 12345, [10**18]])
    t0 = time.process_time()
    for _ in range(n):
        msgpack.packb(record, use_bin_type=True)
    plain = time.process_time() - t0
    t0 = time.process_time()
    for _ in range(n):
        msgpack.packb(keyed, use_bin_type=True)
    packing = (time.process_time() - t0 - plain) / n * 1e6
    return calls, packing


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
    calls, packing = hot_path_us()
    cpu = statistics.median(x["server_cpu_us_per_put"] for x in lines if x["mode"] == "no keys")
    print(json.dumps({"bench": "exactlyonce", "key_calls_us": round(calls, 2),
                      "key_packing_us": round(packing, 2)}))
    print(f"# a key adds {calls + packing:.1f} µs to a put in the daemon ({calls:.1f} dedup, "
          f"{packing:.1f} packing): {100 * (calls + packing) / cpu:.1f}% of its {cpu:.0f} µs")
    per_key = bytes_per_key()
    print(json.dumps({"bench": "exactlyonce", "bytes_per_key": round(per_key)}))
    print(f"# a remembered key: {per_key:.0f} bytes; a client putting 100/s holds "
          f"{per_key * 100 * WINDOW / 2**20:.1f} MiB over a {WINDOW} s window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
