"""The cqsd wire protocol, sans I/O: shared by the daemon and the client SDKs.

It must never import trio, anyio, asyncio, socket or the engine; the blocking
client uses it on plain sockets (tests/protocol checks the import).
"""

from cqsd.protocol.codec import (
    CLOSED,
    DEFAULT_MAX_FRAME,
    HEADER_SIZE,
    INVALID_REQUEST,
    MAX_FRAME_LIMIT,
    MESSAGE_TOO_LARGE,
    NEED_DATA,
    PROTOCOL_VERSION,
    FrameDecoder,
    ProtocolError,
    encode_frame,
)

__all__ = [
    "CLOSED",
    "DEFAULT_MAX_FRAME",
    "HEADER_SIZE",
    "INVALID_REQUEST",
    "MAX_FRAME_LIMIT",
    "MESSAGE_TOO_LARGE",
    "NEED_DATA",
    "PROTOCOL_VERSION",
    "FrameDecoder",
    "ProtocolError",
    "encode_frame",
]
