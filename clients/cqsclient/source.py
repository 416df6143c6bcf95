"""What a consumer needs of the structure it reads from, declared once.

A consume loop (``consume.py``, ``aioconsume.py``) reads, settles and gives
back messages of one structure, and looks at its client's lock book after a
reconnect. It asks for exactly that through a :class:`Source` (or an
:class:`AsyncSource`), which ``StructureHandle.consume`` makes from the handle
and its client (``client.py``, ``aio.py``). So the consumer modules import no
client module and call none of a client's private methods: the imports of the
SDK go one way, client → consume → source (``tests/client/test_imports.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from .ops import Call, Timeout

__all__ = ["AsyncSource", "HandleSource", "Source", "SourceBase"]


class SourceBase(Protocol):
    """What both consumers look at without waiting."""

    @property
    def handle(self) -> object:
        """The StructureHandle the consumer came from (``Consumer.handle``)."""
        ...

    @property
    def name(self) -> str:
        """The structure's name."""
        ...

    @property
    def reconnects(self) -> bool:
        """True if the client replaces a lost connection (it has a ``reconnect`` policy)."""
        ...

    @property
    def closed(self) -> bool:
        """True once the client's connection is closed or lost."""
        ...

    @property
    def last_resync(self) -> object:
        """The client's report of its last reconnect: a new object after each one."""
        ...

    def holds(self, structure: str, entry_id: int) -> bool | None:
        """Whether the client still holds this lock (None if it keeps no lock book)."""
        ...


class Source(SourceBase, Protocol):
    """A structure as the blocking consumer sees it."""

    def request(
        self, call: Call, timeout: Timeout, cancelled: Callable[[], bool] | None = None
    ) -> Any:
        """Send *call* and return its reply's value, as every request of the client
        (reconnecting if the client does); ``cancelled()`` true abandons a read."""
        ...

    def give_back(self, entry_id: int) -> None:
        """Unlock a message the application never saw, without reconnecting for it."""
        ...

    def pause(self, seconds: float) -> None:
        """Sleep *seconds*, or until :meth:`wake`."""
        ...

    def wake(self) -> None:
        """Wake a request or a pause waiting on the connection (signal-safe)."""
        ...


class AsyncSource(SourceBase, Protocol):
    """A structure as the async consumer sees it."""

    # `timeout` as in every request of the async SDK (a cancel scope inside; see the
    # ruff per-file ignores in pyproject.toml)
    async def request(self, call: Call, timeout: Timeout) -> Any:  # noqa: ASYNC109
        """Send *call* and return its reply's value, as every request of the client."""
        ...

    async def give_back(self, entry_id: int) -> None:
        """Unlock a message the application never saw, without reconnecting for it."""
        ...


class ClientFace(Protocol):
    """What either client shows in public that a consumer looks at."""

    @property
    def reconnect(self) -> object: ...

    @property
    def closed(self) -> bool: ...

    @property
    def last_resync(self) -> object: ...

    def holds(self, structure: str, entry_id: int) -> bool | None: ...


C = TypeVar("C", bound=ClientFace)


class HandleSource(Generic[C]):
    """The part of a source both clients make alike, from a structure handle and its
    client; each client's subclass adds the requests (``client.py``, ``aio.py``)."""

    def __init__(self, handle: object, name: str, client: C) -> None:
        self.handle = handle
        self.name = name
        self.client = client

    @property
    def reconnects(self) -> bool:
        return self.client.reconnect is not None

    @property
    def closed(self) -> bool:
        return self.client.closed

    @property
    def last_resync(self) -> object:
        return self.client.last_resync

    def holds(self, structure: str, entry_id: int) -> bool | None:
        return self.client.holds(structure, entry_id)
