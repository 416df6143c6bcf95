"""The code that runs in the durability benchmarks' client processes.

Each function is the whole life of one spawned process: connect, report
("ready", index), wait for the start event, work until its count is done or
its time is up, then report ("done", index, ...) — or ("error", index,
traceback). Every loop is bounded by a count and by a deadline, so the parent
can always join its children.

Every message is recoverable: these benchmarks measure what durability costs.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

STRUCTURE = "MSGQ01"
CYCLE_QUEUE = "DURCYCLE"
LOAD_QUEUE = "DURLOAD"
REDIS_LIST = "dur:queue"
PAYLOAD_SIZE = 1024
READ_WAIT = 1.0  # seconds a read may wait server-side; the queue is never empty when read
START_TIMEOUT = 120.0  # seconds a ready process waits for the start signal
WARMUP = 20  # cycles each process runs before saying ready (connections and caches warm)


def payload(client: int, seq: int) -> bytes:
    """A 1 KiB message, unique in the run (Redis's LREM finds it by value)."""
    head = b"C%03d-%010d|" % (client, seq)
    return head + b"x" * (PAYLOAD_SIZE - len(head))


@dataclass(frozen=True)
class CycleSpec:
    """One process of the put + read + delete loop; picklable, for spawn."""

    server: str  # "cqsd" or "redis"
    address: str  # cqsd unix:// address, or the Redis socket path
    index: int
    seconds: float  # how long to loop once started
    max_cycles: int  # a bound on the loop whatever the clock says


def cycle_worker(spec: CycleSpec, reports: Any, start: Any) -> None:
    """Run the one-at-a-time put, read, delete loop; report cycles, seconds, latencies."""
    try:
        loop = _cqsd_cycles if spec.server == "cqsd" else _redis_cycles
        cycles, seconds, latencies, misses, cpu = loop(spec, reports, start)
        reports.put(("done", spec.index, cycles, seconds, latencies, misses, cpu))
    except BaseException:
        reports.put(("error", spec.index, traceback.format_exc()))


def _wait_start(index: int, reports: Any, start: Any) -> None:
    reports.put(("ready", index))
    if not start.wait(START_TIMEOUT):
        raise TimeoutError("no start signal")


def _timed(spec: CycleSpec, one_cycle) -> tuple[int, float, list[int], int, float]:
    """Call *one_cycle(seq)* until the time or the count is up.

    Returns (cycles, seconds, per-cycle ns, misses, CPU seconds of this
    process meanwhile); a miss is a read that found nothing, which would be a
    bug here (each client puts before it reads, so the queue is never empty).
    """
    latencies: list[int] = []
    misses = 0
    cpu = time.process_time()
    began = time.monotonic_ns()
    stop = began + int(spec.seconds * 1e9)
    now = began
    while now < stop and len(latencies) < spec.max_cycles:
        got = one_cycle(len(latencies))
        after = time.monotonic_ns()
        latencies.append(after - now)
        misses += not got
        now = after
    return len(latencies), (now - began) / 1e9, latencies, misses, time.process_time() - cpu


def _cqsd_cycles(spec: CycleSpec, reports: Any, start: Any):
    import cqsclient

    with cqsclient.connect(spec.address, client=f"DUR{spec.index:03d}") as c:
        s = c.structure(STRUCTURE)

        def one_cycle(seq: int) -> bool:
            s.put(CYCLE_QUEUE, payload(spec.index, seq), recoverable=True)
            message = s.read(CYCLE_QUEUE, wait=READ_WAIT)
            if message is None:
                return False
            s.delete(message.entry_id)
            return True

        for seq in range(WARMUP):
            one_cycle(seq)
        _wait_start(spec.index, reports, start)
        return _timed(spec, one_cycle)


def _redis_cycles(spec: CycleSpec, reports: Any, start: Any):
    """The reliable-queue pattern, one command at a time: LPUSH, LMOVE to a private
    processing list, LREM from it once "processed"."""
    import redis

    r = redis.Redis(unix_socket_path=spec.address, socket_timeout=30)
    processing = f"dur:processing:{spec.index}"
    try:
        def one_cycle(seq: int) -> bool:
            r.lpush(REDIS_LIST, payload(spec.index, seq))
            value = r.lmove(REDIS_LIST, processing, "RIGHT", "LEFT")
            if value is None:
                return False
            r.lrem(processing, 1, value)
            return True

        for seq in range(WARMUP):
            one_cycle(seq)
        _wait_start(spec.index, reports, start)
        return _timed(spec, one_cycle)
    finally:
        r.close()


def load_worker(address: str, index: int, count: int, batch: int, deadline: float,
                reports: Any, start: Any) -> None:
    """Put *count* recoverable messages in put_batch requests of *batch*; reports how
    many went in (fewer if *deadline*, a time.monotonic() value, passed first)."""
    try:
        import cqsclient

        body = payload(index, 0)
        # Generous: one request of 5000 x 1 KiB can wait behind the other loaders'.
        with cqsclient.connect(address, client=f"LOAD{index:02d}", timeout=120) as c:
            s = c.structure(STRUCTURE)
            _wait_start(index, reports, start)
            done = 0
            while done < count and time.monotonic() < deadline:
                size = min(batch, count - done)
                s.put_batch(LOAD_QUEUE, [body] * size, recoverable=True)
                done += size
        reports.put(("done", index, done, time.process_time()))
    except BaseException:
        reports.put(("error", index, traceback.format_exc()))


def tail_worker(address: str, index: int, count: int, threads: int, deadline: float,
                reports: Any, start: Any) -> None:
    """Put *count* recoverable messages one request each, from *threads* threads
    sharing one connection (the blocking client pipelines them), so that many
    puts wait on each fsync and the log grows one record per put."""
    try:
        import cqsclient

        body = payload(index, 0)
        done = [0] * threads
        failures: list[str] = []
        with cqsclient.connect(address, client=f"TAIL{index:02d}", timeout=60) as c:
            s = c.structure(STRUCTURE)

            def run(t: int) -> None:
                share = count // threads + (1 if t < count % threads else 0)
                try:
                    while done[t] < share and time.monotonic() < deadline:
                        s.put(LOAD_QUEUE, body, recoverable=True)
                        done[t] += 1
                except BaseException:
                    failures.append(traceback.format_exc())

            _wait_start(index, reports, start)
            workers = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(max(0.0, deadline - time.monotonic()) + 30)
        if failures:
            raise RuntimeError(failures[0])
        reports.put(("done", index, sum(done), time.process_time()))
    except BaseException:
        reports.put(("error", index, traceback.format_exc()))
