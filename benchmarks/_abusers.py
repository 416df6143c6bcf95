"""The processes of benchmarks/abuse.py: the well-behaved clients whose latency is
measured, and the abusers.

Each function is the whole life of one spawned process: connect, report
("ready", name), work until *stop* is set, report ("done", name, stats) or
("error", name, text). The abusers speak frames by hand (cqsproto),
to do what no SDK would; every socket has a timeout, so no process can hang
past its parent's stop.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
import traceback
from typing import Any

from cqsproto import NEED_DATA, PROTOCOL_VERSION, FrameDecoder, encode_frame

STRUCTURE = "MSGQ01"
SMALL = b"s" * 64
BIG_QUEUE = "ABUSEBIG"  # holds one message of BIG_PAYLOAD bytes that the abusers browse
BIG_PAYLOAD = 10_000
PIPELINE = 10_000  # requests a pipeliner writes before it reads
SOCKET_TIMEOUT = 30.0
SLOW_READ = 16 * 1024  # bytes a slow reader reads at a time
SLOW_READ_EVERY = 0.02  # seconds between its reads: ~0.8 MB/s
TRICKLE_EVERY = 1.0  # seconds between a slow writer's bytes
ACCEPTED_AFTER = 0.05  # seconds without a refusal after which a flood connection has a slot


def _report_errors(fn):
    @functools.wraps(fn)  # pickled by its name, for spawn
    def run(name: str, reports: Any, *args) -> None:
        if fn is not probe:
            # On a 2-core test machine the abuser's own CPU would be taken from the
            # daemon and the probes, which in production it is not: it runs on
            # another machine. SCHED_IDLE leaves it the CPU time they do not use;
            # what it costs the daemon to serve it is what is measured.
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        try:
            reports.put(("done", name, fn(name, reports, *args)))
        except BaseException:  # reported to the parent, which fails the run
            lines = traceback.format_exc().strip().splitlines()
            reports.put(("error", name, "\n".join(lines[-3:])))
    return run


class Raw:
    """One connection speaking frames by hand."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(SOCKET_TIMEOUT)
        self.sock.connect(path)
        self.decoder = FrameDecoder()

    def receive(self) -> dict | None:
        """The next frame; None once the daemon has closed the connection."""
        while True:
            frame = self.decoder.next_frame()
            if frame is not NEED_DATA:
                return frame if isinstance(frame, dict) else None
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            self.decoder.receive_data(data)

    def request(self, **fields) -> dict:
        self.sock.sendall(encode_frame({"id": 1, **fields}))
        reply = self.receive()
        if reply is None or not reply.get("ok"):
            raise RuntimeError(f"{fields.get('op')} failed: {reply}")
        return reply

    def register(self, client: str) -> None:
        self.request(op="register", client=client, version=PROTOCOL_VERSION)


def browses(count: int) -> bytes:
    frame = encode_frame({"id": 2, "op": "browse", "structure": STRUCTURE, "queue": BIG_QUEUE,
                          "qtype": "TRAN", "limit": 1})
    return frame * count


def _address_path(address: str) -> str:
    return address.removeprefix("unix://")


# --- the measured clients -------------------------------------------------------------


@_report_errors
def probe(name: str, reports: Any, address: str, queue: str, phase: Any, stop: Any):
    """Put, read and delete one small message, one request at a time, and keep each
    request's round trip (ns) under the phase it ran in (phase < 0: not measured).
    Returns {phase: [ns, ...]}."""
    import cqsclient

    clock = time.perf_counter_ns
    samples: dict[int, list[int]] = {}
    with cqsclient.connect(address, client=name) as c:
        s = c.structure(STRUCTURE)
        reports.put(("ready", name))
        while not stop.is_set():
            now = phase.value
            t0 = clock()
            s.put(queue, SMALL, recoverable=False)
            t1 = clock()
            m = s.read(queue)
            t2 = clock()
            s.delete(m.entry_id)
            t3 = clock()
            if now >= 0 and phase.value == now:
                samples.setdefault(now, []).extend((t1 - t0, t2 - t1, t3 - t2))
    return samples


# --- the abusers ---------------------------------------------------------------------


@_report_errors
def slow_readers(name: str, reports: Any, address: str, deaf: int, slow: int, stop: Any):
    """``deaf`` connections that pipeline browses and read nothing, and ``slow`` that
    keep pipelining browses and read their replies at ~0.8 MB/s."""
    path = _address_path(address)
    conns = []
    for i in range(deaf + slow):
        raw = Raw(path)
        raw.register(f"{name[:6]}{i:02d}")
        conns.append(raw)
    conns[0].request(op="put", structure=STRUCTURE, queue=BIG_QUEUE, data=b"b" * BIG_PAYLOAD,
                     recoverable=False)
    read = [0]

    def send(raw: Raw) -> None:
        try:
            while not stop.is_set():
                raw.sock.sendall(browses(PIPELINE))
        except OSError:
            pass

    def trickle_read(raw: Raw) -> None:
        try:
            while not stop.is_set():
                read[0] += len(raw.sock.recv(SLOW_READ))
                time.sleep(SLOW_READ_EVERY)  # the pace under test
        except OSError:
            pass

    threads = [threading.Thread(target=send, args=(raw,), daemon=True) for raw in conns]
    threads += [threading.Thread(target=trickle_read, args=(raw,), daemon=True)
                for raw in conns[deaf:]]
    for t in threads:
        t.start()
    reports.put(("ready", name))
    stop.wait()
    for raw in conns:
        raw.sock.close()
    return {"deaf": deaf, "slow": slow, "slow_read_bytes": read[0]}


@_report_errors
def slow_writers(name: str, reports: Any, address: str, count: int, stop: Any):
    """``count`` registered connections, each sending a put a byte a second."""
    path = _address_path(address)
    conns = []
    for i in range(count):
        raw = Raw(path)
        raw.register(f"{name[:6]}{i:02d}")
        conns.append(raw)
    frame = encode_frame({"id": 3, "op": "put", "structure": STRUCTURE, "queue": "TRICKLE",
                          "data": SMALL, "recoverable": False})
    reports.put(("ready", name))
    sent, cut = 0, 0
    while not stop.wait(TRICKLE_EVERY):
        for raw in list(conns):
            try:
                raw.sock.send(frame[sent % len(frame):][:1])
            except OSError:
                conns.remove(raw)
                cut += 1
        sent += 1
    for raw in conns:
        raw.sock.close()
    return {"connections": count, "bytes_each": sent, "cut_off": cut}


@_report_errors
def flood(name: str, reports: Any, address: str, stop: Any):
    """Connect as fast as possible: past max_connections each connection is refused
    with CLIENT_LIMIT and closed; one that gets no refusal within ACCEPTED_AFTER
    has a slot, and is held (unregistered: the handshake timeout closes it, and
    the next connection takes the slot again)."""
    path = _address_path(address)
    held: list[Raw] = []
    refused = accepted = 0
    reasons: dict[str, int] = {}
    while not stop.is_set():
        raw = Raw(path)
        raw.sock.settimeout(ACCEPTED_AFTER)
        try:
            reply = raw.receive()
        except TimeoutError:
            held.append(raw)
            accepted += 1
            continue
        raw.sock.close()
        reason = reply.get("reason") if reply else "closed"
        reasons[reason] = reasons.get(reason, 0) + 1
        refused += 1
        if refused == 1:
            reports.put(("ready", name))
        if refused % 1024 == 0:
            held = [h for h in held if _open(h)]
    for raw in held:
        raw.sock.close()
    return {"refused": refused, "accepted": accepted, "reasons": reasons}


def _open(raw: Raw) -> bool:
    """Whether the daemon still holds this connection open."""
    raw.sock.setblocking(False)  # with a timeout, recv would wait for data first
    try:
        gone = raw.sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        gone = False
    except OSError:
        gone = True
    raw.sock.settimeout(ACCEPTED_AFTER)
    if gone:
        raw.sock.close()
    return not gone


@_report_errors
def pipeliner(name: str, reports: Any, address: str, stop: Any):
    """Write 10,000 browses on one connection, then read the 10,000 replies; again."""
    raw = Raw(_address_path(address))
    raw.register(name)
    raw.request(op="put", structure=STRUCTURE, queue=BIG_QUEUE, data=b"p" * 100,
                recoverable=False)
    burst = browses(PIPELINE)
    reports.put(("ready", name))
    bursts, seconds = 0, []
    while not stop.is_set():
        t0 = time.perf_counter()
        sender = threading.Thread(target=raw.sock.sendall, args=(burst,))
        sender.start()
        for _ in range(PIPELINE):
            if raw.receive() is None:
                raise RuntimeError("the daemon closed the pipeliner's connection")
        sender.join()
        seconds.append(time.perf_counter() - t0)
        bursts += 1
    raw.sock.close()
    return {"bursts": bursts, "requests": bursts * PIPELINE,
            "burst_s_median": sorted(seconds)[len(seconds) // 2] if seconds else None}
