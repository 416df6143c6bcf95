"""Queue types, queue names and the list-header layout (docs/architecture.md).

IMS gives each queue type 11 list headers "to reduce contention for access to
the queue"; a stable hash of the queue name picks one (seed 004, "IMS Client
Queue Types"). LH 0-70 are CQS's private queues.
"""

from collections.abc import Iterable
from enum import IntEnum
from zlib import crc32

from .errors import CQSError, Reason

LIST_HEADERS = 192
CONTROL_LH, COLD_LH, LOCK_LH, MOVE_LH, DELETE_LH, REBUILD_LH = 0, 1, 2, 3, 4, 5
DELAYED_LH = 6  # delayed puts until their time (no CQS counterpart: LH 6-70 are reserved)
FIRST_CLIENT_LH = 71
HEADERS_PER_TYPE = 11
MAX_NAME = 15  # the 16-byte entry key less its queue-type byte
QueueKey = tuple[int, str]  # (queue type, queue name): one queue, the engine's key for it


class QueueType(IntEnum):
    TRAN = 1
    TRAN_STAGING = 2
    TRAN_SUSPEND = 3
    TRAN_SERIAL = 4
    LTERM = 5
    LTERM_STAGING = 6
    APPC = 7
    REMOTE = 8
    OTMA = 9
    USER1 = 10
    USER2 = 11


STAGING_TYPES = frozenset({QueueType.TRAN_STAGING, QueueType.LTERM_STAGING})

# Seed 004: the TRAN staging queue holds continuations of transaction messages;
# the LTERM staging queue holds those of every output type.
_STAGING_OF = {
    t: QueueType.TRAN_STAGING if t <= QueueType.TRAN_SERIAL else QueueType.LTERM_STAGING
    for t in QueueType
}


def staging_type(qtype: int) -> QueueType:
    """The staging queue type that holds the 2nd..nth segments of ``qtype``'s messages."""
    return _STAGING_OF[QueueType(qtype)]


# Every spelling a client may use for a usable type; a dict lookup is the fast path.
_USABLE = {
    spelling: t
    for t in QueueType
    if t not in STAGING_TYPES
    for spelling in (t, int(t), t.name)
}


def parse_qtype(value: object) -> QueueType:
    """A client-usable queue type from its number or contract name.

    Raises CQSError(INVALID_REQUEST) for unknown types and for the staging types,
    which belong to the engine.
    """
    if type(value) is not bool:  # True == 1, but it is not a queue type
        try:
            return _USABLE[value]  # type: ignore[index]  # anything else is a KeyError
        except (KeyError, TypeError):
            pass
    if type(value) is not bool and value in _STAGING_SPELLINGS:
        raise CQSError(Reason.INVALID_REQUEST, f"queue type {value} is internal to cqsd")
    raise CQSError(Reason.INVALID_REQUEST, f"unknown queue type {value!r}")


_STAGING_SPELLINGS = {s for t in STAGING_TYPES for s in (int(t), t.name)}


def check_name(name: object) -> str:
    """A queue name: 1 to 15 printable ASCII characters (collated as bytes)."""
    if (
        type(name) is not str
        or not 0 < len(name) <= MAX_NAME
        or not name.isascii()
        or not name.isprintable()
    ):
        raise CQSError(
            Reason.INVALID_REQUEST,
            f"queue name {name!r} must be 1 to {MAX_NAME} printable ASCII characters",
        )
    return name


def list_header(qtype: int, name: str) -> int:
    """The list header holding queue ``name`` of type ``qtype`` (stable across runs)."""
    return (FIRST_CLIENT_LH + HEADERS_PER_TYPE * (qtype - 1)
            + crc32(name.encode()) % HEADERS_PER_TYPE)


def headers_of(qtype: int) -> range:
    first = FIRST_CLIENT_LH + HEADERS_PER_TYPE * (qtype - 1)
    return range(first, first + HEADERS_PER_TYPE)


def show(key: QueueKey) -> str:
    """A queue as messages name it: ``TRAN:NAME``."""
    return f"{QueueType(key[0]).name}:{key[1]}"


def retarget(now: int, named: str, qtype: object, name: object) -> QueueKey | None:
    """Where a request sends a message now on queue ``now``:``named``: None to its
    own place (neither given), else ``qtype``/``name``, each defaulting to its own."""
    if qtype is None and name is None:
        return None
    return (parse_qtype(qtype if qtype is not None else now), check_name(name or named))


def in_header_order(keys: Iterable[QueueKey]) -> list[QueueKey]:
    """Queues in the order browse and reports show them: by list header, then name."""
    return sorted(keys, key=lambda k: (list_header(*k), k[1]))
