"""The code that runs in the benchmark's client processes.

Each function is the whole life of one spawned process: connect (its own
connection and client name), say ready, wait for the start, work until its
count is done, the stop event is set or its deadline passes, then report.
Everything is bounded: a process never waits longer than its deadline plus
one server-side read wait, so the parent can always join it.

Timestamps are ``time.monotonic_ns()``, which on Linux is one clock for the
whole machine (CLOCK_MONOTONIC), so the parent can compare them with its own.
"""

from __future__ import annotations

import cProfile
import struct
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

STRUCTURE = "MSGQ01"
THROUGHPUT_QUEUE = "BENCHTP"
FANOUT_QUEUE = "BENCHFAN"
REDIS_SOURCE = "bench:tp"
PAYLOAD_SIZE = 1024
READ_WAIT = 0.5  # seconds a consumer's read waits server-side before it looks at the clock again
START_TIMEOUT = 60.0  # seconds a ready process waits for the start signal
RECEIPT = struct.Struct("<iiq")  # fan-out: listener index, round (0 = ready), monotonic ns


@dataclass(frozen=True)
class Worker:
    """What one throughput process does; picklable, for spawn."""

    server: str  # "cqsd" or "redis"
    address: str  # cqsd address, or the Redis socket path
    role: str  # "producer" or "consumer"
    index: int
    count: int  # messages to put (producers) or to see consumed in all (consumers)
    batch: int
    deadline: float  # time.monotonic() after which the process gives up
    profile: str | None = None  # cProfile output file


def payload(producer: int, seq: int) -> bytes:
    """A 1 KiB message, unique in the run (Redis's LREM finds it by value)."""
    head = b"P%02d-%010d|" % (producer, seq)
    return head + b"x" * (PAYLOAD_SIZE - len(head))


def throughput_worker(spec: Worker, reports: Any, start: Any, stop: Any, consumed: Any) -> None:
    """Entry point of a producer or consumer process; reports ("done", ...) or ("error", ...)."""
    try:
        work = {
            ("cqsd", "producer"): _cqsd_producer,
            ("cqsd", "consumer"): _cqsd_consumer,
            ("redis", "producer"): _redis_producer,
            ("redis", "consumer"): _redis_consumer,
        }[spec.server, spec.role]
        first, last, done, cpu = work(spec, reports, start, stop, consumed)
        reports.put(("done", spec.role, spec.index, first, last, done, cpu))
    except BaseException:
        lines = traceback.format_exc().strip().splitlines()
        reports.put(("error", spec.role, spec.index, "\n".join(lines[-3:])))


class _Run:
    """The measured part of a worker's life: its CPU time, and its profile if asked."""

    def __init__(self, spec: Worker, reports: Any, start: Any) -> None:
        self.spec = spec
        reports.put(("ready", spec.role, spec.index))
        if not start.wait(START_TIMEOUT):
            raise TimeoutError("no start signal")
        self.profiler = None
        if spec.profile is not None:
            self.profiler = cProfile.Profile()
            self.profiler.enable()
        self.cpu0 = time.process_time()  # after imports and connecting: only the work counts

    def finish(self) -> float:
        """CPU seconds since the start signal."""
        cpu = time.process_time() - self.cpu0
        if self.profiler is not None:
            self.profiler.disable()
            self.profiler.dump_stats(self.spec.profile)
        return cpu


def _batches(spec: Worker, stop: Any):
    """(first seq, size) of each batch of this producer's messages, until stopped."""
    sent = 0
    while sent < spec.count and not stop.is_set() and time.monotonic() < spec.deadline:
        size = min(spec.batch, spec.count - sent)
        yield sent, size
        sent += size


def _cqsd_producer(spec, reports, start, stop, consumed):
    import cqsclient

    with cqsclient.connect(spec.address, client=f"PROD{spec.index}") as c:
        s = c.structure(STRUCTURE)
        run = _Run(spec, reports, start)
        first = time.monotonic_ns()
        done = 0
        for seq, size in _batches(spec, stop):
            data = [payload(spec.index, seq + i) for i in range(size)]
            s.put_batch(THROUGHPUT_QUEUE, data, recoverable=False)
            done += size
        last = time.monotonic_ns()
        cpu = run.finish()
    return first, last, done, cpu


def _cqsd_consumer(spec, reports, start, stop, consumed):
    import cqsclient

    with cqsclient.connect(spec.address, client=f"CONS{spec.index}") as c:
        s = c.structure(STRUCTURE)
        run = _Run(spec, reports, start)
        first = time.monotonic_ns()
        last = first
        done = 0
        while (consumed.value < spec.count and not stop.is_set()
               and time.monotonic() < spec.deadline):
            messages = s.read_batch(THROUGHPUT_QUEUE, spec.batch, wait=READ_WAIT)
            if not messages:
                continue
            with s.unit_of_work() as uow:  # every delete in one commit request
                for m in messages:
                    uow.delete(m.entry_id)
            last = time.monotonic_ns()
            done += len(messages)
            with consumed.get_lock():
                consumed.value += len(messages)
        cpu = run.finish()
    return first, last, done, cpu


def _redis_client(spec: Worker):
    import redis

    return redis.Redis(unix_socket_path=spec.address, socket_timeout=READ_WAIT + 30)


def _redis_producer(spec, reports, start, stop, consumed):
    r = _redis_client(spec)
    try:
        run = _Run(spec, reports, start)
        first = time.monotonic_ns()
        done = 0
        pipe = r.pipeline(transaction=False)
        for seq, size in _batches(spec, stop):
            for i in range(size):
                pipe.lpush(REDIS_SOURCE, payload(spec.index, seq + i))
            pipe.execute()
            done += size
        last = time.monotonic_ns()
        cpu = run.finish()
    finally:
        r.close()
    return first, last, done, cpu


def _redis_consumer(spec, reports, start, stop, consumed):
    """The reliable-queue pattern: LMOVE to a private processing list, LREM when done.

    One pipeline reads the batch (a BLMOVE that waits for the first message,
    then LMOVEs that take what else is there), a second removes what was read
    from the processing list: two round trips a batch, like read_batch + commit.
    """
    r = _redis_client(spec)
    processing = f"bench:processing:{spec.index}"
    try:
        run = _Run(spec, reports, start)
        first = time.monotonic_ns()
        last = first
        done = 0
        pipe = r.pipeline(transaction=False)
        while (consumed.value < spec.count and not stop.is_set()
               and time.monotonic() < spec.deadline):
            got = redis_take(pipe, REDIS_SOURCE, processing, spec.batch)
            if not got:
                continue
            redis_processed(pipe, processing, got)
            last = time.monotonic_ns()
            done += len(got)
            with consumed.get_lock():
                consumed.value += len(got)
        cpu = run.finish()
    finally:
        r.close()
    return first, last, done, cpu


def redis_take(pipe: Any, source: str, processing: str, batch: int) -> list[bytes]:
    """Up to *batch* values moved from *source* to the *processing* list in one
    pipeline: a BLMOVE that waits (READ_WAIT) for the first, LMOVEs for the rest."""
    pipe.blmove(source, processing, READ_WAIT, "RIGHT", "LEFT")
    for _ in range(batch - 1):
        pipe.lmove(source, processing, "RIGHT", "LEFT")
    return [v for v in pipe.execute() if v is not None]


def redis_processed(pipe: Any, processing: str, got: list[bytes]) -> None:
    """Remove what redis_take moved from the *processing* list, in one pipeline."""
    for value in reversed(got):  # newest first: each LREM finds its value at the head
        pipe.lrem(processing, 1, value)
    pipe.execute()


@dataclass(frozen=True)
class Board:
    """Where the fan-out listeners leave their receipts: shared memory, so that
    only the last listener of a round wakes the parent (through *done*), and
    the measurement does not add 32 wake-ups of its own to every round.
    Passed to spawned processes as an argument (multiprocessing allows it then)."""

    clients: int
    times: Any  # Array("q"): the receipt time (monotonic ns) of each listener
    rounds: Any  # Array("i"): the round each listener last saw
    count: Any  # Value("i"): listeners that have reported this round
    done: Any  # Connection: RECEIPT(index, round, time) from the last one; round -1: failure

    def report(self, index: int, round_: int, now: int) -> None:
        self.times[index] = now
        self.rounds[index] = round_
        with self.count.get_lock():
            self.count.value += 1
            last = self.count.value == self.clients
        if last:
            self.done.send_bytes(RECEIPT.pack(index, round_, now))


def fanout_listener(
    address: str, index: int, rounds: int, deadline: float, board: Board, stop: Any,
    profile: str | None,
) -> None:
    """Register interest in the fan-out queue, then report the monotonic time of
    each notification (round 1, 2, ...) until *rounds* came, *stop* is set or
    *deadline* passes. Round 0 says ready."""
    try:
        import cqsclient

        with cqsclient.connect(address, client=f"FAN{index:02d}") as c:
            c.register_interest(STRUCTURE, FANOUT_QUEUE)
            board.report(index, 0, time.monotonic_ns())
            profiler = cProfile.Profile() if profile else None
            if profiler is not None:
                profiler.enable()
            got = 0
            while got < rounds and not stop.is_set() and time.monotonic() < deadline:
                for _note in c.notifications(timeout=0.25):
                    now = time.monotonic_ns()
                    got += 1
                    board.report(index, got, now)
                    if got >= rounds:
                        break
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(profile)
    except BaseException as err:
        # One line, not 32 tracebacks, when the daemon goes away under them all.
        print(f"fanout listener {index}: {type(err).__name__}: {err}", file=sys.stderr)
        try:
            board.done.send_bytes(RECEIPT.pack(index, -1, time.monotonic_ns()))
        except OSError:
            pass
