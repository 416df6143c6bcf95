"""How the SDK reads the daemon's replies: the :class:`Call` every request is
made into, and the functions that turn a reply's result into Python values.

Design note
-----------
The requests are built in ``ops.py`` from what callers pass, as they pass it:
a value of the wrong type goes to the daemon, which refuses it with a reason
code. What the daemon answers is read here. The two are apart because this
module is compiled with the connection (docs/native.md) and ``ops.py`` is not:
compiled code checks a declared argument type when it is called, so a builder
compiled would raise TypeError where the daemon answers INVALID_REQUEST. A
reply's value of the wrong type is caught the same way on both builds:
``Call.finish`` makes the TypeError, like a missing field, a ProtocolViolation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cqsproto import PROTOCOL_VERSION

from .errors import CQSError, NoMessage, ProtocolViolation, error_from_reply
from .model import HeldLock, Location, Message, Notification, QueueTypeName

Interest = tuple[str, str, QueueTypeName]
"""An interest as (structure, queue, queue type name)."""

MAX_LOCAL_WAIT: Final = 365 * 24 * 3600.0


class _Raise:
    def __repr__(self) -> str:
        return "RAISE"


RAISE: Final = _Raise()
"""``Call.empty`` value meaning NO_MESSAGE is raised like any other error."""


class Call:
    """One request: the map to send, how to read its reply, and what it does to locks."""

    __slots__ = ("empty", "job", "keyed", "large", "locks", "parse", "releases", "request",
                 "retry")

    def __init__(
        self,
        request: dict[str, Any],
        parse: Callable[[dict[str, Any]], Any],
        empty: Any = RAISE,
        locks: bool = False,
        *,
        retry: bool = False,
        releases: tuple[int, ...] = (),
        job: bool = False,
        large: bool = False,
        keyed: bool = False,
    ) -> None:
        self.request = request
        self.parse = parse
        # The value a NO_MESSAGE reply stands for, or RAISE.
        self.empty = empty
        # True if a successful reply locks messages for this client (reads): an
        # async caller cancelled while waiting must give them back.
        self.locks = locks
        self.retry = retry
        self.releases = releases
        self.job = job
        # True if the request carries a payload of LARGE bytes or more: it is
        # encoded around it (cqsproto.encode_frame), one copy rather than three.
        self.large = large
        # True for a put or a commit: it carries an idempotency key (cqsclient.keys), so
        # that after a reconnect it may be sent again and is applied once.
        self.keyed = keyed

    @property
    def wait(self) -> float:
        """Seconds the server may wait before it replies (a waiting read's ``wait``).
        A wait the server will refuse (not a number, NaN, negative) counts as none,
        and one of more than a year as a year, so that the deadline stays a time."""
        try:
            wait = float(self.request.get("wait") or 0)
        except (TypeError, ValueError):
            return 0.0
        return min(wait, MAX_LOCAL_WAIT) if wait > 0 else 0.0

    @property
    def structure(self) -> str:
        """The structure the request names ("" for none)."""
        return str(self.request.get("structure") or "")

    def finish(self, reply: dict[str, Any]) -> Any:
        """The result of this call given its *reply*; raises the reply's CQSError."""
        if reply.get("ok") is True:
            result = reply.get("result")
            try:
                return self.parse(result if result is not None else {})
            except (KeyError, TypeError, ValueError, AttributeError) as bad:
                op = self.request.get("op")
                raise ProtocolViolation(
                    f"malformed result for {op!r}: {bad!r} in {_abbrev(result)}"
                ) from bad
        error = error_from_reply(reply)
        if self.empty is not RAISE and isinstance(error, NoMessage):
            return self.empty
        raise error


def _abbrev(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def nothing(result: dict[str, Any]) -> None:
    return None


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    return list(result["rows"])


def location(result: dict[str, Any]) -> Location:
    return Location(result["qtype"], result["queue"])


def message_from_wire(wire: dict[str, Any], structure: str) -> Message:
    """A Message from its protocol map (docs/protocol.md, "Messages")."""
    home = wire.get("home")
    return Message(
        entry_id=wire["entry_id"],
        queue=wire["queue"],
        qtype=wire["qtype"],
        data=wire["data"],
        recoverable=wire["recoverable"],
        put_time=wire["put_time"],
        delivery_count=wire["delivery_count"],
        structure=structure,
        where=wire.get("where"),
        owner=wire.get("owner"),
        home=(home[0], home[1]) if home else None,
        unavailable=wire.get("unavailable"),
    )


@dataclass(frozen=True, slots=True)
class Session:
    """What the server said at registration."""

    server: str
    version: int
    max_message: int
    structures: list[str]
    locks: list[HeldLock]
    token: str | None  # for a takeover by this client's next connection
    # the interests the daemon kept for this client and registered again for this
    # connection (registered before it, or before the daemon restarted)
    interests: list[Interest]
    dedup_window: float = 0.0  # seconds the daemon remembers a put's key (0: keys not taken)


def session_from_wire(result: dict[str, Any]) -> Session:
    return Session(
        server=str(result.get("server", "")),
        version=int(result.get("version", PROTOCOL_VERSION)),
        max_message=int(result["max_message"]),
        structures=list(result.get("structures", [])),
        locks=[
            HeldLock(lock["structure"], lock["entry_id"], lock["queue"], lock["qtype"])
            for lock in result.get("locks", [])
        ],
        token=result.get("token"),
        interests=[(i["structure"], i["queue"], i["qtype"]) for i in result.get("interests", [])],
        dedup_window=float(result.get("dedup_window") or 0),
    )


def notification_from_wire(frame: dict[str, Any]) -> Notification | None:
    """The Notification for an unsolicited frame, or None if it is not one we know."""
    if frame.get("notify") != "work":
        return None
    try:
        return Notification(frame["structure"], frame["qtype"], frame["queue"])
    except KeyError:
        return None


def unexpected_close_detail(frame: dict[str, Any]) -> str:
    """Words for the server's id-less error frame that precedes it closing the connection."""
    error: CQSError = error_from_reply(frame)
    return f"the server refused a frame and closed the connection ({error})"
