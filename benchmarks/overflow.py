"""Overflow processing: the selection pause, the move rate, and the fast path's cost.

1. selection: the ``relieve()`` call that selects queue names for overflow is the
   one step that holds up every other request on the structure (seed 004:
   "Structure activity is quiesced while candidates are selected"). Target: at
   most 50 ms with 10,000 queue names and 1,000,000 messages. Two shapes: every
   name 100 deep, and a skewed one (name i about 1/(i+1) of the messages), both
   at 71% of a structure at its maximum size.
2. move: ``move_some`` throughput, moving the selected names' messages to the
   overflow structure in batches of 1,000 (the default), per message and per batch.
3. fastpath: CPU per put, read and delete of 1 KiB at 1,000 deep, through a bare
   ``Structure``, through a ``StructurePair`` without an overflow structure, and
   through one with an (idle) overflow structure: what every request pays for
   overflow processing being possible. Measured as benchmarks/engine.py measures,
   in one run so the three compare.

Run: .venv/bin/python benchmarks/overflow.py [--only selection move fastpath]
     [--names 10000] [--messages 1000000] [--runs 20] [--ops 200000]
Selection is wall time (a pause is wall time) with the garbage collector on and
the loaded messages frozen out of it, as in the daemon after a restart; one JSON
line per figure.
"""

import argparse
import gc
import json
import statistics
import time

from engine import put_read_delete

from cqsd.engine import ELEMENT, Structure, StructurePair


def depths(names: int, messages: int, skewed: bool) -> list[int]:
    if not skewed:
        return [messages // names] * names
    weights = [1 / (i + 1) for i in range(names)]
    scale = messages / sum(weights)
    counts = [max(1, round(w * scale)) for w in weights]
    counts[0] += messages - sum(counts)
    return counts


def filled(names: int, messages: int, skewed: bool) -> Structure:
    """A structure at its maximum size, 71% used by one-element messages."""
    size = (messages * 100 // 71 + 1) * ELEMENT
    s = Structure("BENCH", size)
    rows = []
    eid = 0
    for i, n in enumerate(depths(names, messages, skewed)):
        name = f"Q{i:05d}"
        for _ in range(n):
            eid += 1
            rows.append([eid, 1, name, b"x", True, eid, 0, "ready", None, None, None])
    s.load(rows)
    del rows
    # the daemon freezes what a restart loaded out of the collector (cqsd/recovery/
    # restart.py); without it the first pause here would be a full collection of a
    # million entries, which any request could have triggered
    gc.collect()
    gc.freeze()
    return s


def selection(names: int, messages: int, runs: int) -> list[dict]:
    out = []
    for skewed in (False, True):
        s = filled(names, messages, skewed)
        pauses = []
        for _ in range(runs):
            pair = StructurePair(s)  # a fresh pair: no name in overflow status yet
            t0 = time.perf_counter_ns()
            relief = pair.relieve()
            pauses.append(time.perf_counter_ns() - t0)
        out.append({
            "bench": "selection", "shape": "skewed" if skewed else "uniform", "names": names,
            "messages": s.stats()["messages"],
            "selected": len(relief.selected),
            "selected_elements": sum(c["elements"] for c in relief.selected),
            "pause_ms_median": round(statistics.median(pauses) / 1e6, 2),
            "pause_ms_max": round(max(pauses) / 1e6, 2),
        })
    return out


def move(names: int, messages: int) -> dict:
    s = filled(names, messages, skewed=True)
    overflow = Structure("BENCHOV", s.size)
    pair = StructurePair(s, overflow)
    relief = pair.relieve()
    batches = []
    while True:
        t0 = time.perf_counter_ns()
        n = pair.move_some()
        batches.append((n, time.perf_counter_ns() - t0))
        pair.take_record()
        if not n:
            break
    moved = sum(n for n, _ in batches)
    return {
        "bench": "move", "names": len(relief.selected), "moved": moved,
        "us_per_message": round(sum(t for _, t in batches) / max(1, moved) / 1000, 2),
        "batch_ms_max": round(max(t for _, t in batches) / 1e6, 2),
    }


def fastpath(ops: int) -> list[dict]:
    out = []
    for through in ("structure", "pair", "pair_with_overflow"):
        s = Structure("BENCH", 1 << 42, entry_max=32 * 1024)
        if through == "structure":
            target = s
        else:
            overflow = Structure("BENCHOV", 1 << 42) if through == "pair_with_overflow" else None
            target = StructurePair(s, overflow)
        row = put_read_delete(target, s, 1000, ops)
        out.append({"bench": "fastpath", "through": through, "depth": 1000,
                    **{k: round(v, 3) for k, v in row.items()}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["selection", "move", "fastpath"],
                        default=["selection", "move", "fastpath"])
    parser.add_argument("--names", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--ops", type=int, default=200_000)
    args = parser.parse_args()
    rows = []
    if "selection" in args.only:
        rows += selection(args.names, args.messages, args.runs)
    if "move" in args.only:
        rows.append(move(args.names, args.messages))
    if "fastpath" in args.only:
        rows += fastpath(args.ops)
    for row in rows:
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
