"""cqsd configuration: one TOML file, checked whole before the daemon touches anything.

Design note
-----------
The keys are a contract (docs/operations.md).  Reading a config is a pure function from
TOML text to frozen dataclasses; the only I/O is reading the file itself and
checking that named TLS files exist, so the daemon can validate before it
creates or opens any data.

Every problem is collected, not only the first, and reported together in one
`ConfigError`, one line each, ``<file>: <key path>: <what is wrong>``, so an
operator fixes a config in one pass.  Unknown keys and tables are errors (with
a difflib suggestion): a misspelt limit silently left at its default is worse
than a refusal to start.

Each key is declared once, in a table (`_DAEMON`, `_STRUCTURE`, `_CLIENT`),
with its default and a checker.  Checks between keys (initsize <= size,
overflow references, unique names) run after every key has been read and only
on keys that were themselves valid, so one mistake gives one message.

A config file replaces the embedded default; it is not merged with it.
Missing ``[daemon]`` keys take their defaults, but the structures are only
those the file defines.

Relative paths (data_dir, socket, tls_cert, tls_key) are kept exactly as
written: they are relative to the daemon's working directory, not to the
config file, like paths given on a command line.  ``~`` is not expanded.
"""

from __future__ import annotations

import dataclasses
import difflib
import grp
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from cqsproto import CLIENT_NAME, CLIENT_NAME_RULE, sizes
from cqsproto.sizes import GiB, KiB, MiB, format_size

from .engine.qtypes import STAGING_TYPES, QueueType
from .errors import DaemonError

__all__ = [
    "DEFAULT_TOML",
    "ClientConfig",
    "Config",
    "GroupConfig",
    "ConfigError",
    "DaemonConfig",
    "StructureConfig",
    "format_size",
    "load",
    "loads",
    "parse_size",
]

DATA_ELEMENT = 512  # bytes per data element, the unit of structure capacity (docs/protocol.md)
MAX_CLIENTS_LIMIT = 1024  # the IMS limit is 32 per structure; 1024 is generous headroom
MAX_MESSAGE_LIMIT = GiB  # a message is held whole in memory by the reader; MQ's MAXMSGL is 100 MiB
MAX_STRUCTURE_SIZE = 1024 * GiB  # a CF structure's SIZE tops out at 1 TiB
MIN_SEND_QUEUE = 16  # enough for a pipelined burst plus a few notifications
MIN_SEND_QUEUE_BYTES = MiB  # a quarter of it (where reading pauses) still batches many replies
# Linux sun_path is 108 bytes including the terminating NUL; bind() fails beyond it.
SOCKET_PATH_MAX = 107

LOG_LEVELS = ("debug", "info", "warning", "error")

_STRUCTURE_NAME_RE = re.compile(r"[A-Z0-9@#$_]{1,16}")  # an MVS CF structure name
_SHA256_RE = re.compile(r"[0-9a-fA-F]{64}")


class ConfigError(DaemonError):
    """A config that cannot be used; `problems` lists everything wrong with it.

    Each problem reads ``<key path>: <what is wrong>``; `str()` gives one line
    per problem, prefixed with `source` (the file name) when there is one.
    """

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        prefix = f"{self.source}: " if self.source else ""
        return "\n".join(prefix + problem for problem in self.problems)

    exit_code = 2
    logged = False  # logging is configured from the config

    def headline(self) -> str:
        return f"configuration refused:\n{self}"


@dataclasses.dataclass(frozen=True)
class DaemonConfig:
    """The ``[daemon]`` table; times in seconds, sizes in bytes."""

    data_dir: str
    socket: str
    tcp: str  # "" = off, else "host:port"
    tls_cert: str  # "" = no TLS
    tls_key: str
    max_clients: int
    max_connections: int
    resync_grace: float
    max_deliveries: int
    max_message: int
    handshake_timeout: float
    send_queue: int  # frames queued for one connection before it is cut off
    send_queue_bytes: int  # bytes queued for one connection before it is cut off
    send_timeout: float  # seconds a connection's socket may take none of its queued replies
    frame_timeout: float  # seconds a request frame may take to arrive once begun
    tcp_keepalive: float  # seconds of silence before a TCP peer is probed; 0 = off
    max_wait: float
    log_level: str
    log_file: str  # "" = standard error; a file is reopened on SIGHUP
    log_segment: int  # bytes per logstream segment file before it rotates
    checkpoint_interval: float  # seconds between automatic structure checkpoints; 0 = off
    # log bytes since a structure's last checkpoint that start one; 0 = off
    checkpoint_log_volume: int
    log_retention: float  # seconds a segment no checkpoint needs is kept before it is trimmed
    dedup_window: float  # seconds a put's idempotency key is remembered (alone; [group]'s in one)
    spark_master: str  # master URL the SRDS jobs run on
    spark_recovery_records: int  # crash-restart log tails longer than this use the Spark job
    job_timeout: float  # seconds an SRDS job may run before it is killed
    socket_mode: int  # permission bits of the Unix socket
    socket_group: str  # group of the Unix socket ("" = the daemon's own)
    metrics_listen: str  # "host:port" of the Prometheus /metrics and /healthz listener; "" = off
    tls_client_ca: str  # PEM CA certificates TLS clients must present a certificate of; "" = none
    # users (names or uids) admitted as operators over the Unix socket by their peer
    # credentials (SO_PEERCRED), with no secret, when [[client]]s are listed
    operator_users: tuple[str, ...]

    @property
    def tcp_address(self) -> tuple[str, int] | None:
        """``(host, port)`` of the TCP listener, or None when TCP is off."""
        if not self.tcp:
            return None
        host, _, port = self.tcp.rpartition(":")
        return host.removeprefix("[").removesuffix("]"), int(port)


@dataclasses.dataclass(frozen=True)
class StructureConfig:
    """One ``[[structure]]``: a list structure; sizes in bytes."""

    name: str
    size: int
    initsize: int
    entry_max: int
    overflow: str | None
    overflow_threshold: int  # percent of data elements in use; 100 = overflow off
    max_entries: int
    overflow_exit: str  # "module:function" asked to drop overflow candidates; "" = none
    queue_space_exit: str  # "module:function" asked before a put to an overflow name; "" = none
    overflow_share: int  # percent of data elements a selection's candidates cover (seed: 20)
    overflow_candidates: int  # queue names a selection takes at most (seed: 512)
    # SMDS (docs/smds.md): offload "smds" keeps large payloads in data sets, one per client
    offload: str  # "none" or "smds"
    dsblock: int  # bytes of a logical block and of a buffer: 8KiB..1MiB, a power of two
    dsbufs: int  # buffers of the structure's pool
    dssize: int  # bytes a new data set is formatted with
    dsexpand: bool  # grow a data set by 20% at 90% full
    dsmax: int  # bytes a data set may grow to
    offld1thr: int
    offld1sze: int
    offld2thr: int
    offld2sze: int
    offld3thr: int
    offld3sze: int
    # a group's preference list (docs/group.md): the nodes that may own the pair, first
    # live one first (CFRM's PREFLIST); None = any node of the group
    prefer: tuple[str, ...] | None = None

    @property
    def offload_rules(self) -> tuple[tuple[int, int], ...] | None:
        """The (offldNthr, offldNsze) rules, or None when nothing is offloaded."""
        if self.offload != "smds":
            return None
        return ((self.offld1thr, self.offld1sze), (self.offld2thr, self.offld2sze),
                (self.offld3thr, self.offld3sze))


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """One ``[[client]]``: a client allowed to register, and its secret's digest."""

    name: str
    secret_sha256: str  # lowercase hex
    # Authorization (server/access.py); None = unrestricted.
    structures: tuple[str, ...] | None = None  # primaries it may use
    put_queues: tuple[str, ...] | None = None  # queue-name patterns it may put to
    read_queues: tuple[str, ...] | None = None  # queue-name patterns it may read from
    operator: bool = False  # may it run operator requests and open operator sessions
    tls_cn: str = ""  # the certificate common name that maps to it ("" = its name)


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    """The ``[group]`` table (docs/group.md): this daemon is one node of a group."""

    name: str  # etcd prefix /cqsd/<name>/
    node: str  # unique in the group; also this node's log writer id
    etcd: tuple[str, ...]  # etcd v3 endpoints, http://host:port
    advertise: str  # where clients reach this node (tcp://host:port or unix://path)
    lease: int  # seconds an owner keeps its structures without renewing
    standby: str  # "warm" or "cold"
    dedup_window: float  # seconds a put's idempotency key is remembered


@dataclasses.dataclass(frozen=True)
class Config:
    """A whole, validated configuration."""

    daemon: DaemonConfig
    structures: tuple[StructureConfig, ...]
    clients: tuple[ClientConfig, ...]
    group: GroupConfig | None = None  # None: a daemon on its own

    def structure(self, name: str) -> StructureConfig:
        """The structure called *name*; raises KeyError if there is none."""
        for structure in self.structures:
            if structure.name == name:
                return structure
        raise KeyError(name)

    def client(self, name: str) -> ClientConfig:
        """The client called *name*; raises KeyError if there is none."""
        for client in self.clients:
            if client.name == name:
                return client
        raise KeyError(name)


# ---------------------------------------------------------------------------
# Sizes


def parse_size(value: object, key: str) -> int:
    """Bytes in *value*: an integer, or a string like ``"64MiB"``, ``"32kib"``, ``"512"``.

    Units are B, KB/MB/GB (powers of 1000) and KiB/MiB/GiB (powers of 1024),
    case-insensitive; fractions are not accepted.  Raises ConfigError naming
    *key* when *value* is not a size.
    """
    try:
        return _size(value)
    except _Bad as bad:
        raise ConfigError([f"{key}: {bad}"]) from None


def _size(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise _Bad(f"must not be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise _Bad(f"{sizes.EXPECTED}, got {_show(value)}")
    try:
        return sizes.parse_size(value)
    except ValueError as error:
        raise _Bad(str(error)) from None


# ---------------------------------------------------------------------------
# Checkers: each takes the TOML value and returns the parsed one or raises _Bad.


class _Bad(Exception):
    """One key's value is wrong; the message says how."""


def _show(value: object) -> str:
    """*value* as the operator wrote it in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return str(value)


def _integer(lo: int, hi: int | None = None) -> Callable[[object], int]:
    def check(value: object) -> int:
        # bool is an int subclass, and TOML's `true` must not pass as 1.
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Bad(f"expected an integer, got {_show(value)}")
        if value < lo or (hi is not None and value > hi):
            raise _Bad(_out_of_range(value, lo, hi, str))
        return value
    return check


def _seconds(lo: float, *, inclusive: bool) -> Callable[[object], float]:
    def check(value: object) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _Bad(f"expected a number of seconds, got {_show(value)}")
        if not math.isfinite(value):
            raise _Bad(f"must be a finite number of seconds, got {_show(value)}")
        if value < lo or (value == lo and not inclusive):
            relation = "at least" if inclusive else "greater than"
            raise _Bad(f"must be {relation} {lo:g}, got {value}")
        return float(value)
    return check


def _size_between(lo: int, hi: int) -> Callable[[object], int]:
    def check(value: object) -> int:
        n = _size(value)
        if not lo <= n <= hi:
            raise _Bad(_out_of_range(n, lo, hi, format_size))
        return n
    return check


def _out_of_range(value: int, lo: int, hi: int | None, show: Callable[[int], str]) -> str:
    if hi is None:
        return f"must be at least {show(lo)}, got {show(value)}"
    return f"must be between {show(lo)} and {show(hi)}, got {show(value)}"


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise _Bad(f"expected a string, got {_show(value)}")
    if "\0" in value:
        raise _Bad("must not contain a NUL character")
    return value


def _path(value: object) -> str:
    text = _string(value)
    if not text:
        raise _Bad("must not be empty")
    return text


def _tcp(value: object) -> str:
    """"" (off) or "host:port"; an IPv6 host goes in brackets, "[::1]:7410"."""
    text = _string(value)
    if not text:
        return text
    host, colon, port = text.rpartition(":")
    if not colon or not host.removeprefix("[").removesuffix("]"):
        raise _Bad(f'expected "host:port" (e.g. "127.0.0.1:7410") or "" for off, got {_show(text)}')
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise _Bad(f'an IPv6 host goes in brackets, e.g. "[::1]:7410", got {_show(text)}')
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise _Bad(f"port must be an integer between 1 and 65535, got {_show(port)}")
    return text


def _spark_master(value: object) -> str:
    text = _string(value)
    if not text.strip():
        raise _Bad('expected a Spark master URL such as "local[*]" or "spark://host:7077"')
    return text


_EXIT_RE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*:[A-Za-z_]\w*")


def _exit_ref(value: object) -> str:
    text = _string(value)
    if text and not _EXIT_RE.fullmatch(text):
        raise _Bad(f'expected "module:function" (e.g. "mysite.exits:overflow"), got {_show(text)}')
    return text


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"expected true or false, got {_show(value)}")
    return value


def _power_of_two(lo: int, hi: int) -> Callable[[object], int]:
    def check(value: object) -> int:
        n = _size_between(lo, hi)(value)
        if n & (n - 1):
            raise _Bad(f"must be a power of two ({format_size(lo)}, {format_size(2 * lo)}, "
                       f"... {format_size(hi)}), got {format_size(n)}")
        return n
    return check


def _choice(options: tuple[str, ...]) -> Callable[[object], str]:
    def check(value: object) -> str:
        text = _string(value)
        if text.lower() not in options:
            raise _Bad(f"expected one of {', '.join(options)}, got {_show(text)}"
                       + _did_you_mean(text.lower(), options))
        return text.lower()
    return check


def _name(pattern: re.Pattern[str], rule: str) -> Callable[[object], str]:
    def check(value: object) -> str:
        text = _string(value)
        if pattern.fullmatch(text):
            return text
        hint = f' (did you mean "{text.upper()}"?)' if pattern.fullmatch(text.upper()) else ""
        raise _Bad(f"{_show(text)} is not a valid name: {rule}{hint}")
    return check


_structure_name = _name(_STRUCTURE_NAME_RE, "1-16 characters of A-Z, 0-9, @, #, $ and _")
_client_name = _name(CLIENT_NAME, CLIENT_NAME_RULE)  # the name register accepts


def _sha256(value: object) -> str:
    text = _string(value)
    if not _SHA256_RE.fullmatch(text):
        raise _Bad("expected 64 hexadecimal digits, the SHA-256 of the secret "
                   "(e.g. from `printf %s SECRET | sha256sum`)")
    return text.lower()


def _socket_mode(value: object) -> int:
    """An integer (TOML's 0o660) or an octal string ("0660") of permission bits."""
    if isinstance(value, str) and re.fullmatch(r"0?[0-7]{3}", value):
        value = int(value, 8)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0o777:
        raise _Bad(f'expected permission bits such as 0o660 or "0660", got {_show(value)}')
    if not value & 0o600 == 0o600:
        raise _Bad(f"the daemon's own user needs read and write (0o600), got {value:#o}")
    return value


_NODE_RE = re.compile(r"[A-Z0-9]{1,8}")
_NODE_RULE = "1-8 characters of A-Z and 0-9"
_MIN_LEASE, _MAX_LEASE = 2, 3600  # seconds; etcd grants whole seconds, and renews at a third


def _etcd_endpoint(value: object) -> str:
    text = _string(value)
    m = re.fullmatch(r"http://([^/:\s]+|\[[0-9a-fA-F:]+\]):(\d{1,5})/?", text)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise _Bad(f"{_show(value)} is not an etcd endpoint like \"http://127.0.0.1:2379\"")
    return text.rstrip("/")


def _advertise(value: object) -> str:
    text = _string(value)
    if text.startswith("unix://") and len(text) > len("unix://"):
        return text
    if text.startswith("tcp://"):
        _tcp(text.removeprefix("tcp://"))
        return text
    raise _Bad(f"{_show(value)} is not an address like \"tcp://host:7410\" or \"unix:///path\"")


def _list(item: Callable[[object], str]) -> Callable[[object], tuple[str, ...]]:
    def check(value: object) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise _Bad(f"expected an array of strings, got {_show(value)}")
        return tuple(item(v) for v in value)
    return check


def _user(value: object) -> str:
    """A user name or a numeric uid (a name this host lacks admits nobody)."""
    text = _string(value)
    if not re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*\$?", text):
        raise _Bad(f"{_show(value)} is not a user name or uid")
    return text


# the queue types a client names, for TYPE:NAMEPATTERN (not the engine's staging types)
_QTYPE_NAMES = tuple(t.name for t in QueueType if t not in STAGING_TYPES)
_QUEUE_PATTERN_RE = re.compile(r"[\x21-\x29\x2b-\x7e]{1,15}\*?|\*")


def _queue_pattern(value: object) -> str:
    """A queue name, or a prefix of one ending in ``*`` ("TRAN*"; "*" is every queue),
    matching queues of any type; or either after a queue type and a colon, matching
    that type's queues alone ("LTERM:REPLY*", "LTERM:*")."""
    text = _string(value)
    qtype, colon, rest = text.partition(":")
    if colon and qtype in _QTYPE_NAMES:
        name = rest
    elif colon and re.fullmatch(r"[A-Z][A-Z0-9_]+", qtype) and _did_you_mean(qtype,
                                                                           _QTYPE_NAMES):
        raise _Bad(f"{_show(text)}: unknown queue type {qtype!r}"
                   f"{_did_you_mean(qtype, _QTYPE_NAMES)}")
    else:
        name = text  # a colon is a character of the name, as in any queue name
    if not _QUEUE_PATTERN_RE.fullmatch(name):
        raise _Bad(f"{_show(text)} is not a queue pattern: a queue name (1 to 15 printable "
                   "ASCII characters, no space) optionally ending in *, or * alone")
    return text


def _did_you_mean(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ---------------------------------------------------------------------------
# Key tables

_REQUIRED = object()  # default of a key that must be given
_INVALID = object()  # value of a key whose problem has been reported


class _Key(NamedTuple):
    check: Callable[[object], Any]
    default: object  # a TOML value run through check; None = derived from other keys


_DAEMON: dict[str, _Key] = {
    "data_dir": _Key(_path, "./cqsd-data"),
    "socket": _Key(_path, None),  # <data_dir>/cqsd.sock
    "tcp": _Key(_tcp, ""),
    "tls_cert": _Key(_string, ""),
    "tls_key": _Key(_string, ""),
    "max_clients": _Key(_integer(1, MAX_CLIENTS_LIMIT), 32),
    "max_connections": _Key(_integer(1), 256),
    "resync_grace": _Key(_seconds(0, inclusive=True), 0),
    "max_deliveries": _Key(_integer(1), 5),
    # 100 MiB, MQ's MAXMSGL with SMDS (seed 001): a recoverable message kept in a
    # structure is logged in one record of at most 16 MiB (docs/robustness.md); an
    # offloaded one in as many records as its blocks need (docs/smds.md).
    "max_message": _Key(_size_between(1, MAX_MESSAGE_LIMIT), "100MiB"),
    "handshake_timeout": _Key(_seconds(0, inclusive=False), 10),
    "send_queue": _Key(_integer(MIN_SEND_QUEUE), 4096),
    "send_queue_bytes": _Key(_size_between(MIN_SEND_QUEUE_BYTES, 64 * GiB), "64MiB"),
    "send_timeout": _Key(_seconds(0, inclusive=False), 60),
    "frame_timeout": _Key(_seconds(0, inclusive=False), 60),
    "tcp_keepalive": _Key(_seconds(0, inclusive=True), 60),
    "max_wait": _Key(_seconds(0, inclusive=False), 3600),
    "log_level": _Key(_choice(LOG_LEVELS), "info"),
    "log_file": _Key(_string, ""),
    "log_segment": _Key(_size_between(64 * KiB, 4 * GiB), "64MiB"),
    "checkpoint_interval": _Key(_seconds(0, inclusive=True), 3600),
    "checkpoint_log_volume": _Key(_size_between(0, 1024 * GiB), "256MiB"),
    "log_retention": _Key(_seconds(0, inclusive=True), 0),
    "dedup_window": _Key(_seconds(0, inclusive=True), 120),
    "spark_master": _Key(_spark_master, "local[*]"),
    "spark_recovery_records": _Key(_integer(0), 5_000_000),
    "job_timeout": _Key(_seconds(0, inclusive=False), 3600),
    "socket_mode": _Key(_socket_mode, 0o600),
    "socket_group": _Key(_string, ""),
    "metrics_listen": _Key(_tcp, ""),
    "tls_client_ca": _Key(_string, ""),
    "operator_users": _Key(_list(_user), ["root", "cqsd"]),
}

_structure_size = _size_between(DATA_ELEMENT, MAX_STRUCTURE_SIZE)
_STRUCTURE: dict[str, _Key] = {
    "name": _Key(_structure_name, _REQUIRED),
    "size": _Key(_structure_size, _REQUIRED),
    "initsize": _Key(_structure_size, None),  # = size
    "entry_max": _Key(_structure_size, "32KiB"),
    "overflow": _Key(_structure_name, None),
    "overflow_threshold": _Key(_integer(1, 100), 70),
    "max_entries": _Key(_integer(1), None),  # = data elements in size
    "overflow_exit": _Key(_exit_ref, ""),
    "queue_space_exit": _Key(_exit_ref, ""),
    "overflow_share": _Key(_integer(1, 100), 20),
    "overflow_candidates": _Key(_integer(1), 512),
    "offload": _Key(_choice(("none", "smds")), "none"),
    "dsblock": _Key(_power_of_two(8 * KiB, 1024 * KiB), "256KiB"),
    "dsbufs": _Key(_integer(1, 9999), 100),
    "dssize": _Key(_size_between(16 * KiB, 16 * 1024 * GiB), "64MiB"),
    "dsexpand": _Key(_boolean, True),
    "dsmax": _Key(_size_between(16 * KiB, 16 * 1024 * GiB), "16GiB"),
    "offld1thr": _Key(_integer(0, 100), 70),
    "offld1sze": _Key(_size_between(0, 2 * GiB), "32KiB"),
    "offld2thr": _Key(_integer(0, 100), 80),
    "offld2sze": _Key(_size_between(0, 2 * GiB), "4KiB"),
    "offld3thr": _Key(_integer(0, 100), 90),
    "offld3sze": _Key(_size_between(0, 2 * GiB), 0),
    "prefer": _Key(_list(_name(_NODE_RE, _NODE_RULE)), None),
}

_CLIENT: dict[str, _Key] = {
    "name": _Key(_client_name, _REQUIRED),
    "secret_sha256": _Key(_sha256, _REQUIRED),
    "structures": _Key(_list(_structure_name), None),
    "queues": _Key(_list(_queue_pattern), None),  # both put_queues and read_queues
    "put_queues": _Key(_list(_queue_pattern), None),
    "read_queues": _Key(_list(_queue_pattern), None),
    "operator": _Key(_boolean, False),
    "tls_cn": _Key(_string, ""),
}

_GROUP: dict[str, _Key] = {
    "name": _Key(_name(_NODE_RE, _NODE_RULE), _REQUIRED),
    "node": _Key(_name(_NODE_RE, _NODE_RULE), _REQUIRED),
    "etcd": _Key(_list(_etcd_endpoint), _REQUIRED),
    "advertise": _Key(_advertise, None),  # tcp://<daemon.tcp>, else unix://<daemon.socket>
    "lease": _Key(_integer(_MIN_LEASE, _MAX_LEASE), 5),
    "standby": _Key(_choice(("warm", "cold")), "warm"),
    "dedup_window": _Key(_seconds(0, inclusive=True), 120),
}

_TABLES = {"daemon": _DAEMON, "structure": _STRUCTURE, "client": _CLIENT, "group": _GROUP}


# ---------------------------------------------------------------------------
# Reading


class _Reader:
    """Collects problems while the document is read."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def keys(self, path: str, table: Mapping[str, object], spec: Mapping[str, _Key]
             ) -> tuple[dict[str, Any], set[str]]:
        """Every key of *spec* checked (or defaulted), and the set of keys given."""
        for key in table:
            if key not in spec:
                self.add(_join(path, key), "unknown key" + _did_you_mean(key, spec))
        values: dict[str, Any] = {}
        for key, (check, default) in spec.items():
            value = table.get(key, default)
            if value is _REQUIRED:
                self.add(_join(path, key), "required key is missing")
                values[key] = _INVALID
            elif value is None:
                values[key] = None
            else:
                try:
                    values[key] = check(value)
                except _Bad as bad:
                    self.add(_join(path, key), str(bad))
                    values[key] = _INVALID
        return values, {key for key in table if key in spec}

    def array(self, name: str, value: object) -> list[tuple[str, Mapping[str, object]]]:
        """The tables of an array of tables such as ``[[structure]]``, with their paths."""
        if not isinstance(value, list):
            self.add(name, f"expected an array of tables ([[{name}]]), got {_show(value)}")
            return []
        tables: list[tuple[str, Mapping[str, object]]] = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                tables.append((f"{name}[{i}]", item))
            else:
                self.add(f"{name}[{i}]", f"expected a table, got {_show(item)}")
        return tables


def _join(path: str, key: str) -> str:
    bare = re.fullmatch(r"[A-Za-z0-9_-]+", key) is not None
    return f"{path}.{key if bare else json.dumps(key)}"


def _valid(*values: object) -> bool:
    return all(value is not _INVALID for value in values)


def _read_document(r: _Reader, doc: Mapping[str, object]) -> Config | None:
    for key in doc:
        if key in _TABLES:
            continue
        if key in _DAEMON:
            r.add(key, "unknown top-level key (did you mean to put it under [daemon]?)")
        elif isinstance(doc[key], (dict, list)):
            r.add(key, "unknown table" + _did_you_mean(key, _TABLES))
        else:
            r.add(key, "unknown top-level key" + _did_you_mean(key, _TABLES))

    daemon_table = doc.get("daemon", {})
    if not isinstance(daemon_table, dict):
        r.add("daemon", f"expected a table ([daemon]), got {_show(daemon_table)}")
        daemon_table = {}
    daemon = _read_daemon(r, daemon_table)
    structures = _read_structures(r, doc.get("structure", []))
    clients = _read_clients(r, doc.get("client", []), structures)
    if isinstance(daemon["tcp"], str) and daemon["tcp"] and not clients:
        r.add("daemon.tcp", "registering over TCP needs a secret, "
              "but no [[client]] with a secret_sha256 is defined")
    group = _read_group(r, doc.get("group"), daemon, structures)
    if r.problems:
        return None
    return Config(DaemonConfig(**daemon),
                  tuple(StructureConfig(**s) for s in structures),
                  tuple(ClientConfig(**c) for c in clients),
                  GroupConfig(**group) if group is not None else None)


def _read_group(r: _Reader, table: object, daemon: dict[str, Any],
                structures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``[group]`` table, and the ``prefer`` lists that only mean something in one."""
    overflows = {s["overflow"]: s["name"] for s in structures if _valid(s["overflow"])}
    for i, s in enumerate(structures):
        if s["prefer"] is None or not _valid(s["prefer"]):
            continue
        where = f"structure[{i}].prefer"
        if table is None:
            r.add(where, "means nothing without a [group] (a daemon on its own owns every "
                  "structure): add [group], or remove it")
        elif s["name"] in overflows:
            r.add(where, f"means nothing on {s['name']}, the overflow structure of "
                  f"{overflows[s['name']]} (a pair moves as one): set it on "
                  f"{overflows[s['name']]}")
        elif not s["prefer"]:
            r.add(where, "is empty: no node could own the structure (remove it for any node)")
        elif len(set(s["prefer"])) < len(s["prefer"]):
            r.add(where, "names a node twice")
    if table is None:
        return None
    if not isinstance(table, dict):
        r.add("group", f"expected a table ([group]), got {_show(table)}")
        return None
    g, _ = r.keys("group", table, _GROUP)
    if _valid(g["etcd"]) and g["etcd"] == ():
        r.add("group.etcd", "needs at least one endpoint")
    if g["advertise"] is None and _valid(daemon["tcp"], daemon["socket"]):
        g["advertise"] = (f"tcp://{daemon['tcp']}" if daemon["tcp"]
                          else f"unix://{os.path.abspath(daemon['socket'])}")
    return g


def _read_daemon(r: _Reader, table: Mapping[str, object]) -> dict[str, Any]:
    d, given = r.keys("daemon", table, _DAEMON)
    if d["socket"] is None and _valid(d["data_dir"]):
        d["socket"] = os.path.join(d["data_dir"], "cqsd.sock")
    if isinstance(d["socket"], str) and len(os.fsencode(d["socket"])) > SOCKET_PATH_MAX:
        derived = "" if "socket" in given else " (derived from data_dir)"
        r.add("daemon.socket", f"{_show(d['socket'])}{derived} is "
              f"{len(os.fsencode(d['socket']))} bytes; a Unix socket path is limited to "
              f"{SOCKET_PATH_MAX} bytes (use a shorter path)")
    if _valid(d["max_clients"], d["max_connections"]) and d["max_connections"] < d["max_clients"]:
        default = "" if "max_connections" in given else " (the default)"
        r.add("daemon.max_connections", f"{d['max_connections']}{default} is less than "
              f"max_clients {d['max_clients']}")
    _check_tls(r, d)
    return d


def _check_tls(r: _Reader, d: dict[str, Any]) -> None:
    cert, key = d["tls_cert"], d["tls_key"]
    ca = d["tls_client_ca"]
    if _valid(ca, cert) and ca and not cert:
        r.add("daemon.tls_client_ca", "client certificates need TLS: set tls_cert and tls_key")
    elif _valid(ca) and ca:
        _check_file(r, "tls_client_ca", ca)
    if not _valid(cert, key) or not (cert or key):
        return
    if not (cert and key):
        missing = "tls_key" if cert else "tls_cert"
        r.add(f"daemon.{missing}", "tls_cert and tls_key must be given together")
    if d["tcp"] == "":
        r.add("daemon.tls_cert" if cert else "daemon.tls_key",
              "TLS applies to the TCP listener only, but daemon.tcp is off")
    for name, path in (("tls_cert", cert), ("tls_key", key)):
        if path:
            _check_file(r, name, path)


def _check_file(r: _Reader, name: str, path: str) -> None:
    if not os.path.isfile(path):
        r.add(f"daemon.{name}", f"no such file: {path}")
    elif not os.access(path, os.R_OK):
        r.add(f"daemon.{name}", f"cannot read file: {path}")


def _read_structures(r: _Reader, value: object) -> list[dict[str, Any]]:
    rows, given_keys = [], []
    for path, table in r.array("structure", value):
        s, given = r.keys(path, table, _STRUCTURE)
        _check_capacity(r, path, s, given)
        rows.append((path, s))
        given_keys.append(given)
    if isinstance(value, list) and not value:
        r.add("structure", "at least one [[structure]] must be defined")
    _check_unique(r, rows)
    _check_overflow(r, rows)
    _check_overflow_keys(r, rows, given_keys)
    return [s for _, s in rows]


# Keys of overflow processing, which a primary runs: on its overflow structure they
# would be read and never used.
_PRIMARY_ONLY = ("overflow_threshold", "overflow_exit", "queue_space_exit", "overflow_share",
                 "overflow_candidates")


def _check_overflow_keys(r: _Reader, rows: list[tuple[str, dict[str, Any]]],
                         given_keys: list[set[str]]) -> None:
    """Keys that mean nothing where they are written are refused, not ignored."""
    primary_of = {s["overflow"]: s["name"] for _, s in rows
                  if s["overflow"] is not None and _valid(s["overflow"], s["name"])}
    for (path, s), given in zip(rows, given_keys, strict=True):
        primary = primary_of.get(s["name"])
        if primary is not None:
            for key in _PRIMARY_ONLY:
                if key in given:
                    r.add(f"{path}.{key}", f"means nothing on {s['name']}, the overflow "
                          f"structure of {primary} (overflow processing is the primary's): "
                          f"set it on {primary}")
        elif "queue_space_exit" in given and s["overflow"] is None:
            r.add(f"{path}.queue_space_exit", "means nothing without an overflow structure "
                  "(puts to queues in overflow status are refused); set overflow, or remove it")


def _check_capacity(r: _Reader, path: str, s: dict[str, Any], given: set[str]) -> None:
    size = s["size"]
    if not _valid(size):
        s["initsize"] = s["max_entries"] = _INVALID
        return
    if s["initsize"] is None:
        s["initsize"] = size
    if s["max_entries"] is None:
        s["max_entries"] = size // DATA_ELEMENT
    for key in ("initsize", "entry_max"):
        if _valid(s[key]) and s[key] > size:
            default = "" if key in given else " (the default)"
            r.add(f"{path}.{key}",
                  f"{format_size(s[key])}{default} is larger than size {format_size(size)}")
    if _valid(s["dssize"], s["dsmax"], s["dsblock"]):
        if s["dssize"] > s["dsmax"]:
            r.add(f"{path}.dssize", f"{format_size(s['dssize'])} is larger than dsmax "
                                    f"{format_size(s['dsmax'])}")
        if s["dsmax"] < 2 * s["dsblock"]:
            r.add(f"{path}.dsmax", f"{format_size(s['dsmax'])} holds less than two dsblocks "
                                   f"(a header block and a data block)")


def _check_unique(r: _Reader, rows: list[tuple[str, dict[str, Any]]]) -> None:
    first: dict[str, str] = {}
    for path, row in rows:
        name = row["name"]
        if not _valid(name):
            continue
        if name in first:
            r.add(f"{path}.name", f"{_show(name)} is already defined by {first[name]}")
        else:
            first[name] = path


def _check_overflow(r: _Reader, rows: list[tuple[str, dict[str, Any]]]) -> None:
    """An overflow is another structure, with no overflow of its own, serving one primary."""
    defined = {s["name"]: (path, s) for path, s in reversed(rows) if _valid(s["name"])}
    owner: dict[str, str] = {}
    for path, s in rows:
        overflow, where = s["overflow"], f"{path}.overflow"
        if overflow is None or not _valid(overflow, s["name"]):
            continue
        if overflow == s["name"]:
            r.add(where, "a structure cannot be its own overflow structure")
            continue
        if overflow not in defined:
            r.add(where, f"no structure named {overflow} is defined"
                  + _did_you_mean(overflow, defined))
            continue
        target_path, target = defined[overflow]
        if target["overflow"] is not None and _valid(target["overflow"]):
            r.add(where, f"{overflow} ({target_path}) has an overflow structure of its own "
                  f"({target['overflow']}); overflow structures cannot be chained")
        if overflow in owner:
            r.add(where, f"{overflow} is already the overflow structure of {owner[overflow]}")
        else:
            owner[overflow] = f"{s['name']} ({path})"


def _read_clients(r: _Reader, value: object, structures: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    rows = [(path, r.keys(path, table, _CLIENT)[0]) for path, table in r.array("client", value)]
    _check_unique(r, rows)
    overflows = {s["overflow"]: s["name"] for s in structures if _valid(s["overflow"])}
    primaries = [s["name"] for s in structures if s["name"] not in overflows]
    for path, c in rows:
        for name in c["structures"] if _valid(c["structures"]) and c["structures"] else ():
            if name in overflows:
                r.add(f"{path}.structures", f"{name} is the overflow structure of "
                      f"{overflows[name]}: name {overflows[name]}, which covers both")
            elif name not in primaries and primaries:
                r.add(f"{path}.structures", f"no structure named {name} is defined"
                      + _did_you_mean(name, primaries))
        queues = c.pop("queues")
        for key in ("put_queues", "read_queues"):
            if c[key] is None:
                c[key] = queues
    return [c for _, c in rows]


# ---------------------------------------------------------------------------
# Entry points


def loads(text: str, source: str = "<string>") -> Config:
    """The Config in TOML *text*; *source* names it in error messages.

    Raises ConfigError listing every problem found.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"not valid TOML: {exc}"], source) from None
    r = _Reader()
    config = _read_document(r, doc)
    if config is None:
        raise ConfigError(r.problems, source)
    return config


def check_host(config: Config, source: str | None = None) -> None:
    """Whether ``config`` fits this host: what ``load`` cannot know about the machine the
    daemon will run on, checked by ``cqsd run`` before it touches any data, so that a
    misspelled ``socket_group`` is a refused config (exit 2) and not a failure after
    recovery that leaves a socket behind. Raises ConfigError."""
    group = config.daemon.socket_group
    if group and not group.isdigit():
        try:
            grp.getgrnam(group)
        except KeyError:
            names = (g.gr_name for g in grp.getgrall())
            raise ConfigError([f"daemon.socket_group: no group named {group!r} on this "
                               f"host{_did_you_mean(group, names)}"], source) from None


def load(path: str | os.PathLike[str] | None) -> Config:
    """The Config in the file at *path*, or the embedded default when *path* is None.

    Raises ConfigError, naming the file, when it cannot be read or is not a
    valid config.
    """
    if path is None:
        return loads(DEFAULT_TOML, "<default config>")
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError([f"cannot read config file: {exc.strerror or exc}"], source) from None
    try:
        text = data.decode("utf-8-sig")  # tolerate the BOM some editors write
    except UnicodeDecodeError as exc:
        raise ConfigError([f"not valid UTF-8 (at byte {exc.start})"], source) from None
    return loads(text, source)


# The embedded default (docs/operations.md): what `cqsd run` uses without --config.
# config/cqsd.toml is the same configuration with every key explained; a test
# keeps the two equal.
DEFAULT_TOML = """\
[daemon]
data_dir = "./cqsd-data"
socket = "./cqsd-data/cqsd.sock"
tcp = ""
tls_cert = ""
tls_key = ""
max_clients = 32
max_connections = 256
resync_grace = 0
max_deliveries = 5
max_message = "100MiB"
handshake_timeout = 10
send_queue = 4096
send_queue_bytes = "64MiB"
send_timeout = 60
frame_timeout = 60
tcp_keepalive = 60
max_wait = 3600
log_level = "info"
log_file = ""
log_segment = "64MiB"
checkpoint_interval = 3600
checkpoint_log_volume = "256MiB"
log_retention = 0
dedup_window = 120
spark_master = "local[*]"
spark_recovery_records = 5000000
job_timeout = 3600
socket_mode = 0o600
socket_group = ""
metrics_listen = ""
tls_client_ca = ""
operator_users = ["root", "cqsd"]

[[structure]]
name = "MSGQ01"
size = "64MiB"
initsize = "32MiB"
entry_max = "32KiB"
overflow = "MSGQ01OV"
overflow_threshold = 70
overflow_share = 20
overflow_candidates = 512
offload = "smds"

[[structure]]
name = "MSGQ01OV"
size = "16MiB"

[[structure]]
name = "EMHQ01"
size = "32MiB"
"""
