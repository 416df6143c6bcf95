"""What a delete that delivers the next message saves (issue 18): consumers that
``read`` then ``delete`` (two round trips a message) against consumers that
``delete_and_read`` (one: the ack carries the next read, falling back to a
``read`` with ``wait`` when it brings nothing), on one daemon, in one run.

4 producer and 4 consumer processes, 1 KiB recoverable messages, one request
at a time per client (every put and delete waits for its fsync). Each round
runs both modes, in alternating order, for ``--seconds`` each, on a queue of
their own; each line gives messages consumed per second, the producers' rate,
and the daemon's CPU per message: its user + system time over the window
(/proc/PID/stat) divided by the messages moved, counted as (puts + deletes) / 2
so that a backlog growing on either side is not charged to the other.

Run: .venv/bin/python benchmarks/acknext.py [--rounds 3] [--seconds 10]
One JSON line per phase on stdout, then the medians (lines starting "# ").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _durability_clients as clients
import _procs
from durability import Window, run_processes

PRODUCERS = CONSUMERS = 4
READ_WAIT = 1.0  # seconds a consumer's read waits on the daemon when the queue is empty
MODES = ("read+delete", "delete_and_read")


@contextlib.contextmanager
def _started(address: str, client: str, index: int, reports: Any, start: Any) -> Iterator[Any]:
    """A handle on the structure, once connected, said ready and started."""
    import cqsclient

    with cqsclient.connect(address, client=client) as c:
        s = c.structure(clients.STRUCTURE)
        reports.put(("ready", index))
        start.wait(clients.START_TIMEOUT)
        yield s


def producer(address: str, index: int, queue: str, seconds: float, reports: Any,
             start: Any) -> None:
    """Put 1 KiB recoverable messages one at a time for *seconds*; report how many."""
    with _started(address, f"PROD{index}", index, reports, start) as s:
        done, stop = 0, time.monotonic() + seconds
        while time.monotonic() < stop:
            s.put(queue, clients.payload(index, done))
            done += 1
    reports.put(("done", index, "put", done))


def consumer(address: str, index: int, queue: str, mode: str, seconds: float, reports: Any,
             start: Any) -> None:
    """Consume for *seconds*, one message at a time, the *mode*'s way; report deletes."""
    with _started(address, f"CONS{index}", index, reports, start) as s:
        done, held, stop = 0, None, time.monotonic() + seconds
        while time.monotonic() < stop:
            if held is None:  # the wait ends with the window, not a second after
                held = s.read(queue, wait=max(0.01, min(READ_WAIT, stop - time.monotonic())))
                continue
            if mode == "read+delete":
                s.delete(held.entry_id)
                held = None
            else:
                got = s.delete_and_read(held.entry_id, queue)
                held = got[0] if got else None
            done += 1
        if held is not None:
            s.unlock(held.entry_id)
    reports.put(("done", index, "delete", done))


def phase(address: str, pid: int, mode: str, queue: str, seconds: float) -> dict:
    """Both kinds of process at once for *seconds*; the figures of the window."""
    work = [(producer, (address, i, queue, seconds)) for i in range(PRODUCERS)]
    work += [(consumer, (address, PRODUCERS + i, queue, mode, seconds))
             for i in range(CONSUMERS)]
    window = Window(pid)
    done = run_processes(_run, [(fn, args) for fn, args in work], seconds + 60, window)
    puts = sum(d[3] for d in done if d[2] == "put")
    deletes = sum(d[3] for d in done if d[2] == "delete")
    moved = (puts + deletes) / 2
    return {"bench": "acknext", "mode": mode, "seconds": round(window.seconds, 2),
            "puts": puts, "deletes": deletes,
            "msgs_per_s": round(deletes / window.seconds, 1),
            "puts_per_s": round(puts / window.seconds, 1),
            "server_cpu_s": round(window.server, 2),
            "server_cpu_us_per_msg": round(window.server / max(moved, 1) * 1e6, 1),
            "machine_busy_s": round(window.machine, 2),
            "loadavg_1m": os.getloadavg()[0]}


def _run(fn: Any, args: tuple, reports: Any, start: Any) -> None:
    """One client process: *fn*, its failure reported with its traceback."""
    try:
        fn(*args, reports, start)
    except BaseException:
        reports.put(("error", args[1], traceback.format_exc()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    lines: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cqsack") as tmp, \
            _procs.cqsd(Path(tmp), PRODUCERS + CONSUMERS + 2) as d:
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                record = phase(d.address, d.pid, mode, f"ACK{r}{MODES.index(mode)}",
                               args.seconds) | {"round": r + 1}
                lines.append(record)
                print(json.dumps(record), flush=True)
    for mode in MODES:
        mine = [x for x in lines if x["mode"] == mode]
        print(f"# {mode}: median {statistics.median(x['msgs_per_s'] for x in mine):.0f} msgs/s, "
              f"{statistics.median(x['server_cpu_us_per_msg'] for x in mine):.0f} µs daemon "
              f"CPU/msg over {len(mine)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
