"""A fake cqsd for the SDK tests: the real engine and request table behind a
small threaded server on a real socket, speaking the real codec.

The queue rules are the daemon's own, not a copy: each structure is a
``cqsd.engine.StructurePair``, every request is checked by
``cqsproto.requests.parse`` (so a client sending a wrong field or type is
refused as the daemon would refuse it), sizes by the daemon's ``Limits``, and
messages, locks and notifications travel as ``cqsd.server`` writes them. What
the fake adds is what the SDK tests need and a daemon cannot give: knobs to
inject faults and reorder replies. What it leaves out: no log (no reply waits
for an fsync), no waiting-read timeouts (a waiting read is served by a request
that makes its queue readable, or ended by a drop), a dropped client's locks
are released at once (peer recovery with ``resync_grace = 0``), no overflow
processing, and no Spark jobs (checkpoint, recover, rebuild, delete_structure
are refused). Each connection has its own thread; the engine is guarded by
one lock. It listens on a Unix socket, or on TCP 127.0.0.1 (with TLS if given
a context) for the TLS tests.

Knobs for tests: ``handlers[op]`` overrides an op (a function of the
connection and the request returning the reply map, or None to send none);
``shuffle`` replies to the requests of one read in random order;
``notify_before_reply`` sends a notification before every reply;
``drop_all()`` cuts every connection; ``wait_connections(n)`` blocks until n
are open; ``wait_parked(n)`` blocks until n reads wait for messages;
``requests`` records every request received, and ``wait_ops(op, n)`` waits
for n of one op. Tests set up or inspect the
structures through ``engine()`` (the lock held) and ``messages()``.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cqsd.engine import (
    CQSError,
    Entry,
    Put,
    QueueType,
    QueueWork,
    Reason,
    Structure,
    StructurePair,
    parse_qtype,
)
from cqsd.engine.qtypes import check_name
from cqsd.server import wire
from cqsd.server.clients import notification
from cqsd.server.handlers import _commit_op
from cqsd.server.limits import Limits
from cqsd.server.waiters import read_up_to
from cqsproto import (
    CLOSED,
    NEED_DATA,
    PROTOCOL_VERSION,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    max_frame_for,
    requests,
    timing,
)

STRUCTURE_SIZE = 64 * 1024 * 1024  # room for the largest message a test puts (8 MiB)
Key = tuple[int, str]


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    client: str | None = None
    deregistered: bool = False
    token: str | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, frame: dict[str, Any]) -> None:
        try:
            with self.send_lock:
                self.sock.sendall(encode_frame(frame))
        except OSError:
            pass


@dataclass(eq=False)
class Parked:
    """A read waiting server-side for a message."""

    conn: Conn
    rid: int
    pair: StructurePair
    key: Key
    n: int


def error(rid: Any, reason: str, message: str) -> dict[str, Any]:
    return {"id": rid, "ok": False, "reason": str(reason), "message": message}


def ok(rid: Any, **result: Any) -> dict[str, Any]:
    return {"id": rid, "ok": True, "result": result}


class FakeServer:
    def __init__(
        self,
        path: str | None,
        max_message: int = 1 << 20,
        structures: tuple[str, ...] = ("MSGQ01", "MSGQ01OV"),
        tls: ssl.SSLContext | None = None,
    ) -> None:
        # With no path the server listens on TCP 127.0.0.1 (``port``), with TLS if given.
        self.path = path
        self.tls = tls
        self.max_message = max_message
        self.pairs = {name: StructurePair(Structure(name, STRUCTURE_SIZE), None)
                      for name in structures}
        self.handlers: dict[str, Callable[[Conn, dict[str, Any]], dict[str, Any] | None]] = {}
        self.shuffle = False
        self.notify_before_reply = False
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Condition()
        self.conns: list[Conn] = []
        self.parked: list[Parked] = []
        self.interest: dict[tuple[str, int, str], set[Conn]] = {}
        if path is None:
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.bind(("127.0.0.1", 0))
            self.port = self._listener.getsockname()[1]
        else:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(path)
        self._listener.listen(64)
        self._threads: list[threading.Thread] = []
        self._stopping = False

    # --- lifecycle ---

    def start(self) -> FakeServer:
        thread = threading.Thread(target=self._accept_loop, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self.drop_all()
        for thread in self._threads:
            thread.join(timeout=5)

    def drop_all(self) -> None:
        with self.lock:
            conns = list(self.conns)
        for conn in conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def wait_connections(self, n: int, timeout: float = 5.0) -> None:
        """Block until exactly n connections are open (the fake has seen the others end)."""
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.conns) == n, timeout):
                raise AssertionError(f"{len(self.conns)} connections open, not {n}")

    def wait_parked(self, n: int, timeout: float = 5.0) -> None:
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.parked) >= n, timeout):
                raise AssertionError(f"only {len(self.parked)} of {n} reads parked")

    def wait_ops(self, op: str, n: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until n requests of ``op`` have come; they are returned."""
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.ops(op)) >= n, timeout):
                raise AssertionError(f"only {len(self.ops(op))} {op} requests of {n} came")
            return self.ops(op)

    def ops(self, op: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r.get("op") == op]

    @contextlib.contextmanager
    def engine(self, structure: str = "MSGQ01") -> Iterator[StructurePair]:
        """The structure itself, for a test to set up or look at, the lock held."""
        with self.lock:
            yield self.pairs[structure]

    def messages(self, structure: str = "MSGQ01") -> list[Entry]:
        """Every message the structure holds, in entry-id order."""
        with self.engine(structure) as pair:
            return list(pair)

    # --- serving ---

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            conn = Conn(sock)
            with self.lock:
                self.conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: Conn) -> None:
        decoder = FrameDecoder(max_frame_for(self.max_message))
        try:
            if self.tls is not None:
                try:
                    conn.sock.do_handshake()  # type: ignore[attr-defined]
                except OSError:
                    return
            while True:
                try:
                    data = conn.sock.recv(65536)
                except OSError:
                    data = b""
                decoder.receive_data(data)
                batch = []
                while True:
                    try:
                        frame = decoder.next_frame()
                    except ProtocolError as exc:
                        conn.send(error(None, exc.reason, exc.message))
                        return
                    if frame is NEED_DATA:
                        break
                    if frame is CLOSED:
                        return
                    batch.append(frame)
                self._answer(conn, batch)
                if conn.deregistered:
                    return
        finally:
            self._forget(conn)

    def _answer(self, conn: Conn, batch: list[dict[str, Any]]) -> None:
        """Reply to one read's requests; what they caused for others (notifications,
        waiting reads served) goes after the replies."""
        replies: list[dict[str, Any]] = []
        afters: list[Callable[[], None]] = []
        for frame in batch:
            with self.lock:
                self.requests.append(frame)
                self.lock.notify_all()
            reply = self._handle(conn, frame, afters)
            if reply is not None:
                replies.append(reply)
        if self.shuffle:
            random.shuffle(replies)
        for reply in replies:
            if self.notify_before_reply:
                conn.send(NOISE)
            conn.send(reply)
        for after in afters:
            after()

    def _forget(self, conn: Conn) -> None:
        afters: list[Callable[[], None]] = []
        with self.lock:
            if conn in self.conns:
                self.conns.remove(conn)
                self.lock.notify_all()
            for parked in [p for p in self.parked if p.conn is conn]:
                self._unpark(parked)
            for conns in self.interest.values():
                conns.discard(conn)
            if conn.client is not None and not conn.deregistered:
                for pair in self.pairs.values():  # peer recovery, with no grace
                    pair.release_client(conn.client)
                self._settle(afters)
        for after in afters:
            after()
        try:
            conn.sock.close()
        except OSError:
            pass

    def _handle(
        self, conn: Conn, frame: dict[str, Any], afters: list[Callable[[], None]]
    ) -> dict[str, Any] | None:
        if frame.get("op") in self.handlers:
            return self.handlers[frame["op"]](conn, frame)
        try:
            rid, op, args = requests.parse(frame)
        except ProtocolError as err:
            rid = frame.get("id")
            return error(rid if type(rid) is int else None, err.reason, err.message)
        if conn.client is None and op != "register":
            return error(rid, Reason.NOT_REGISTERED, f"{op}: register first")
        method = getattr(self, f"op_{op}", None)
        if method is None:
            return error(rid, Reason.INVALID_REQUEST, f"{op}: the fake server runs no jobs")
        with self.lock:
            try:
                result = method(conn, rid, **args)
            except CQSError as err:
                return error(rid, err.reason, err.message)
            finally:
                self._settle(afters)
        return None if result is PARKED else ok(rid, **result)

    # --- after each request, as the daemon's settle (called with the lock held) ---

    def _settle(self, afters: list[Callable[[], None]]) -> None:
        """Notify interest in queues that got work, and serve the waiting reads of
        queues that became readable; there is no log to write."""
        for pair in self.pairs.values():
            for event in pair.take_events():
                if type(event) is QueueWork:
                    note = notification(pair.name, event.qtype, event.name)
                    for conn in self.interest.get((pair.name, event.qtype, event.name), ()):
                        afters.append(lambda c=conn, n=note: c.send(n))
            while pair.readable:
                self._serve_parked(pair, pair.readable.pop(), afters)
            pair.take_record()

    def _serve_parked(self, pair: StructurePair, key: Key,
                      afters: list[Callable[[], None]]) -> None:
        for parked in [p for p in self.parked if p.pair is pair and p.key == key]:
            got = read_up_to(pair, parked.conn.client, key, parked.n, self.max_message)
            if not got:
                break
            self._unpark(parked)
            reply = ok(parked.rid, messages=[wire.message(e, e.data) for e in got])
            afters.append(lambda c=parked.conn, r=reply: c.send(r))

    def _unpark(self, parked: Parked) -> None:
        self.parked.remove(parked)
        if not any(p.pair is parked.pair and p.key == parked.key for p in self.parked):
            parked.pair.watched.discard(parked.key)

    # --- the ops: the engine's calls, as the daemon's handlers make them ---

    def _pair(self, name: str) -> StructurePair:
        if name not in self.pairs:
            raise CQSError(Reason.UNKNOWN_STRUCTURE, f"no structure named {name!r}")
        return self.pairs[name]

    def op_register(self, conn, rid, client, secret, cold, version, takeover, operator=False):
        if version != PROTOCOL_VERSION:
            raise CQSError(Reason.INVALID_REQUEST, f"protocol version {version}")
        holder = next((c for c in self.conns if c is not conn and c.client == client
                       and not c.deregistered), None)
        if holder is not None:
            if takeover is None or takeover != holder.token:
                raise CQSError(Reason.CLIENT_ACTIVE, f"client {client} is already registered")
            holder.deregistered = True  # as the daemon's cut: its locks stay the client's
            with contextlib.suppress(OSError):
                holder.sock.shutdown(socket.SHUT_RDWR)
        conn.client = client
        conn.token = f"{client}-{rid}-{random.random()}"
        locks = []
        for pair in self.pairs.values():
            if cold:
                pair.cold_client(client)
            else:
                locks += [wire.lock(pair.name, e) for e in pair.client_locks(client)]
        return {"version": PROTOCOL_VERSION, "server": "fake 0", "max_message": self.max_message,
                "structures": list(self.pairs), "locks": locks, "token": conn.token}

    def op_deregister(self, conn, rid):
        conn.deregistered = True  # before the reply: its name may register again at once
        for pair in self.pairs.values():
            pair.release_client(conn.client, failed=False)
        return {}

    def op_ping(self, conn, rid):
        return {}

    def op_connect(self, conn, rid, structure):
        return self._pair(structure).stats()

    def op_put(self, conn, rid, structure, queue, qtype, data, recoverable, delay, not_before,
               key=None):  # the fake takes no keys: it says no dedup_window at register
        Limits(self.max_message).check_message(data, recoverable)
        later = timing.not_before_ns("put", delay, not_before, time.time_ns())
        return {"entry_id": self._pair(structure).put(qtype, queue, data, recoverable, None,
                                                      later).entry_id}

    def op_read(self, conn, rid, structure, queue, qtype, n, wait, lease):
        pair = self._pair(structure)
        key = (parse_qtype(qtype), check_name(queue))
        lease = None if lease is None else timing.lease_seconds("read", lease)
        got = read_up_to(pair, conn.client, key, n, self.max_message, lease)
        if got:
            return {"messages": [wire.message(e, e.data) for e in got]}
        if not wait:
            raise CQSError(Reason.NO_MESSAGE, f"no readable message on {queue}")
        self.parked.append(Parked(conn, rid, pair, key, n))
        pair.watched.add(key)
        self.lock.notify_all()
        return PARKED

    def op_browse(self, conn, rid, structure, queue, qtype, cursor, limit):
        found, after = self._pair(structure).browse(qtype, queue, after=cursor, limit=limit)
        return {"messages": [wire.browsed(e, e.data) for e in found],
                "cursor": list(after) if after else None}

    def op_delete(self, conn, rid, structure, entry_id, operator, next):
        pair = self._pair(structure)
        if next is None:
            pair.delete(None if operator else conn.client, entry_id)
            return {}
        try:
            read = requests.next_read(next)
        except ProtocolError as err:
            raise CQSError(err.reason, err.message) from err
        key = (parse_qtype(read["qtype"]), check_name(read["queue"]))
        pair.delete(None if operator else conn.client, entry_id)
        afters: list[Callable[[], None]] = []
        self._settle(afters)  # parked reads first, as the daemon serves them
        for after in afters:
            after()
        lease = read["lease"]
        lease = None if lease is None else timing.lease_seconds("delete next", lease)
        got = read_up_to(pair, conn.client, key, read["n"], self.max_message, lease)
        return {"messages": [wire.message(e, e.data) for e in got]}

    def op_move(self, conn, rid, structure, entry_id, queue, qtype):
        self._pair(structure).move(conn.client, entry_id, qtype, queue)
        return {}

    def op_renew(self, conn, rid, structure, entry_id, lease):
        self._pair(structure).renew(conn.client, entry_id, timing.lease_seconds("renew", lease))
        return {}

    def op_unlock(self, conn, rid, structure, entry_id, failed, queue, qtype):
        e = self._pair(structure).unlock(conn.client, entry_id, failed=failed, qtype=qtype,
                                         name=queue)
        return {"qtype": QueueType(e.qtype).name, "queue": e.name}

    def op_commit(self, conn, rid, structure, ops, key=None):
        batch = [_commit_op(kind, f) for kind, f in requests.commit_ops(ops)]
        Limits(self.max_message).check_commit(batch)
        done = self._pair(structure).commit(conn.client, batch)
        return {"entry_ids": [e.entry_id for op, e in zip(batch, done, strict=True)
                              if type(op) is Put]}

    def op_register_interest(self, conn, rid, structure, queue, qtype):
        pair = self._pair(structure)
        key = (pair.name, parse_qtype(qtype), check_name(queue))
        self.interest.setdefault(key, set()).add(conn)
        if pair.queue_stats(key[1], queue)["depth"]:
            conn.send(notification(*key))  # as the daemon does, before the reply
        return {}

    def op_deregister_interest(self, conn, rid, structure, queue, qtype):
        key = (self._pair(structure).name, parse_qtype(qtype), check_name(queue))
        self.interest.get(key, set()).discard(conn)
        return {}

    def op_query(self, conn, rid, kind, structure):
        chosen = [self._pair(structure)] if structure is not None else list(self.pairs.values())
        if kind == "structures":
            rows = [{**s.stats(), "status": "available"} for s in chosen]
        elif kind == "queues":
            rows = [{"structure": s.name, **q,
                     "waiting": sum(p.pair is s and p.key == (QueueType[q["qtype"]], q["queue"])
                                    for p in self.parked)}
                    for s in chosen for q in s.queues(also=s.watched)]
        elif kind == "headers":
            rows = [{"structure": s.name, **h} for s in chosen for h in s.header_stats()]
        elif kind == "locks":
            rows = [{**wire.lock(s.name, e), "owner": e.owner}
                    for s in chosen for client in sorted(s.client_stats())
                    for e in s.client_locks(client)]
        elif kind == "clients":
            rows = [{"client": c.client, "peer": "fake", "tcp": self.path is None}
                    for c in self.conns if c.client and not c.deregistered]
        else:
            raise CQSError(Reason.INVALID_REQUEST, f"query: unknown kind {kind!r}")
        return {"rows": rows}

    def op_requeue(self, conn, rid, structure, entry_id):
        e = self._pair(structure).requeue(entry_id)
        return {"qtype": QueueType(e.qtype).name, "queue": e.name}

    def op_dequeue(self, conn, rid, structure, queue, qtype):
        return {"count": len(self._pair(structure).dequeue(qtype, queue))}

    def op_alter(self, conn, rid, structure, size):
        pair = self._pair(structure)
        pair.alter(size)
        return pair.stats()


PARKED = object()
NOISE = {"notify": "work", "structure": "MSGQ01", "qtype": "TRAN", "queue": "NOISE"}


def short_socket_path(tmp_path: Any) -> str:
    """A socket path short enough for AF_UNIX (108 bytes), near *tmp_path* if possible."""
    path = os.path.join(str(tmp_path), "s.sock")
    if len(path) < 100:
        return path
    return os.path.join(tempfile.mkdtemp(prefix="cqs"), "s.sock")
