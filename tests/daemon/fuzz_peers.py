"""The fuzzer's connections to a live daemon: raw frames over a plain socket, to
send what no SDK would, and the SDK itself; both give every reply back as a
checked ``Reply``, so the rules of test_fuzz.py treat them alike.

Every reply is checked on arrival: it echoes the request id, and a refusal
carries one reason code of docs/protocol.md and a message. No wait here is a sleep: a
peer waits for bytes with a deadline, and a daemon that misses it is reported
as unresponsive.
"""

import socket
import threading
from dataclasses import dataclass
from typing import Any

import cqsclient
from cqsclient.client import StructureHandle
from cqsclient.errors import ConnectionLost, CQSError
from cqsproto import (
    MAX_FRAME_LIMIT,
    NEED_DATA,
    PROTOCOL_VERSION,
    FrameDecoder,
    ProtocolError,
    encode_frame,
)

# docs/protocol.md, "Reason codes" (a contract): the only reason codes a refusal may carry.
REASONS = frozenset({
    "NO_MESSAGE", "STRUCTURE_FULL", "OVERFLOW_REJECTED", "STRUCTURE_FAILED", "SMDS_UNAVAILABLE",
    "MESSAGE_TOO_LARGE", "ENTRY_NOT_FOUND", "LOCK_NOT_HELD", "NOT_AUTHORIZED", "NOT_REGISTERED",
    "CLIENT_ACTIVE", "CLIENT_LIMIT", "UNKNOWN_STRUCTURE", "INVALID_REQUEST", "SHUTTING_DOWN",
    "SMDS_FULL",
})
ANSWER_TIMEOUT = 60.0  # seconds a daemon may take to answer one request (a 20 MiB put)


class Unresponsive(AssertionError):
    """The daemon did not answer within ANSWER_TIMEOUT."""


@dataclass
class Reply:
    ok: bool
    result: Any = None
    reason: str | None = None
    message: str = ""
    rid: Any = None

    def __repr__(self) -> str:
        if self.ok:
            return f"ok({_short(self.result)})"
        return f"{self.reason}({self.message[:120]!r})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 200 else text[:197] + "..."


def checked(frame: dict) -> Reply:
    """A reply frame as a Reply; AssertionError if it is not one docs/protocol.md allows."""
    assert isinstance(frame.get("ok"), bool), f"reply without ok: {_short(frame)}"
    if frame["ok"]:
        assert isinstance(frame.get("result"), dict), f"ok reply without a result: {_short(frame)}"
        return Reply(True, frame["result"], rid=frame.get("id"))
    reason, message = frame.get("reason"), frame.get("message")
    assert reason in REASONS, f"refusal without a reason code of docs/protocol.md: {_short(frame)}"
    assert isinstance(message, str) and message, f"refusal without a message: {_short(frame)}"
    return Reply(False, reason=reason, message=message, rid=frame.get("id"))


class RawPeer:
    """Frames by hand. ``closed`` once the daemon has ended the connection."""

    kind = "raw"

    def __init__(self, path: str, max_frame: int = MAX_FRAME_LIMIT) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(ANSWER_TIMEOUT)
        self.sock.connect(path)
        self.decoder = FrameDecoder(max_frame)
        self.next_id = 0
        self.notes: list[dict] = []
        self.closed = False
        self.client: str | None = None
        self.interests: set = set()  # (structure, key) it asked to hear of
        self.expect: set = set()  # of those, what must be notified by the next check

    def send(self, data: bytes) -> bool:
        """False if the daemon had already closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def frame_for(self, op: str, **fields) -> tuple[int, bytes]:
        self.next_id += 1
        return self.next_id, encode_frame({"id": self.next_id, "op": op, **fields}, MAX_FRAME_LIMIT)

    def send_request(self, op: str, **fields) -> int:
        rid, frame = self.frame_for(op, **fields)
        self.send(frame)
        return rid

    def request(self, op: str, timeout: float = ANSWER_TIMEOUT, **fields) -> Reply | None:
        """Send one request and return its reply; None if the connection ended first."""
        self.sock.settimeout(timeout)
        try:
            return self.reply(self.send_request(op, **fields))
        finally:
            if not self.closed:
                self.sock.settimeout(ANSWER_TIMEOUT)

    def body_size(self, op: str, **fields) -> int:
        """The body length of the frame ``send_request`` would send next."""
        return len(encode_frame({"id": self.next_id + 1, "op": op, **fields}, MAX_FRAME_LIMIT)) - 4

    def reply(self, rid: Any) -> Reply | None:
        """The reply to request ``rid`` (notifications on the way are kept in
        ``notes``); a protocol-error reply (id nil) ends the wait; None at EOF."""
        while True:
            frame = self.next_frame()
            if frame is None:
                return None
            if "notify" in frame and "id" not in frame:
                self.notes.append(frame)
                continue
            got = checked(frame)
            assert frame.get("id") in (rid, None), (
                f"reply to request {frame.get('id')!r} while waiting for {rid!r}: {got}")
            return got

    def next_frame(self) -> dict | None:
        while True:
            try:
                frame = self.decoder.next_frame()
            except ProtocolError as err:
                raise AssertionError(f"the daemon sent a malformed frame: {err}") from None
            if frame is not NEED_DATA:
                if not isinstance(frame, dict):
                    self.closed = True
                    return None
                return frame
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                raise Unresponsive(
                    f"no frame from the daemon within {self.sock.gettimeout()}s") from None
            self.decoder.receive_data(data)

    def drain_notes(self) -> list[dict]:
        """Notifications already sent to this connection (none is waited for)."""
        self.sock.settimeout(0)
        try:
            while True:
                try:
                    data = self.sock.recv(1 << 20)
                except BlockingIOError:
                    break
                except ConnectionResetError:
                    data = b""
                self.decoder.receive_data(data)
                while (frame := self.decoder.next_frame()) is not NEED_DATA:
                    if not isinstance(frame, dict):
                        self.closed = True
                        break
                    assert "notify" in frame, f"an unsolicited frame, not a notification: {frame}"
                    self.notes.append(frame)
                if not data:
                    break
        finally:
            self.sock.settimeout(ANSWER_TIMEOUT)
        notes, self.notes = self.notes, []
        return notes

    def at_eof(self) -> bool:
        """Whether the daemon closes the connection (notifications may come first)."""
        while (frame := self.next_frame()) is not None:
            if "notify" not in frame:
                return False
            self.notes.append(frame)
        return True

    def pipeline(self, frames: list[tuple[int, bytes]]) -> list[Reply | None]:
        """Send many requests while reading their replies, as docs/protocol.md asks
        of a pipelining client; a None for each reply lost to the connection ending."""
        sender = threading.Thread(target=self.send, args=(b"".join(f for _, f in frames),))
        sender.start()
        try:
            replies = []
            for rid, _ in frames:
                replies.append(None if self.closed else self.reply(rid))
            return replies
        finally:
            sender.join()

    def register(self, client: str, cold: bool = False) -> Reply | None:
        return self.request("register", client=client, version=PROTOCOL_VERSION, cold=cold)

    def shut_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class SdkPeer:
    """A registered cqsclient.Client; every call is watched so that a daemon that
    stops answering fails the step instead of hanging the test."""

    kind = "sdk"

    def __init__(self, client: cqsclient.Client) -> None:
        self.sdk = client
        self.client: str | None = client.name
        self.closed = False
        self.notes: list[dict] = []
        self.interests: set = set()
        self.expect: set = set()

    def call(self, fn, timeout: float | None = None) -> Reply | None:
        """Run an SDK call; its value as an ok Reply, its CQSError as a refusal,
        None if the connection was lost."""
        timer = threading.Timer(timeout or ANSWER_TIMEOUT, self.sdk.abort)
        timer.start()
        try:
            return Reply(True, fn())
        except ConnectionLost:
            if timer.finished.is_set():  # it fired: the daemon did not answer
                raise Unresponsive(f"no reply to an SDK call within {timer.interval}s") from None
            self.closed = True
            return None
        except CQSError as err:
            assert err.reason in REASONS, f"SDK error without a reason of docs/protocol.md: {err!r}"
            return Reply(False, reason=err.reason, message=err.message)
        finally:
            timer.cancel()

    def drain_notes(self) -> list[dict]:
        try:
            got = [{"notify": "work", "structure": n.structure, "qtype": n.qtype, "queue": n.queue}
                   for n in self.sdk.notifications(timeout=0.001)]
        except ConnectionLost:
            self.closed = True
            got = []
        return got

    def close(self) -> None:
        self.closed = True
        self.sdk.abort()


def message_map(m) -> dict:
    """An SDK Message as the wire shows it, for the checks both peers share."""
    return {"entry_id": m.entry_id, "queue": m.queue, "qtype": m.qtype, "data": m.data,
            "recoverable": m.recoverable, "delivery_count": m.delivery_count,
            "where": m.where, "owner": m.owner, "home": list(m.home) if m.home else None}


def sdk_request(peer: SdkPeer, op: str, f: dict, timeout: float | None = None) -> Reply | None:
    """Request ``op`` with wire fields ``f`` made the SDK's way, its reply in the
    wire's shape (an empty read is NO_MESSAGE, as on the wire)."""
    c = peer.sdk
    h = StructureHandle(c, f.get("structure"), {})

    def page(p):
        return {"messages": [message_map(m) for m in p], "cursor": p.cursor}

    def commit():
        with h.unit_of_work() as uow:
            for o in f["ops"]:
                getattr(uow, o["op"])(**{k: v for k, v in o.items() if k != "op"})
        return {"entry_ids": uow.entry_ids}

    def place(location):
        return {"qtype": location.qtype, "queue": location.queue}

    calls = {
        "put": lambda: {"entry_id": h.put(f["queue"], f["data"], f["qtype"], f["recoverable"],
                                          delay=f.get("delay"),
                                          not_before=f.get("not_before"))},
        "read": lambda: {"messages": [message_map(m) for m in h.read_batch(
            f["queue"], f["n"], f["qtype"], f["wait"], lease=f.get("lease"))]},
        "renew": lambda: h.renew(f["entry_id"], f["lease"]),
        "browse": lambda: page(h.browse(f["queue"], f["qtype"], f["limit"], f["cursor"])),
        "delete": lambda: (h.operator_delete if f["operator"] else h.delete)(f["entry_id"])
        if f.get("next") is None else {"messages": [message_map(m) for m in h.delete_and_read(
            f["entry_id"], f["next"]["queue"], f["next"]["n"], f["next"]["qtype"])]},
        "move": lambda: h.move(f["entry_id"], f["queue"], f["qtype"]),
        "unlock": lambda: place(h.unlock(f["entry_id"], f["failed"], f["queue"], f["qtype"])),
        "commit": commit,
        "register_interest": lambda: c.register_interest(f["structure"], f["queue"], f["qtype"]),
        "deregister_interest": lambda: c.deregister_interest(f["structure"], f["queue"],
                                                             f["qtype"]),
        "query": lambda: {"rows": c.query(f["kind"], f["structure"])},
        "requeue": lambda: place(h.requeue(f["entry_id"])),
        "dequeue": lambda: {"count": h.dequeue(f["queue"], f["qtype"])},
        "alter": lambda: c.alter(f["structure"], f["size"]),
        "rebuild": lambda: c.rebuild(f["structure"], f["size"]),
        "checkpoint": lambda: c.checkpoint(f["structure"]),
        "recover": lambda: c.recover(f["structure"], f["purge"]),
        "delete_structure": lambda: c.delete_structure(f["structure"], force=f.get("force", False)),
        "connect": lambda: c.structure(f["structure"]).stats,
        "reset_smds": lambda: c.reset_smds(f["structure"], f["owner"], access=f.get("access"),
                                           status=f.get("status")),
        "start_smdsconn": lambda: {"rows": c.start_smdsconn(f["structure"], f["owner"])},
        "stop_smdsconn": lambda: {"rows": c.stop_smdsconn(f["structure"], f["owner"])},
        "alter_smds": lambda: c.alter_smds(f["structure"], f["owner"], dsbufs=f["dsbufs"],
                                           dsexpand=f["dsexpand"]),
        "deregister": c.deregister,
    }
    reply = peer.call(lambda: calls[op]() or {}, timeout=timeout)
    if reply is not None and reply.ok and op == "read" and not reply.result["messages"]:
        return Reply(False, reason="NO_MESSAGE", message="the SDK's empty read")
    return reply
