"""The cqsd wire protocol, sans I/O: the leaf the daemon and the client SDK both import.

It holds what the two sides must agree on: the frame codec and protocol
version (``codec``), the request table (``requests``), the reason codes
(``reasons``), the client-name rule (``names``), the spelling of sizes
(``sizes``) and the values a lease or a delay may take (``timing``). It
imports nothing of cqsd's and never trio, anyio, asyncio or socket; the
blocking client uses it on plain sockets (tests/protocol and
tests/test_imports.py check).
"""

from . import native

native.choose(__name__, __path__)  # compiled or source, before any module loads

from .codec import (  # noqa: E402
    CLOSED,
    DEFAULT_MAX_FRAME,
    FRAME_HEADROOM,
    HEADER_SIZE,
    INVALID_REQUEST,
    LARGE,
    MAX_FRAME_LIMIT,
    MESSAGE_TOO_LARGE,
    NEED_DATA,
    PROTOCOL_VERSION,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    encode_frame_parts,
    encode_reply,
    max_frame_for,
)
from .names import CLIENT_NAME, CLIENT_NAME_RULE  # noqa: E402
from .reasons import Reason  # noqa: E402

__all__ = [
    "CLIENT_NAME",
    "CLIENT_NAME_RULE",
    "CLOSED",
    "DEFAULT_MAX_FRAME",
    "FRAME_HEADROOM",
    "HEADER_SIZE",
    "INVALID_REQUEST",
    "LARGE",
    "MAX_FRAME_LIMIT",
    "MESSAGE_TOO_LARGE",
    "NEED_DATA",
    "PROTOCOL_VERSION",
    "FrameDecoder",
    "ProtocolError",
    "Reason",
    "encode_frame",
    "encode_frame_parts",
    "encode_reply",
    "max_frame_for",
]
