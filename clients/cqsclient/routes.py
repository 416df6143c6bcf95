"""Which node each structure's requests go to: the SDK's map of owners.

Design note
-----------
In a group (docs/group.md) every structure pair has one owner, and the pairs one
application uses may live on different nodes. A client therefore keeps one
registered connection (a *link*, same client name on each) per node it needs,
and sends each request on the link of its structure's owner, as a Redis Cluster
client keeps its slot map. This module is that map, and nothing else: pure
bookkeeping shared by the blocking and the async client, no I/O and no locks
(each client holds its own around it).

- An owner is *learned* from a request that succeeded on a link (that node
  serves the structure) and from a ``NOT_OWNER`` naming it (nothing was applied:
  the client opens a link there if it has none and sends the request again).
  A structure that moved has its interests registered at the new owner after
  its first answer there: during a planned move the target is named before it
  serves the pair.
- A link that is lost (its node died, stopped or was cut off) *forgets* the
  owners it stood for: their requests go through the home link again, which
  answers them, or names their next owner, or says there is none yet.
- The *home* link carries the requests that name no structure and those of
  structures whose owner is not known yet. The home moves to a link that
  owns something when it owns nothing itself, and a link that owned something
  and owns nothing now (its pairs moved) is closed (deregistered).

A unit of work is one ``commit`` of one pair, sent to that pair's owner; an
operation naming another pair is refused (``INVALID_REQUEST``), so the map is
never asked to split one.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Routes"]


class Routes:
    """Structure name -> the address of the node its requests go to."""

    def __init__(self, home: str) -> None:
        self.home = home
        self._owners: dict[str, str] = {}
        # structures whose interests are to be registered where they are served next:
        # their link was lost, or a NOT_OWNER moved them and they have not answered yet
        self._unsettled: set[str] = set()
        self._used: set[str] = set()  # nodes that have owned a structure of this client

    def owners(self) -> dict[str, str]:
        """The owners known now (a copy)."""
        return dict(self._owners)

    def address(self, structure: str) -> str:
        """Where a request on *structure* ("" for none) goes: its owner, else home."""
        return self._owners.get(structure, self.home) if structure else self.home

    def knows(self, structure: str, address: str) -> bool:
        """True if *structure* is known to be served at *address*, interests and all
        (the fast path of every request)."""
        return self._owners.get(structure) == address and structure not in self._unsettled

    def redirect(self, structure: str, address: str) -> None:
        """A NOT_OWNER named *address* as *structure*'s owner. It may not serve it
        yet (a planned move under way): its interests wait for its first answer."""
        before = self._owners.get(structure)
        self._owners[structure] = address
        self._used.add(address)
        if before is not None and before != address:
            self._unsettled.add(structure)

    def served(self, structure: str, address: str) -> bool:
        """A request on *structure* succeeded at *address*; True if it moved there
        (it was known elsewhere, or its link was lost): register its interests there."""
        before = self._owners.get(structure)
        self._owners[structure] = address
        self._used.add(address)
        moved = (before is not None and before != address) or structure in self._unsettled
        self._unsettled.discard(structure)
        return moved

    def followed(self, structure: str, address: str, registered: bool) -> None:
        """The client followed a NOT_OWNER of *structure* to *address* and tried to
        register its interests there: done if that was *registered*, else the target
        does not serve it yet (a move's target): they wait for its first answer."""
        if registered:
            self.served(structure, address)
        else:
            self.redirect(structure, address)

    def served_by(self, address: str) -> set[str]:
        """The structures known to be served at *address*."""
        return {s for s, a in self._owners.items() if a == address}

    def lost(self, address: str) -> set[str]:
        """The link to *address* was lost: forget the owners it stood for; those."""
        gone = self.served_by(address)
        for structure in gone:
            del self._owners[structure]
        self._unsettled |= gone
        return gone

    def settle(self, links: Iterable[str]) -> list[str]:
        """After a change, with links open to *links*: move the home to a link that
        serves something if it serves nothing, and return the links no longer
        needed (serving nothing now but something once, not the home), for the
        client to close. The node first connected to stays while it served nothing:
        it is the way in, and often needed soon."""
        open_ = list(links)
        serving = [a for a in open_ if self.served_by(a)]
        if self.home not in serving and serving:
            self.home = serving[0]
        elif self.home not in open_ and open_:
            self.home = open_[0]
        return [a for a in open_ if a != self.home and a not in serving and a in self._used]

    def reset(self, home: str) -> None:
        """Every link was replaced by one to *home* (a full reconnect, which registered
        every interest there): the owners are learned again."""
        self._owners.clear()
        self._unsettled.clear()
        self.home = home
