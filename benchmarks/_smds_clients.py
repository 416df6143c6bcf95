"""The code that runs in the client processes of the benchmarks that move
messages through cqsd, RabbitMQ and Redis side by side (smds.py: recoverable
1 MiB messages; peers.py: 1 KiB, durable and not): producers and consumers.

Each function is the whole life of one spawned process, as in
_durability_clients: connect, report ("ready", index), wait for the start
event, work until the run's messages are all consumed or its deadline passes,
then report ("done", index, role, first ns, last ns, messages, checksum, CPU
seconds) or ("error", index, traceback). Every loop is bounded by a count and
by the deadline, so the parent can always join its children.

Every client moves ``batch`` messages at a time, as far as its library lets
it pipeline: cqsd ``put_batch`` (one atomic commit, acknowledged once durable)
and ``read_batch`` + one commit deleting the batch (with ``batch`` 1: ``put``, and
``delete_and_read``, the ack of the message held with the next delivery, one
request at a time, or with ``plain``, a ``read`` and then a ``delete``: the
pattern most applications write); RabbitMQ a window of
``batch`` unconfirmed publishes (publisher confirms, persistent messages on a
durable classic queue) and a prefetch of ``batch`` with manual acks; Redis
pipelines of ``batch`` LPUSH, of a BLMOVE and ``batch - 1`` LMOVE into a
processing list, then of the LREMs (``appendfsync always``: each pipeline's
writes are fsynced before its replies).

Messages are unique (a 16-byte head naming producer and sequence, then random
bytes, so nothing compresses) and every consumer sums the numbers in the heads
it saw: the parent compares the sum with what was put, so a lost or repeated
message shows even when the count is right.
"""

from __future__ import annotations

import os
import struct
import time
import traceback
from dataclasses import dataclass
from typing import Any

from _clients import READ_WAIT, redis_processed, redis_take
from _durability_clients import START_TIMEOUT, STRUCTURE

MESSAGE = 1 << 20  # the default size
QUEUE = "SMDSTP"  # the cqsd queue, the RabbitMQ queue, the Redis list
HEAD = struct.Struct("<QQ")  # producer, sequence


@dataclass(frozen=True)
class Mover:
    """One producer or consumer process; picklable, for spawn."""

    server: str  # "cqsd", "rabbitmq" or "redis"
    address: str  # cqsd unix:// address, Redis socket path, or RabbitMQ port
    role: str  # "producer" or "consumer"
    index: int  # unique in the run (producers first)
    count: int  # messages to put (a producer), or in the whole run (a consumer)
    batch: int
    deadline: float  # time.monotonic() after which the process gives up
    size: int = MESSAGE  # bytes a message
    recoverable: bool = True  # cqsd: recoverable puts (the peers' side is their server's)
    plain: bool = False  # cqsd at batch 1: read, then delete, each its own request


def number(producer: int, seq: int) -> int:
    return (producer << 32) | seq


def expected_sum(counts: list[int]) -> int:
    """What the consumers' checksums add up to when producer i put counts[i]."""
    return sum(number(p, s) for p, n in enumerate(counts) for s in range(n))


class _Bodies:
    """A producer's messages: a fresh head on the same random bytes."""

    def __init__(self, producer: int, size: int) -> None:
        self.producer = producer
        self.tail = os.urandom(size - HEAD.size)

    def __call__(self, seq: int) -> bytes:
        return HEAD.pack(self.producer, seq) + self.tail


def _check(body: bytes | memoryview, size: int) -> int:
    """The message's number; raises if it is not one of ours, whole."""
    if len(body) != size:
        raise ValueError(f"a message of {len(body)} bytes, not {size}")
    producer, seq = HEAD.unpack_from(body)
    return number(producer, seq)


def mover(spec: Mover, consumed: Any, reports: Any, start: Any) -> None:
    """Entry point of every process; *consumed* is the run's shared count."""
    try:
        work = {("cqsd", "producer"): _cqsd_producer, ("cqsd", "consumer"): _cqsd_consumer,
                ("redis", "producer"): _redis_producer, ("redis", "consumer"): _redis_consumer,
                ("rabbitmq", "producer"): _rabbit_producer,
                ("rabbitmq", "consumer"): _rabbit_consumer}[spec.server, spec.role]
        first, last, done, checksum, cpu = work(spec, consumed, reports, start)
        reports.put(("done", spec.index, spec.role, first, last, done, checksum, cpu))
    except BaseException:
        reports.put(("error", spec.index, traceback.format_exc()))


class _Clock:
    """The measured part of a process's life: first and last moments, CPU time."""

    def __init__(self, spec: Mover, reports: Any, start: Any) -> None:
        reports.put(("ready", spec.index))
        if not start.wait(START_TIMEOUT):
            raise TimeoutError("no start signal")
        self.cpu = time.process_time()
        self.first = self.last = time.monotonic_ns()

    def mark(self) -> None:
        self.last = time.monotonic_ns()

    def result(self, done: int, checksum: int) -> tuple[int, int, int, int, float]:
        return self.first, self.last, done, checksum, time.process_time() - self.cpu


def _going(spec: Mover, consumed: Any) -> bool:
    return consumed.value < spec.count and time.monotonic() < spec.deadline


def _count(consumed: Any, n: int) -> None:
    with consumed.get_lock():
        consumed.value += n


# --- cqsd ---------------------------------------------------------------------------


def _cqsd_producer(spec, consumed, reports, start):
    import cqsclient

    body = _Bodies(spec.index, spec.size)
    with cqsclient.connect(spec.address, client=f"PROD{spec.index}", timeout=120) as c:
        s = c.structure(STRUCTURE)
        clock = _Clock(spec, reports, start)
        sent = 0
        while sent < spec.count and time.monotonic() < spec.deadline:
            n = min(spec.batch, spec.count - sent)
            if spec.batch == 1:
                s.put(QUEUE, body(sent), recoverable=spec.recoverable)
            else:
                s.put_batch(QUEUE, [body(sent + i) for i in range(n)],
                            recoverable=spec.recoverable)
            sent += n
            clock.mark()
        return clock.result(sent, 0)


def _cqsd_consumer(spec, consumed, reports, start):
    import cqsclient

    with cqsclient.connect(spec.address, client=f"CONS{spec.index}", timeout=120) as c:
        s = c.structure(STRUCTURE)
        clock = _Clock(spec, reports, start)
        done = checksum = 0
        held = None  # batch 1: the message read, deleted with the next one's read
        while _going(spec, consumed):
            if spec.batch == 1 and spec.plain:
                held = s.read(QUEUE, wait=READ_WAIT)
                if held is not None:
                    checksum += _check(held.data, spec.size)
                    s.delete(held.entry_id)
                    held = None
                    clock.mark()
                    done += 1
                    _count(consumed, 1)
                continue
            if spec.batch == 1:
                if held is None:
                    held = s.read(QUEUE, wait=READ_WAIT)
                else:  # the ack and the next delivery in one round trip, as AMQP's
                    nxt = s.delete_and_read(held.entry_id, QUEUE)
                    clock.mark()
                    done += 1
                    _count(consumed, 1)
                    held = nxt[0] if nxt else None
                if held is not None:
                    checksum += _check(held.data, spec.size)
                continue
            messages = s.read_batch(QUEUE, spec.batch, wait=READ_WAIT)
            if not messages:
                continue
            checksum += sum(_check(m.data, spec.size) for m in messages)
            with s.unit_of_work() as uow:  # the batch's deletes in one commit
                for m in messages:
                    uow.delete(m.entry_id)
            clock.mark()
            done += len(messages)
            _count(consumed, len(messages))
        if held is not None:  # the deadline passed holding one: give it back
            s.unlock(held.entry_id)
        return clock.result(done, checksum)


# --- Redis --------------------------------------------------------------------------


def _redis(spec: Mover):
    import redis

    return redis.Redis(unix_socket_path=spec.address, socket_timeout=120)


def _redis_producer(spec, consumed, reports, start):
    body = _Bodies(spec.index, spec.size)
    r = _redis(spec)
    try:
        clock = _Clock(spec, reports, start)
        pipe = r.pipeline(transaction=False)
        sent = 0
        while sent < spec.count and time.monotonic() < spec.deadline:
            n = min(spec.batch, spec.count - sent)
            for i in range(n):
                pipe.lpush(QUEUE, body(sent + i))
            pipe.execute()
            sent += n
            clock.mark()
        return clock.result(sent, 0)
    finally:
        r.close()


def _redis_consumer(spec, consumed, reports, start):
    """The reliable-queue pattern of durability.py and server.py, pipelined."""
    r = _redis(spec)
    processing = f"{QUEUE}:processing:{spec.index}"
    try:
        clock = _Clock(spec, reports, start)
        pipe = r.pipeline(transaction=False)
        done = checksum = 0
        while _going(spec, consumed):
            got = redis_take(pipe, QUEUE, processing, spec.batch)
            if not got:
                continue
            checksum += sum(_check(v, spec.size) for v in got)
            redis_processed(pipe, processing, got)
            clock.mark()
            done += len(got)
            _count(consumed, len(got))
        return clock.result(done, checksum)
    finally:
        r.close()


# --- RabbitMQ -----------------------------------------------------------------------


def _rabbit_parameters(spec: Mover):
    import pika

    return pika.ConnectionParameters(host="127.0.0.1", port=int(spec.address), heartbeat=0,
                                     blocked_connection_timeout=120)


def declare_rabbit_queue(port: int) -> None:
    """The durable classic queue the run uses (the parent declares it once)."""
    import pika

    spec = Mover("rabbitmq", str(port), "setup", 0, 0, 0, 0.0)
    with pika.BlockingConnection(_rabbit_parameters(spec)) as conn:
        conn.channel().queue_declare(QUEUE, durable=True,
                                     arguments={"x-queue-type": "classic"})


def _rabbit_producer(spec, consumed, reports, start):
    """Publisher confirms, asynchronously: up to ``batch`` persistent messages
    unconfirmed at a time (pika's SelectConnection; its BlockingConnection
    waits for each confirm before the next publish)."""
    import pika

    body = _Bodies(spec.index, spec.size)
    persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    state = {"sent": 0, "acked": 0, "clock": None, "error": None}
    unconfirmed: set[int] = set()  # delivery tags: 1, 2, ... in publish order

    def publish(channel) -> None:
        while (state["sent"] < spec.count and len(unconfirmed) < spec.batch
               and time.monotonic() < spec.deadline):
            channel.basic_publish("", QUEUE, body(state["sent"]), persistent)
            state["sent"] += 1
            unconfirmed.add(state["sent"])

    def confirmed(frame) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            state["error"] = f"nack for delivery tag {method.delivery_tag}"
            connection.close()
            return
        tags = ([t for t in unconfirmed if t <= method.delivery_tag] if method.multiple
                else [method.delivery_tag])
        unconfirmed.difference_update(tags)
        state["acked"] += len(tags)
        state["clock"].mark()
        if state["acked"] >= spec.count or time.monotonic() >= spec.deadline:
            connection.close()
        else:
            publish(channel_of[0])

    channel_of: list = []

    def confirming(_frame) -> None:
        state["clock"] = _Clock(spec, reports, start)  # blocks the loop until the start
        connection.ioloop.call_later(max(0.0, spec.deadline - time.monotonic()),
                                     connection.close)
        publish(channel_of[0])

    def channel_open(channel) -> None:
        channel_of.append(channel)
        channel.confirm_delivery(confirmed, callback=confirming)

    def failed(_conn, err) -> None:
        state["error"] = f"connection failed: {err}"
        connection.ioloop.stop()

    connection = pika.SelectConnection(
        _rabbit_parameters(spec),
        on_open_callback=lambda conn: conn.channel(on_open_callback=channel_open),
        on_open_error_callback=failed,
        on_close_callback=lambda _conn, _reason: connection.ioloop.stop())
    connection.ioloop.start()
    if state["error"] is not None:
        raise RuntimeError(state["error"])
    if state["clock"] is None:
        raise RuntimeError("the connection closed before the start")
    return state["clock"].result(state["acked"], 0)


def _rabbit_consumer(spec, consumed, reports, start):
    import pika

    with pika.BlockingConnection(_rabbit_parameters(spec)) as conn:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=spec.batch)
        clock = _Clock(spec, reports, start)
        done = checksum = 0
        for method, _props, body in channel.consume(QUEUE, inactivity_timeout=READ_WAIT):
            if method is not None:
                checksum += _check(body, spec.size)
                channel.basic_ack(method.delivery_tag)
                clock.mark()
                done += 1
                _count(consumed, 1)
            if not _going(spec, consumed):
                break
        channel.cancel()
        return clock.result(done, checksum)


# --- 1 KiB cycles, alternating between two structures ------------------------------


@dataclass(frozen=True)
class Alternating:
    """One process of figure 3: 1 KiB put, read, delete, one request at a time, on
    structure A in even slices and B in odd ones; picklable, for spawn."""

    address: str
    index: int
    structures: tuple[str, str]
    slice_ns: int
    slices: int  # an even number: pairs of (A, B)


def alternating_cycles(spec: Alternating, grid: Any, reports: Any, start: Any) -> None:
    """Report ("done", index, cycles started in each slice, CPU seconds).

    *grid* holds the start of slice 0 (monotonic ns), which the parent sets just
    before the start signal, so every process switches structure at the same
    moments and both structures see the machine's load alike.
    """
    try:
        from _durability_clients import CYCLE_QUEUE, payload

        import cqsclient

        with cqsclient.connect(spec.address, client=f"ALT{spec.index:03d}") as c:
            handles = [c.structure(name) for name in spec.structures]
            seq = 0

            def one_cycle(s) -> None:
                nonlocal seq
                s.put(CYCLE_QUEUE, payload(spec.index, seq), recoverable=True)
                seq += 1
                message = s.read(CYCLE_QUEUE, wait=READ_WAIT)
                if message is None:  # each client puts before it reads: a bug
                    raise RuntimeError(f"nothing to read on {s.name} after a put")
                s.delete(message.entry_id)

            for s in handles:  # warm both paths before the clock runs
                for _ in range(20):
                    one_cycle(s)
            reports.put(("ready", spec.index))
            if not start.wait(START_TIMEOUT):
                raise TimeoutError("no start signal")
            cpu = time.process_time()
            counts = [0] * spec.slices
            t0, end = grid.value, grid.value + spec.slices * spec.slice_ns
            now = time.monotonic_ns()
            while now < end:
                k = (now - t0) // spec.slice_ns
                if k < 0:  # before slice 0: idle until it starts
                    time.sleep((t0 - now) / 1e9)
                else:
                    one_cycle(handles[k % 2])
                    counts[k] += 1
                now = time.monotonic_ns()
        reports.put(("done", spec.index, counts, time.process_time() - cpu))
    except BaseException:
        reports.put(("error", spec.index, traceback.format_exc()))
