"""The structures clients address, by name.

Clients name a primary structure; its overflow structure, if it has one,
travels with it as a ``StructurePair`` and is never addressed directly. A
pair an operator is recovering, or failed for a drill, is *failed*: its
requests get STRUCTURE_FAILED while the others carry on. Pairs are made as
their definitions say (``new_pair``; definitions.py: the repository's, once
``open`` has read it) at start, by a recovery and by a rebuild, and
``install`` puts a new one in place of the old, in configuration order.
"""

from collections.abc import Callable

import structlog

from .. import exits
from ..engine import CQSError, Reason, Structure, StructurePair
from ..engine.entry import ELEMENT
from .definitions import Definitions, Held
from .liveconfig import LiveConfig

log = structlog.get_logger()


class Registry:
    def __init__(self, config: LiveConfig, definitions: Definitions | None = None) -> None:
        self.config = config
        self.definitions = definitions or Definitions(config.current)
        self.overflow_of = {sc.overflow: sc.name for sc in config.structures if sc.overflow}
        self._exits = {
            sc.name: (exits.resolve(sc.overflow_exit, f"structure {sc.name}: overflow_exit"),
                      exits.resolve(sc.queue_space_exit, f"structure {sc.name}: queue_space_exit"))
            for sc in config.structures
        }
        self.pairs = self._all()
        self.failed: dict[str, StructurePair] = {}  # failed by an operator, or recovering
        # a group's pairs this node does not own (docs/group.md), and why, for each
        self.standby: set[str] = set()
        self.elsewhere: Callable[[str], CQSError] | None = None

    def open(self) -> None:
        """At start, once the data directory is open: every pair as the repository
        defines it; one an operator failed stays failed until recovered. Raises
        RepositoryError."""
        self.definitions.load()
        self.pairs = self._all()
        for name in list(self.pairs):
            if self.definitions.held[name].failed:
                self.failed[name] = self.pairs.pop(name)
                log.warning("structure_failed", structure=name, why="operator fail",
                            action=f"failed before the restart; cqsctl recover {name} ends it")

    def _all(self) -> dict[str, StructurePair]:
        return {name: self.new_pair(name) for name in self.names() if name not in self.overflow_of}

    def names(self) -> list[str]:
        """Every configured structure, overflow structures included, in config order."""
        return [sc.name for sc in self.config.structures]

    def new_pair(self, name: str, held: dict[str, Held] | None = None) -> StructurePair:
        """An empty pair as its definitions say, or with ``held`` (by structure) instead."""
        sc, held = self.config.structure(name), held or {}
        overflow = self._new(sc.overflow, held.get(sc.overflow)) if sc.overflow else None
        overflow_exit, space_exit = self._exits[name]
        return StructurePair(self._new(name, held.get(name)), overflow,
                             threshold=sc.overflow_threshold, overflow_exit=overflow_exit,
                             queue_space_exit=space_exit, share=sc.overflow_share,
                             candidates=sc.overflow_candidates)

    def _new(self, name: str, held: Held | None) -> Structure:
        sc = self.config.structure(name)
        held = held or self.definitions.held[name]
        # max_entries left to its default follows the SIZE in force, not the config's
        entries = None if sc.max_entries == sc.size // ELEMENT else sc.max_entries
        return Structure(sc.name, held.definition.size, initsize=held.current_size,
                         entry_max=sc.entry_max, max_entries=entries,
                         max_deliveries=self.config.daemon.max_deliveries,
                         offload_rules=sc.offload_rules)

    def structure(self, name: str) -> StructurePair:
        """The available pair a client calls ``name``; raises STRUCTURE_FAILED or
        UNKNOWN_STRUCTURE saying why there is none."""
        pair = self.pairs.get(name)
        if pair is not None:
            return pair
        if name in self.standby and self.elsewhere is not None:
            raise self.elsewhere(name)
        if name in self.failed:
            raise CQSError(Reason.STRUCTURE_FAILED,
                           f"structure {name} has failed and is being recovered")
        if name in self.overflow_of:
            raise CQSError(Reason.UNKNOWN_STRUCTURE,
                           f"{name} is the overflow structure of {self.overflow_of[name]}; "
                           f"requests go to {self.overflow_of[name]}")
        raise CQSError(Reason.UNKNOWN_STRUCTURE,
                       f"no structure named {name!r}; this daemon has {', '.join(self.pairs)}")

    def pair_of(self, name: str) -> StructurePair:
        """The available pair a structure belongs to, as its primary or its overflow."""
        return self.structure(self.overflow_of.get(name, name))

    def physical(self, name: str) -> Structure | None:
        """The live structure called ``name`` (primary or overflow), None if failed."""
        pair = self.pairs.get(self.overflow_of.get(name, name))
        if pair is None:
            return None
        return pair.primary if pair.primary.name == name else pair.overflow

    def queue_of(self, name: str, entry_id: int) -> tuple[int, str] | None:
        """The queue holding message ``entry_id`` of pair ``name`` as (type, name), None
        if there is none."""
        pair = self.pairs.get(name)
        for s in pair.structures() if pair is not None else ():
            if s.holds(entry_id):
                entry = s.entry(entry_id)
                return entry.qtype, entry.name
        return None

    def structures(self) -> list[Structure]:
        """Every live structure, overflow structures included."""
        return [s for pair in self.pairs.values() for s in pair.structures()]

    def fail(self, name: str) -> StructurePair:
        """Take pair ``name`` out of service; returns it."""
        pair = self.structure(name)
        del self.pairs[name]
        self.failed[name] = pair
        return pair

    def install(self, new: StructurePair) -> None:
        """Make ``new`` the pair clients reach by its name, in config order."""
        new.derive_status()
        self.failed.pop(new.name, None)
        self.definitions.failed(new.name, False)
        self.pairs = {n: new if n == new.name else self.pairs[n]
                      for n in self.names() if n == new.name or n in self.pairs}
