"""The values the SDK hands back: messages, notifications, held locks, places.

All are frozen dataclasses with slots: they are results, not handles, and
thousands of them may be alive after a large browse or batch read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "BrowsePage",
    "HeldLock",
    "Location",
    "Message",
    "Notification",
    "QType",
    "QueueTypeName",
    "SmdsAccess",
    "SmdsExpand",
    "SmdsStatus",
]

QueueTypeName = Literal[
    "TRAN",
    "TRAN_STAGING",
    "TRAN_SUSPEND",
    "TRAN_SERIAL",
    "LTERM",
    "LTERM_STAGING",
    "APPC",
    "REMOTE",
    "OTMA",
    "USER1",
    "USER2",
]
"""The queue types of docs/protocol.md, by name, in number order (1-11)."""

QType = QueueTypeName | int
"""A queue type as a request takes it: its name, or its number (1-11)."""

SmdsAccess = Literal["enabled", "disabled"]
"""What ``reset_smds`` may set a data set's ACCESS to (docs/smds.md)."""

SmdsStatus = Literal["failed", "recovered"]
"""What ``reset_smds`` may set a data set's STATUS to (docs/smds.md)."""

SmdsExpand = Literal["yes", "no", "default"]
"""An ``alter_smds`` DSEXPAND override; ``"default"`` drops it (the structure's applies)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message as read or browsed.

    ``qtype`` is the queue type's name (``"TRAN"``, ``"LTERM"``, ...);
    ``put_time`` is nanoseconds since the epoch; ``delivery_count`` counts the
    reads with a lock, the current one included. ``where`` (``"ready"``,
    ``"locked"``, ``"cold"``), ``owner`` and ``home`` (the ``(qtype, queue)`` a
    suspended message came from) are set by browse only, and so is
    ``unavailable``: why the payload is not there (``data`` is then empty), for a
    message whose data is in a shared message data set that cannot be read now.
    """

    entry_id: int
    queue: str
    qtype: QueueTypeName
    data: bytes
    recoverable: bool
    put_time: int
    delivery_count: int
    structure: str = ""
    where: str | None = None
    owner: str | None = None
    home: tuple[str, str] | None = None
    unavailable: str | None = None

    def __repr__(self) -> str:
        # Payloads can be 100 MiB: a repr must not print them whole.
        data = self.data if len(self.data) <= 32 else self.data[:32] + b"..."
        return (
            f"Message(entry_id={self.entry_id}, structure={self.structure!r}, "
            f"qtype={self.qtype!r}, queue={self.queue!r}, data={data!r} ({len(self.data)} bytes), "
            f"delivery_count={self.delivery_count})"
        )


@dataclass(frozen=True, slots=True)
class Notification:
    """A queue of ``structure`` went from empty to non-empty (or held work at registration)."""

    structure: str
    qtype: QueueTypeName
    queue: str


@dataclass(frozen=True, slots=True)
class HeldLock:
    """A message this client still held when its previous connection dropped (warm resync)."""

    structure: str
    entry_id: int
    queue: str
    qtype: QueueTypeName


@dataclass(frozen=True, slots=True)
class Location:
    """Where an unlocked or requeued message went."""

    qtype: QueueTypeName
    queue: str


class BrowsePage(list[Message]):
    """One page of a browse: a list of messages plus the ``cursor`` for the next page.

    ``cursor`` is None when the browse is complete.
    """

    __slots__ = ("cursor",)

    def __init__(self, messages: list[Message], cursor: Any = None) -> None:
        super().__init__(messages)
        self.cursor = cursor

    def __repr__(self) -> str:
        return f"BrowsePage({list.__repr__(self)}, cursor={self.cursor!r})"
