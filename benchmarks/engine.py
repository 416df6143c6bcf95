"""Structure engine cost per request, and whether it grows with queue depth.

Issue 2 asks for at most 5 µs of CPU for a put, a read and a delete of a 1 KiB
payload, and for the cost at 1,000,000 messages deep to be within 1.5x of the
cost at 1,000 deep (browse of the first 100 entries likewise).

Run: .venv/bin/python benchmarks/engine.py [--depths 1000 1000000] [--ops 200000]
Timing is process CPU time (time.process_time_ns) over blocks of 500 requests,
so the queue depth stays within 500 of the nominal depth. Messages are
recoverable, so the cost includes recording their log effects.
"""

import argparse
import gc
import json
import statistics
import time

from cqsd.engine import Structure

PAYLOAD = b"x" * 1024
BLOCK = 500


def put_read_delete(target, s: Structure, depth: int, ops: int) -> dict:
    """CPU µs per put, read and delete of 1 KiB on TRAN:TRANX of ``target`` (a
    Structure or a StructurePair over ``s``) filled ``depth`` deep, in blocks of
    BLOCK, with the garbage collector off; ``s``'s log effects are emptied after
    each block, as the daemon hands them to the log."""
    for _ in range(depth):
        target.put("TRAN", "TRANX", PAYLOAD)
    s.take_events()
    s.effects.clear()
    clock = time.process_time_ns
    put_ns = read_ns = delete_ns = 0
    gc.disable()
    try:
        for _ in range(ops // BLOCK):
            t0 = clock()
            for _ in range(BLOCK):
                target.put("TRAN", "TRANX", PAYLOAD)
            t1 = clock()
            locked = [target.read("IMS1", "TRAN", "TRANX").entry_id for _ in range(BLOCK)]
            t2 = clock()
            for entry_id in locked:
                target.delete("IMS1", entry_id)
            t3 = clock()
            put_ns += t1 - t0
            read_ns += t2 - t1
            delete_ns += t3 - t2
            s.effects.clear()
    finally:
        gc.enable()
    n = (ops // BLOCK) * BLOCK
    return {"put_us": put_ns / n / 1000, "read_us": read_ns / n / 1000,
            "delete_us": delete_ns / n / 1000}


def measure(depth: int, ops: int) -> dict:
    s = Structure("BENCH", 1 << 42, entry_max=32 * 1024)
    row = put_read_delete(s, s, depth, ops)
    browse = []
    gc.disable()
    try:
        for _ in range(200):
            t0 = time.process_time_ns()
            s.browse("TRAN", "TRANX", limit=100)
            browse.append(time.process_time_ns() - t0)
    finally:
        gc.enable()
    return {"depth": depth, **row, "browse100_us": statistics.median(browse) / 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[1000, 1_000_000])
    parser.add_argument("--ops", type=int, default=200_000)
    args = parser.parse_args()
    rows = [measure(d, args.ops) for d in args.depths]
    for row in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        ratios = {k: round(last[k] / first[k], 2) for k in first if k.endswith("_us")}
        print(json.dumps({"deep_vs_shallow": ratios}))


if __name__ == "__main__":
    main()
