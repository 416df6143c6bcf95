"""A small fake cqsd for the SDK tests: a real Unix socket speaking the real codec.

It keeps a dumb in-memory model (a dict of message maps by entry id) and
answers the ops of docs/protocol.md well enough for the SDK and cqsctl to be
exercised end to end without the daemon. It is not the daemon: no list
headers, no capacity, no logging, no timeouts for waiting reads (a parked read
is served by a put or ended by a drop). Each connection has its own thread;
the model is guarded by one lock. It listens on a Unix socket, or on TCP
127.0.0.1 (with TLS if given a context) for the TLS tests.

Knobs for tests: ``handlers[op]`` overrides an op (a function of the
connection and the request returning the reply map, or None to send none);
``shuffle`` replies to the requests of one read in random order;
``notify_before_reply`` sends a notification before every reply;
``drop_all()`` cuts every connection; ``wait_parked(n)`` blocks until n reads
wait for messages; ``requests`` records every request received.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cqsproto import (
    CLOSED,
    NEED_DATA,
    PROTOCOL_VERSION,
    FrameDecoder,
    ProtocolError,
    encode_frame,
)

QTYPES = {
    1: "TRAN",
    3: "TRAN_SUSPEND",
    4: "TRAN_SERIAL",
    5: "LTERM",
    7: "APPC",
    8: "REMOTE",
    9: "OTMA",
    10: "USER1",
    11: "USER2",
}
QTYPE_NAMES = set(QTYPES.values())


class Refused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    client: str | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def send(self, frame: dict[str, Any]) -> None:
        try:
            with self.send_lock:
                self.sock.sendall(encode_frame(frame))
        except OSError:
            pass


def error(rid: Any, reason: str, message: str) -> dict[str, Any]:
    return {"id": rid, "ok": False, "reason": reason, "message": message}


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
        self.structures = list(structures)
        self.resync_locks: list[dict[str, Any]] = []
        self.handlers: dict[str, Callable[[Conn, dict[str, Any]], dict[str, Any] | None]] = {}
        self.shuffle = False
        self.notify_before_reply = False
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Condition()
        self.conns: list[Conn] = []
        self.entries: dict[int, dict[str, Any]] = {}  # entry_id -> message map + bookkeeping
        self.parked: list[tuple[Conn, dict[str, Any]]] = []
        self.interest: dict[tuple[str, str, str], set[Conn]] = {}
        self._ids = itertools.count(1_000)
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

    def wait_parked(self, n: int, timeout: float = 5.0) -> None:
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.parked) >= n, timeout):
                raise AssertionError(f"only {len(self.parked)} of {n} reads parked")

    def ops(self, op: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r.get("op") == op]

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
        decoder = FrameDecoder()
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
                if conn.client == "":  # deregistered
                    return
        finally:
            self._forget(conn)

    def _answer(self, conn: Conn, batch: list[dict[str, Any]]) -> None:
        replies: list[dict[str, Any]] = []
        afters: list[Callable[[], None]] = []
        for frame in batch:
            with self.lock:
                self.requests.append(frame)
                conn.requests.append(frame)
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
        with self.lock:
            if conn in self.conns:
                self.conns.remove(conn)
            self.parked = [(c, f) for c, f in self.parked if c is not conn]
            for conns in self.interest.values():
                conns.discard(conn)
            # Peer recovery, roughly: a dropped client's locks are released.
            if conn.client:
                for entry in self.entries.values():
                    if entry["owner"] == conn.client:
                        entry["owner"] = None
        try:
            conn.sock.close()
        except OSError:
            pass

    def _handle(
        self, conn: Conn, frame: dict[str, Any], afters: list[Callable[[], None]]
    ) -> dict[str, Any] | None:
        rid = frame.get("id")
        op = frame.get("op")
        if op in self.handlers:
            return self.handlers[op](conn, frame)
        if op != "register" and not conn.client:
            return error(rid, "NOT_REGISTERED", f"{op} before register")
        method = getattr(self, f"op_{op}", None)
        if method is None:
            return error(rid, "INVALID_REQUEST", f"unknown op {op!r}")
        try:
            with self.lock:
                result = method(conn, frame, afters)
        except Refused as refused:
            return error(rid, refused.reason, refused.message)
        if result is PARKED:
            return None
        return {"id": rid, "ok": True, "result": result}

    # --- the model (called with the lock held) ---

    def _structure(self, frame: dict[str, Any]) -> str:
        name = frame.get("structure")
        if name not in self.structures:
            raise Refused("UNKNOWN_STRUCTURE", f"no structure named {name!r}")
        return name

    @staticmethod
    def _qtype(value: Any) -> str:
        if value in QTYPE_NAMES:
            return value
        if value in QTYPES:
            return QTYPES[value]
        raise Refused("INVALID_REQUEST", f"unknown queue type {value!r}")

    def _ready(self, structure: str, qtype: str, queue: str) -> list[dict[str, Any]]:
        return sorted(
            (
                e
                for e in self.entries.values()
                if e["structure"] == structure
                and e["qtype"] == qtype
                and e["queue"] == queue
                and e["owner"] is None
                and e["where"] == "ready"
            ),
            key=lambda e: e["entry_id"],
        )

    def _entry(self, structure: str, entry_id: Any) -> dict[str, Any]:
        entry = self.entries.get(entry_id)
        if entry is None or entry["structure"] != structure:
            raise Refused("ENTRY_NOT_FOUND", f"no entry {entry_id} in {structure}")
        return entry

    @staticmethod
    def wire(entry: dict[str, Any], browse: bool = False) -> dict[str, Any]:
        keys = ["entry_id", "queue", "qtype", "data", "recoverable", "put_time", "delivery_count"]
        message = {k: entry[k] for k in keys}
        if browse:
            message["where"] = "locked" if entry["owner"] else entry["where"]
            message["owner"] = entry["owner"]
            if entry.get("home"):
                message["home"] = list(entry["home"])
        return message

    def _add(
        self, structure: str, queue: str, qtype: str, data: bytes, recoverable: bool,
        afters: list[Callable[[], None]],
    ) -> int:
        key = (structure, qtype, queue)
        was_empty = not self._ready(*key)
        entry_id = next(self._ids)
        self.entries[entry_id] = {
            "structure": structure, "entry_id": entry_id, "queue": queue, "qtype": qtype,
            "data": data, "recoverable": recoverable, "put_time": time.time_ns(),
            "delivery_count": 0, "owner": None, "where": "ready", "home": None,
        }
        if was_empty:
            for conn in self.interest.get(key, ()):
                note = {"notify": "work", "structure": structure, "qtype": qtype, "queue": queue}
                afters.append(lambda c=conn, n=note: c.send(n))
        afters.append(lambda: self._serve_parked(key))
        return entry_id

    def _serve_parked(self, key: tuple[str, str, str]) -> None:
        with self.lock:
            for conn, frame in list(self.parked):
                qtype = self._qtype(frame.get("qtype", "TRAN"))
                if (frame["structure"], qtype, frame["queue"]) != key:
                    continue
                messages = self._lock_some(conn, key, frame.get("n", 1))
                if not messages:
                    break
                self.parked.remove((conn, frame))
                conn.send(ok(frame["id"], messages=messages))

    def _lock_some(self, conn: Conn, key: tuple[str, str, str], n: int) -> list[dict[str, Any]]:
        taken = self._ready(*key)[:n]
        for entry in taken:
            entry["owner"] = conn.client
            entry["delivery_count"] += 1
        return [self.wire(e) for e in taken]

    def op_register(self, conn, frame, afters):
        if frame.get("version") != PROTOCOL_VERSION:
            raise Refused("INVALID_REQUEST", f"protocol version {frame.get('version')}")
        name = frame["client"]
        if any(c.client == name for c in self.conns if c is not conn):
            raise Refused("CLIENT_ACTIVE", f"client {name} is already registered")
        conn.client = name
        return {
            "version": PROTOCOL_VERSION, "server": "fake 0", "max_message": self.max_message,
            "structures": self.structures, "locks": self.resync_locks,
        }

    def op_deregister(self, conn, frame, afters):
        conn.client = ""  # before the reply: its name is free to register again at once
        return {}

    def op_connect(self, conn, frame, afters):
        name = self._structure(frame)
        count = sum(1 for e in self.entries.values() if e["structure"] == name)
        return {"name": name, "entries": count}

    def op_put(self, conn, frame, afters):
        structure = self._structure(frame)
        data = frame["data"]
        if len(data) > self.max_message:
            raise Refused("MESSAGE_TOO_LARGE", f"{len(data)} bytes")
        qtype = self._qtype(frame.get("qtype", "TRAN"))
        entry_id = self._add(
            structure, frame["queue"], qtype, data, frame.get("recoverable", True), afters
        )
        return {"entry_id": entry_id}

    def op_read(self, conn, frame, afters):
        structure = self._structure(frame)
        key = (structure, self._qtype(frame.get("qtype", "TRAN")), frame["queue"])
        messages = self._lock_some(conn, key, frame.get("n", 1))
        if messages:
            return {"messages": messages}
        if frame.get("wait") is not None:
            self.parked.append((conn, frame))
            self.lock.notify_all()
            return PARKED
        raise Refused("NO_MESSAGE", f"queue {frame['queue']} is empty")

    def op_browse(self, conn, frame, afters):
        structure = self._structure(frame)
        queue, qtype = frame.get("queue"), frame.get("qtype")
        if qtype is not None:
            qtype = self._qtype(qtype)
        chosen = [
            e
            for _, e in sorted(self.entries.items())
            if e["structure"] == structure
            and (queue is None or e["queue"] == queue)
            and (qtype is None or e["qtype"] == qtype)
        ]
        start = frame.get("cursor") or 0
        limit = frame.get("limit", 100)
        page = chosen[start : start + limit]
        cursor = start + limit if start + limit < len(chosen) else None
        return {"messages": [self.wire(e, browse=True) for e in page], "cursor": cursor}

    def op_delete(self, conn, frame, afters):
        structure = self._structure(frame)
        entry = self._entry(structure, frame["entry_id"])
        self._check_lock(conn, entry, frame.get("operator", False))
        del self.entries[entry["entry_id"]]
        return {}

    def _check_lock(self, conn: Conn, entry: dict[str, Any], operator: bool) -> None:
        owner = entry["owner"]
        if operator and owner not in (None, conn.client):
            raise Refused("LOCK_NOT_HELD", f"entry {entry['entry_id']} is locked by {owner}")
        if not operator and owner != conn.client:
            raise Refused("LOCK_NOT_HELD", f"entry {entry['entry_id']} is not locked by you")

    def op_move(self, conn, frame, afters):
        structure = self._structure(frame)
        entry = self._entry(structure, frame["entry_id"])
        self._check_lock(conn, entry, operator=True)
        qtype = self._qtype(frame.get("qtype", "TRAN"))
        entry.update(queue=frame["queue"], qtype=qtype, owner=None)
        return {}

    def op_unlock(self, conn, frame, afters):
        structure = self._structure(frame)
        entry = self._entry(structure, frame["entry_id"])
        self._check_lock(conn, entry, operator=False)
        entry["owner"] = None
        if frame.get("queue") is not None:
            entry.update(queue=frame["queue"], qtype=self._qtype(frame.get("qtype") or "TRAN"))
        key = (structure, entry["qtype"], entry["queue"])
        afters.append(lambda: self._serve_parked(key))
        return {"qtype": entry["qtype"], "queue": entry["queue"]}

    def op_commit(self, conn, frame, afters):
        structure = self._structure(frame)
        for op in frame["ops"]:  # validate everything first: all or nothing
            if op["op"] != "put":
                self._check_lock(conn, self._entry(structure, op["entry_id"]), op["op"] == "move")
        entry_ids = []
        for op in frame["ops"]:
            kind = op["op"]
            if kind == "put":
                entry_ids.append(self._add(
                    structure, op["queue"], self._qtype(op["qtype"]), op["data"],
                    op["recoverable"], afters,
                ))
            elif kind == "delete":
                del self.entries[op["entry_id"]]
            elif kind == "move":
                qtype = self._qtype(op["qtype"])
                self.entries[op["entry_id"]].update(queue=op["queue"], qtype=qtype, owner=None)
            elif kind == "unlock":
                self.entries[op["entry_id"]]["owner"] = None
        return {"entry_ids": entry_ids}

    def op_register_interest(self, conn, frame, afters):
        structure = self._structure(frame)
        key = (structure, self._qtype(frame.get("qtype", "TRAN")), frame["queue"])
        self.interest.setdefault(key, set()).add(conn)
        if self._ready(*key):
            note = {"notify": "work", "structure": key[0], "qtype": key[1], "queue": key[2]}
            afters.append(lambda: conn.send(note))
        return {}

    def op_deregister_interest(self, conn, frame, afters):
        structure = self._structure(frame)
        key = (structure, self._qtype(frame.get("qtype", "TRAN")), frame["queue"])
        self.interest.get(key, set()).discard(conn)
        return {}

    def op_query(self, conn, frame, afters):
        kind = frame["kind"]
        wanted = frame.get("structure")
        if wanted is not None:
            self._structure(frame)
        names = [s for s in self.structures if wanted in (None, s)]
        if kind == "structures":
            rows = [
                {"name": s, "entries": sum(e["structure"] == s for e in self.entries.values()),
                 "status": "ACTIVE"}
                for s in names
            ]
        elif kind == "queues":
            depth: dict[tuple[str, str, str], int] = {}
            for e in self.entries.values():
                if e["structure"] in names:
                    key = (e["structure"], e["qtype"], e["queue"])
                    depth[key] = depth.get(key, 0) + 1
            rows = [{"structure": s, "qtype": t, "queue": q, "depth": d}
                    for (s, t, q), d in sorted(depth.items())]
        elif kind == "clients":
            rows = [{"client": c.client, "connected": True} for c in self.conns if c.client]
        elif kind == "locks":
            rows = [{"structure": e["structure"], "entry_id": e["entry_id"], "owner": e["owner"],
                     "qtype": e["qtype"], "queue": e["queue"]}
                    for e in self.entries.values() if e["owner"] and e["structure"] in names]
        elif kind == "headers":
            rows = [{"structure": s, "lh": 71, "entries": 0} for s in names]
        else:
            raise Refused("INVALID_REQUEST", f"unknown query kind {kind!r}")
        return {"rows": rows}

    def op_requeue(self, conn, frame, afters):
        structure = self._structure(frame)
        entry = self._entry(structure, frame["entry_id"])
        if not entry.get("home"):
            raise Refused("INVALID_REQUEST", f"entry {entry['entry_id']} has no home to go back to")
        qtype, queue = entry["home"]
        entry.update(qtype=qtype, queue=queue, home=None, where="ready", owner=None)
        return {"qtype": qtype, "queue": queue}

    def op_dequeue(self, conn, frame, afters):
        structure = self._structure(frame)
        key = (structure, self._qtype(frame.get("qtype", "TRAN")), frame["queue"])
        ready = self._ready(*key)
        for entry in ready:
            del self.entries[entry["entry_id"]]
        return {"count": len(ready)}


PARKED = object()
NOISE = {"notify": "work", "structure": "MSGQ01", "qtype": "TRAN", "queue": "NOISE"}


def short_socket_path(tmp_path: Any) -> str:
    """A socket path short enough for AF_UNIX (108 bytes), near *tmp_path* if possible."""
    path = os.path.join(str(tmp_path), "s.sock")
    if len(path) < 100:
        return path
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix="cqs"), "s.sock")
