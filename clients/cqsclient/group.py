"""Where a client may find a group's nodes, and how it follows the owner.

Design note
-----------
In a group (docs/group.md) several daemons serve one data directory, and each
structure pair has one owner at a time. A client is given the group as a list
of addresses (``tcp://a:7410,tcp://b:7410``, also in ``$CQSD_ADDRESS``) or as
the group's etcd (``etcd://HOST:PORT/GROUP``), where every live node keeps its
``advertise`` address under ``/cqsd/GROUP/nodes/``. :class:`Targets` turns
either into the addresses to try, in order; a connect or reconnect registers
with the first that answers. The etcd key range is read over etcd's JSON
gateway with the standard library (one short HTTP request per dial), so the
SDK needs no etcd client.

A node that does not own a structure answers its requests ``NOT_OWNER``
naming the owner's address (Redis Cluster's MOVED); nothing was applied, so
the client moves its connection there and sends the request again. While a
structure has no owner (a takeover under way) the node answers
``STRUCTURE_FAILED`` "structure X has no owner: ..."; a client with
``reconnect`` waits with its back-off policy and asks again (:class:`Patience`),
so a takeover looks like a daemon restart. This module does no socket I/O of
its own but the etcd read: the clients do.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, TypeVar

from .address import Address, default_address, parse_address
from .errors import CannotConnect, CQSError, NotOwner, StructureFailed
from .reconnect import Reconnect

__all__ = ["EtcdGroup", "Misdirected", "Patience", "Targets", "misdirection", "no_owner",
           "parse_targets", "redirect"]

T = TypeVar("T")

ETCD_SCHEME: Final = "etcd://"
ETCD_TIMEOUT: Final = 2.0  # seconds for one read of the node keys
# NOT_OWNER replies followed at once within one request before backing off: a
# takeover can leave two nodes' views apart for a moment (each names the other).
QUICK_HOPS: Final = 3
# A pair in a planned move is served again within a second (docs/group.md): asked
# again at this short interval for up to MOVE_PATIENCE seconds, with or without
# a reconnect policy, so its clients pause no longer than the move.
MOVE_RETRY: Final = 0.02
MOVE_PATIENCE: Final = 5.0
# the refusals of a pair being handed over: "structure X has no owner: ..." while it
# moves, and the old owner's NOT_OWNER once it let it go ("structure X moved to ...")
HANDING_OVER: Final = (": it is moving to ", ": this node is taking it over",
                        " moved to the node at ")


@dataclass(frozen=True, slots=True)
class EtcdGroup:
    """``etcd://HOST:PORT/GROUP``: the nodes of *group* as the etcd at host:port lists them."""

    text: str
    host: str
    port: int
    group: str

    def key_range(self) -> tuple[str, str]:
        """The nodes' keys: ``/cqsd/GROUP/nodes/`` and the end of that prefix."""
        prefix = f"/cqsd/{self.group}/nodes/"
        return prefix, prefix[:-1] + chr(ord("/") + 1)

    def nodes(self, timeout: float | None = ETCD_TIMEOUT) -> list[Address]:
        """The advertised addresses of the live nodes, by node name; raises
        CannotConnect if etcd cannot be read."""
        key, end = self.key_range()
        body = json.dumps({"key": _b64(key), "range_end": _b64(end)}).encode()
        url = f"http://{_http_host(self.host)}:{self.port}/v3/kv/range"
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                kvs = json.load(reply).get("kvs") or []
        except (OSError, ValueError, urllib.error.URLError) as error:
            raise CannotConnect(f"cannot read the nodes of group {self.group} from "
                                f"{self.text}: {error}", address=self.text) from error
        return nodes_from_kvs(kvs, self.text)


def nodes_from_kvs(kvs: list[dict[str, str]], source: str) -> list[Address]:
    """The ``advertise`` addresses of a range reply's node keys, sorted by key;
    a key whose value is not a node's is skipped."""
    found = []
    for kv in sorted(kvs, key=lambda kv: kv.get("key", "")):
        try:
            advertise = json.loads(base64.b64decode(kv.get("value", "")))["advertise"]
            found.append(parse_address(advertise))
        except (ValueError, KeyError, TypeError):
            continue
    if not found:
        raise CannotConnect(f"no live node is listed at {source}", address=source)
    return found


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _http_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_etcd(text: str) -> EtcdGroup:
    """Parse ``etcd://HOST:PORT/GROUP``; ValueError naming the problem."""
    rest = text[len(ETCD_SCHEME):]
    where, slash, group = rest.partition("/")
    if not slash or not group or "/" in group:
        raise ValueError(f"address {text!r}: write a group as etcd://HOST:PORT/GROUP")
    tcp = parse_address(f"tcp://{where}")
    return EtcdGroup(text, tcp.host, tcp.port, group)


# seconds of silence after which a group client gives a node up: half the default lease
# (5 s), so a stopped owner is noticed about when its successor starts serving
GROUP_KEEPALIVE = 2.5


def keepalive_for(targets: "Targets", keepalive: float | None) -> float | None:
    """The keepalive a connection uses: as given (0 turns it off), else GROUP_KEEPALIVE
    for a group (a list or ``etcd://``) and none for a single daemon."""
    if keepalive is None:
        return GROUP_KEEPALIVE if targets.is_group else None
    return keepalive or None


class Targets:
    """The addresses a client dials, in the order it tries them: the node it was
    last sent to first (``prefer``), then the given list (or etcd's)."""

    def __init__(self, text: str, addresses: list[Address], etcd: EtcdGroup | None = None):
        self.text = text
        self.addresses = addresses
        self.etcd = etcd
        self.prefer: Address | None = None  # the owner a NOT_OWNER named
        self.failed: str | None = None  # the address whose connection was lost last

    @property
    def is_group(self) -> bool:
        return self.etcd is not None or len(self.addresses) > 1

    def lost(self, address: str) -> None:
        """The connection to *address* was lost: try it last from now on (a stopped
        node may still accept connections, and answer nothing)."""
        self.failed = address
        if self.prefer is not None and self.prefer.text == address:
            self.prefer = None

    def candidates(self, timeout: float | None = ETCD_TIMEOUT) -> list[Address]:
        """The addresses to try now (reading etcd, for an ``etcd://`` group)."""
        listed = self.etcd.nodes(timeout) if self.etcd is not None else self.addresses
        first = [] if self.prefer is None else [self.prefer]
        rest = [a for a in listed if a.text not in (first[0].text if first else None,
                                                     self.failed)]
        last = [a for a in listed if a.text == self.failed]
        return [*first, *rest, *last]

    def dial(self, open_one: Callable[[Address], T]) -> T:
        """``open_one`` of each candidate in turn; the first that succeeds. The
        last CannotConnect (or the etcd read's) is raised if none does; any other
        error (a refused registration) at once."""
        error: CannotConnect | None = None
        for address in self.candidates():
            try:
                return open_one(address)
            except CannotConnect as failed:
                error = failed
        assert error is not None
        raise error


def parse_targets(address: str | None) -> Targets:
    """Parse an address, a comma-separated list of them, or an ``etcd://`` group (None
    means ``$CQSD_ADDRESS``, else the default). ValueError naming the problem."""
    text = default_address() if address is None else address
    parts = [part.strip() for part in text.split(",")]
    if any(not part for part in parts):
        raise ValueError(f"address list {text!r} has an empty entry")
    if any(part.startswith(ETCD_SCHEME) for part in parts):
        if len(parts) > 1:
            raise ValueError(f"address {text!r}: an etcd:// group stands alone, not in a list")
        return Targets(text, [], parse_etcd(parts[0]))
    return Targets(text, [parse_address(part) for part in parts])


class Misdirected(CannotConnect):
    """Registered with a node that does not own a structure this client restores
    interests in: a reconnect attempt that should try ``owner`` (if known) next."""

    def __init__(self, message: str, address: str, owner: str | None) -> None:
        super().__init__(message, address=address)
        self.owner = owner


def misdirection(targets: Targets, address: str, refused: CQSError, structure: str
                 ) -> CQSError:
    """What a reconnect raises when the node at *address* refused to restore an
    interest in *structure*: Misdirected (a transient failure: try the owner next)
    if the node does not own it, else *refused* itself."""
    where = redirect(refused, structure)
    if where is None:
        return refused
    if where:
        targets.prefer = parse_address(where)
    return Misdirected(f"{address}: {refused.message}", address, where or None)


def no_owner(error: CQSError, structure: str | None) -> bool:
    """True for the STRUCTURE_FAILED of a pair no node owns right now (a takeover
    under way, etcd out of reach): worth asking again, unlike a failed structure."""
    return (isinstance(error, StructureFailed) and structure is not None
            and error.message.startswith(f"structure {structure} has no owner"))


def redirect(error: CQSError, structure: str | None) -> str | None:
    """What a refusal of a request on *structure* means for where to go: the owner's
    address for NOT_OWNER, "" for no owner yet, None for a real error."""
    if isinstance(error, NotOwner):
        return error.owner or ""
    return "" if no_owner(error, structure) else None


class Patience:
    """How long one request waits for its structure to have a reachable owner:
    the first QUICK_HOPS moves are made at once, then each try waits the next
    delay of the reconnect policy; once ``give_up_after`` has passed (or at once
    without a policy, after the quick hops) the refusal is raised."""

    def __init__(self, policy: Reconnect | None) -> None:
        self.policy = policy
        self.hops = 0
        self.started = time.monotonic()
        self.moving = False  # a refusal said the structure is being handed over
        self._delays: Iterator[float] | None = None

    def quick_hop(self, error: CQSError) -> bool:
        """True if a move to the owner *error* named may be made now, without waiting."""
        self._note(error)
        self.hops += 1
        return self.hops <= QUICK_HOPS

    def _note(self, error: CQSError) -> None:
        # once a move was seen, every refusal until the target serves is part of it (the
        # target may still name the old owner for a moment): asked again at MOVE_RETRY
        self.moving = self.moving or any(why in error.message for why in HANDING_OVER)

    def next_delay(self, error: CQSError) -> float:
        """The seconds to wait before asking again; raises *error* when out of patience."""
        self._note(error)
        if self.moving and time.monotonic() - self.started < MOVE_PATIENCE:
            return MOVE_RETRY
        policy = self.policy
        if policy is None:
            raise error
        if policy.give_up_after is not None and (
                time.monotonic() - self.started >= policy.give_up_after):
            raise error
        if self._delays is None:
            self._delays = policy.delays()
            next(self._delays)  # the policy's first "at once": we just tried
        return next(self._delays)
