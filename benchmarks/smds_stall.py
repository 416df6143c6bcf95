"""How long restart processing of a large data set holds the daemon's event loop
(issue 28, item 8): every client waits while it runs there.

In process, no daemon: a data set of ``--gib`` GiB (dsblock 256 KiB) is made
(posix_fallocate: the same file a daemon makes), filled in its space map with
messages of ``--kib`` KiB (only the newest one's blocks written: restart reads
that one block, nothing else), then closed as a crash leaves it (no saved map).
Restart processing (``cqsd/server/smds/restart.py`` ``restart``, what
``reset-smds``, ``start-smdsconn`` and a recovery's reopen run) is then timed
twice: called on a Trio loop as the daemon did (the loop's longest stall is the
call's time), and through ``trio.to_thread`` as it runs now, the loop's longest
gap measured by a task that ticks every millisecond. Likewise one expansion of
the data set by a fifth: ``DataSet.expand`` called on the loop as the daemon
did, against its I/O (``extend``: posix_fallocate, fsync, the header) in a
worker thread and ``grew`` on the loop, as ``cqsd/server/smds/space.py`` does
now. Before each expansion ``--dirty-mib`` MiB of blocks are written and not
synced, as non-recoverable puts leave them: the expansion's fsync writes them.

    .venv/bin/python benchmarks/smds_stall.py                  # 4 GiB of 64 KiB messages
    .venv/bin/python benchmarks/smds_stall.py --gib 1 --kib 1024 --dirty-mib 0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import trio

from cqsd.server.smds.restart import restart
from cqsd.smds import BufferPool, DataMap
from cqsd.smds.dataset import DataSet
from cqsd.smds.spacemap import expanded_size
from cqsd.smds.states import Status

GiB, KiB = 1024**3, 1024
DSBLOCK = 256 * KiB


class Owned:
    """What restart processing needs of an entry: its id and its map."""

    def __init__(self, entry_id: int, datamap: DataMap) -> None:
        self.entry_id, self.map = entry_id, datamap


def fill(where: Path, gib: int, kib: int) -> tuple[list[Owned], int]:
    dataset = DataSet.create(where, "BIG", "OWNER", dsblock=DSBLOCK, dssize=gib * GiB)
    assert dataset.space is not None
    payload = bytes(kib * KiB)
    entries, eid = [], 0
    while dataset.space.usage().used_percent < 99:
        eid += 1
        try:
            ranges = dataset.space.allocate((1, f"Q{eid % 16}"), len(payload))
        except Exception:
            break
        entries.append(Owned(eid, DataMap.of("OWNER", payload, ranges)))
    dataset.write_message(entries[-1].map, eid, payload)
    dataset.sync()
    created = dataset.header.created
    dataset.abandon()  # a crash: OPEN set, no saved map, so the map is rebuilt
    return entries, created


async def longest_gap(work) -> tuple[float, float]:
    """(seconds ``work`` took, the loop's longest gap between 1 ms ticks meanwhile)."""
    gaps = [0.0]
    done = trio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await trio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last - 0.001)
            last = now

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await trio.sleep(0.01)
        started = time.perf_counter()
        await work()
        took = time.perf_counter() - started
        done.set()
    return took, max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=int, default=4)
    parser.add_argument("--kib", type=int, default=64)
    parser.add_argument("--dirty-mib", type=int, default=256)
    parser.add_argument("--cases", default="rescan_on_loop,rescan_in_thread,expand_on_loop,"
                                           "expand_aside",
                        help="comma-separated (expand_aside needs DataSet.extend)")
    args = parser.parse_args()
    where = Path(tempfile.mkdtemp(prefix="cqstall"))
    # what restart and expand read of the structure's config
    sc = SimpleNamespace(dsblock=DSBLOCK, dssize=args.gib * GiB, dsmax=2 * args.gib * GiB)
    try:
        entries, created = fill(where, args.gib, args.kib)
        record = {"created": created, "map_time": None}

        def rescan() -> DataSet:
            dataset, how, _ = restart(where, ("BIG", "OWNER"), Status.ACTIVE, record, sc,
                                      BufferPool(4, DSBLOCK), lambda: entries)
            assert how == "rebuilt"
            return dataset

        opened: list[DataSet] = []

        async def on_loop() -> None:
            opened.append(rescan())

        async def in_thread() -> None:
            opened.append(await trio.to_thread.run_sync(rescan))

        def dirty() -> None:  # blocks of non-recoverable puts: written, not synced
            chunk = os.urandom(1024 * KiB)
            for i in range(args.dirty_mib):
                os.pwrite(opened[-1].fd, chunk, DSBLOCK + i * len(chunk))

        async def expand_on_loop() -> None:
            opened[-1].expand(sc.dsmax)

        async def expand_aside() -> None:
            dataset = opened[-1]
            new = expanded_size(dataset.size, DSBLOCK, sc.dsmax)
            assert new is not None
            dataset.grew(await trio.to_thread.run_sync(dataset.extend, new, sc.dsmax))

        figures = {}
        for name, work in (("rescan_on_loop", on_loop), ("rescan_in_thread", in_thread),
                           ("expand_on_loop", expand_on_loop),
                           ("expand_aside", expand_aside)):
            if name not in args.cases.split(",") and name != "rescan_in_thread":
                continue  # rescan_in_thread opens the data set the expansions use
            if name.startswith("expand"):
                dirty()  # before the loop is timed
            took, gap = trio.run(longest_gap, work)
            figures[name] = {"seconds": round(took, 3), "longest_loop_stall": round(gap, 3)}
            if name.startswith("rescan_on"):
                opened.pop().abandon()
        opened[-1].abandon()
        print(json.dumps({"gib": args.gib, "message_kib": args.kib, "entries": len(entries),
                          "dirty_mib": args.dirty_mib,
                          **figures}))
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
