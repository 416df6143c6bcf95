"""Who owns what in a group, and which free pairs this node should take.

Design note. A group's state is a handful of etcd keys under
``/cqsd/<GROUP>/`` (docs/group.md): ``nodes/<NODE>`` (bound to the node's
lease: the node is live while it exists), ``owners/<STRUCTURE>`` (bound to the
owner's lease; its create revision is the pair's *epoch*) and
``seals/<STRUCTURE>/<EPOCH>`` (the cut a new owner put on the log of the
owners before it; never bound to a lease) and ``standby/<STRUCTURE>/<NODE>``
(how far a warm standby is behind the owner, bound to its lease). This module reads those keys into
a ``View`` and decides, as the etcd raft library decides, without I/O: the
node's loop (node.py) reads the keys, asks ``to_take``, and tries each pair
with a create-if-absent transaction, so two nodes that decide alike at once
still end with one owner.

Placement. A pair's *home* is the first live node of its preference list
(CFRM's PREFLIST; a node not in the list never owns it), or, without one, the
live node that rendezvous hashing of the pair's name picks (highest random
weight): every node computes the same home from the same live set, a node
joining or leaving moves only the pairs it wins or held, and no table needs
keeping. A free pair is taken by its home, unless a planned move
(``moves/<PAIR>``, docs/group.md) names a live target that may own it: then by
that target alone; a pair free for longer than a lease (its home live but
unable to take it) by any node that may own it. A node that joins takes back
the pairs that prefer it from their owners by planned moves, not takeovers
(node.py); a pair without a preference list stays with its owner until that
owner leaves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from .etcd import KV

__all__ = ["Handed", "Node", "Owner", "Seal", "Standby", "View", "home", "key", "may_own",
           "may_take", "spread", "to_call_home", "to_take"]


def key(group: str, *parts: str | int) -> str:
    """The etcd key of a group's ``parts``: ``/cqsd/GROUP/owners/MSGQ01``."""
    return "/".join(("", "cqsd", group, *map(str, parts)))


@dataclass(frozen=True)
class Node:
    name: str
    advertise: str
    writer: str  # the log series it writes this incarnation
    standby: str


@dataclass(frozen=True)
class Owner:
    structure: str
    node: str
    advertise: str
    writer: str
    epoch: int  # the owner key's create revision
    lease: int
    # the series it rolled away from while owning the pair (node.py), each at its end:
    # they hold the pair's records of this epoch before ``writer``'s
    rolled: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Seal:
    """The cut the owner of ``epoch`` put on its predecessors' records of a structure."""

    structure: str
    epoch: int
    writer: str  # the new owner's series, whose first record of the epoch repeats this
    cut: dict[str, int]  # writer -> last LSN of theirs that counts for the structure
    timestamp: int  # the newest timestamp at or below the cut: the epoch stamps after it

    def encode(self) -> str:
        return json.dumps({"writer": self.writer, "cut": self.cut, "timestamp": self.timestamp})


@dataclass(frozen=True)
class Handed:
    """Where the owner of ``epoch`` left its series when it handed the pair over by a
    planned move: every record of the pair in ``writer`` is at or below ``lsn``,
    durable, and stamped at or below ``timestamp``. The next owner takes it as that
    writer's end instead of scanning the series for it."""

    epoch: int
    writer: str
    lsn: int
    timestamp: int

    def encode(self) -> str:
        return json.dumps({"epoch": self.epoch, "writer": self.writer, "lsn": self.lsn,
                           "timestamp": self.timestamp})


@dataclass(frozen=True)
class Standby:
    """A warm standby's last report on a pair (standby.py): how far behind the owner's
    series ``writer`` its last pass left it, the last LSN of that series it has read,
    and whether a planned move of the pair to it is under way there (it then watches
    the owner key, and takes the pair the moment it is free)."""

    records: int
    seconds: float
    writer: str | None = None
    read: int = 0
    receiving: bool = False


@dataclass
class View:
    """The group as one read of its keys saw it."""

    nodes: dict[str, Node] = field(default_factory=dict)
    owners: dict[str, Owner] = field(default_factory=dict)
    seals: dict[str, list[Seal]] = field(default_factory=dict)  # oldest epoch first
    # structure -> node -> how far behind the owner its warm standby is (standby.py)
    lag: dict[str, dict[str, Standby]] = field(default_factory=dict)
    moves: dict[str, str] = field(default_factory=dict)  # structure -> the node asked to own it
    # structure -> where the owner that handed it over last left its series (node.py)
    handed: dict[str, Handed] = field(default_factory=dict)
    revision: int = 0

    @classmethod
    def read(cls, group: str, kvs: list[KV], revision: int) -> View:
        """The view of every key under ``/cqsd/GROUP/``; keys it cannot read are skipped
        (a newer node's keys, or a hand-made one), never fatal."""
        view = cls(revision=revision)
        prefix = key(group) + "/"
        for kv in kvs:
            parts = kv.key.removeprefix(prefix).split("/")
            try:
                value = kv.json()
                if parts[0] == "nodes" and len(parts) == 2:
                    view.nodes[parts[1]] = Node(parts[1], value["advertise"], value["writer"],
                                                value.get("standby", "warm"))
                elif parts[0] == "owners" and len(parts) == 2:
                    view.owners[parts[1]] = Owner(
                        parts[1], value["node"], value["advertise"], value["writer"],
                        kv.create_revision, kv.lease,
                        {str(w): int(n) for w, n in value.get("rolled", {}).items()})
                elif parts[0] == "seals" and len(parts) == 3:
                    view.seals.setdefault(parts[1], []).append(Seal(
                        parts[1], int(parts[2]), value["writer"],
                        {str(w): int(n) for w, n in value["cut"].items()},
                        int(value["timestamp"])))
                elif parts[0] == "standby" and len(parts) == 3:
                    view.lag.setdefault(parts[1], {})[parts[2]] = Standby(
                        int(value["records"]), float(value["seconds"]), value.get("writer"),
                        int(value.get("read", 0)), bool(value.get("receiving", False)))
                elif parts[0] == "handed" and len(parts) == 2:
                    view.handed[parts[1]] = Handed(int(value["epoch"]), str(value["writer"]),
                                                   int(value["lsn"]), int(value["timestamp"]))
                elif parts[0] == "moves" and len(parts) == 2:
                    view.moves[parts[1]] = str(value["to"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        for seals in view.seals.values():
            seals.sort(key=lambda s: s.epoch)
        return view

    def cuts(self, structure: str) -> dict[str, int]:
        """Every sealed writer's last LSN that counts for ``structure`` (the highest seal
        of each: a writer sealed twice handed the pair over between, writing none of it)."""
        cut: dict[str, int] = {}
        for seal in self.seals.get(structure, ()):
            for writer, lsn in seal.cut.items():
                cut[writer] = max(cut.get(writer, 0), lsn)
        return cut


def spread(structure: str, nodes: Collection[str]) -> str | None:
    """The node rendezvous hashing places ``structure`` on, among ``nodes``."""
    return max(nodes, default=None,
               key=lambda n: hashlib.sha256(f"{structure}/{n}".encode()).digest())


def home(structure: str, prefer: tuple[str, ...] | None, live: Collection[str]) -> str | None:
    """Where pair ``structure`` belongs with ``live`` nodes: the first live node of
    ``prefer``, or the spread's pick without one; None if no live node may own it."""
    if prefer is None:
        return spread(structure, live)
    return next((n for n in prefer if n in live), None)


def may_own(prefer: tuple[str, ...] | None, node: str) -> bool:
    """Whether ``node`` may own a pair with preference list ``prefer`` at all."""
    return prefer is None or node in prefer


def may_take(structure: str, prefer: tuple[str, ...] | None, me: str, view: View,
             stale: bool = False) -> bool:
    """Whether ``me`` may take the free pair ``structure``: it is the live target of a
    planned move of it, or, with no such move, the pair's home, or any node that may
    own it once the pair is ``stale`` (free for longer than its home should take: the
    home is live but cannot, its disk full say)."""
    live = {*view.nodes, me}
    target = view.moves.get(structure)
    if target is not None and target in live and may_own(prefer, target):
        return target == me
    if stale:
        return may_own(prefer, me)
    return home(structure, prefer, live) == me


def to_take(me: str, pairs: Mapping[str, tuple[str, ...] | None], view: View,
            stale: Collection[str] = ()) -> list[str]:
    """The free pairs ``me`` should try to take now, in name order (``stale``: those
    free for too long, which any node that may own them takes)."""
    return [name for name, prefer in sorted(pairs.items())
            if name not in view.owners and may_take(name, prefer, me, view, name in stale)]


def to_call_home(me: str, pairs: Mapping[str, tuple[str, ...] | None], view: View) -> list[str]:
    """The pairs that prefer ``me`` before their owner, with no move asked yet: a node
    joining asks for them by planned moves. A pair without a preference list stays
    where it is: the spread places free pairs, it does not move owned ones (a move
    pauses the pair's clients, and the spread's pick changes with every join)."""
    live = {*view.nodes, me}
    return [name for name, prefer in sorted(pairs.items())
            if prefer is not None
            and (o := view.owners.get(name)) is not None and o.node != me
            and name not in view.moves and home(name, prefer, live) == me]
