"""cqsclient: the client SDK of cqsd (docs/sdk.md).

::

    import cqsclient
    with cqsclient.connect("unix:///run/cqsd/cqsd.sock", client="IMS1") as c:
        s = c.structure("MSGQ01")
        eid = s.put("TRANX", b"...")
        m = s.read("TRANX", wait=5.0)   # Message | None, locked by this client
        s.delete(m.entry_id)

    # a worker: every message handled, deleted on success, failed on an exception
    with cqsclient.connect(client="WORKER1", reconnect=True) as c:
        for m in c.structure("MSGQ01").consume("TRANX"):
            with m:
                handle(m.data)

The blocking client here is thread-safe and pipelines the requests of many
threads on one connection. ``cqsclient.aio`` has the same names for AnyIO
(Trio or asyncio); it is imported on first use, so importing ``cqsclient``
pulls in neither trio nor anyio.
"""

from __future__ import annotations

import importlib
from typing import Any

from cqsproto import native

# The compiled build of its connection and replies or the source (cqsproto/native.py),
# before any module of the package loads.
native.choose(__name__, __path__)

from . import errors
from .address import DEFAULT_ADDRESS, default_address, parse_address
from .client import Client, StructureHandle, UnitOfWork, connect
from .consume import Consumer, Delivery
from .errors import ConnectionLost, CQSError, RequestTimeout
from .model import (
    BrowsePage,
    HeldLock,
    Location,
    Message,
    Notification,
    QType,
    QueueTypeName,
    SmdsAccess,
    SmdsExpand,
    SmdsStatus,
)
from .ops import CLIENT_TIMEOUT, Payload, Timeout
from .reconnect import Reconnect, Resync

__version__ = "0.1.0"

__all__ = [
    "CLIENT_TIMEOUT",
    "DEFAULT_ADDRESS",
    "BrowsePage",
    "CQSError",
    "Client",
    "ConnectionLost",
    "Consumer",
    "Delivery",
    "HeldLock",
    "Location",
    "Message",
    "Notification",
    "Payload",
    "QType",
    "QueueTypeName",
    "Reconnect",
    "RequestTimeout",
    "Resync",
    "SmdsAccess",
    "SmdsExpand",
    "SmdsStatus",
    "StructureHandle",
    "Timeout",
    "UnitOfWork",
    "__version__",
    "connect",
    "default_address",
    "errors",
    "parse_address",
]


def __getattr__(name: str) -> Any:
    # `cqsclient.aio` without importing it first, and without importing anyio
    # for users of the blocking client.
    if name == "aio":
        return importlib.import_module(".aio", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
