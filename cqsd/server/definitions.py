"""Each structure's definition (SIZE, INITSIZE) and current size, kept in the
repository so that what operators change outlives the config file.

Design note. The config is the CFRM policy of the seeds: it names each
structure's SIZE and INITSIZE, and the first start allocates the structure
from it. From then on the structure is what the repository says: ``alter``
and a growth (overflow processing, or a put that did not fit) change its
current size, ``rebuild --size`` its SIZE, and a restart, a recovery or a
copy keeps them. A config changed later is a *pending* policy change (seed
004, "Policy change is pending until structure is rebuilt"): it is reported
at start (``structure_config_differs``) and in ``display structures``
(``definition``: which of the two is in force, ``pending``: the config's
values not applied), never applied behind the operator's back, and a
``rebuild`` without a size applies it. The failed flag an operator's ``fail``
sets is kept too, so a drill outlives a restart until ``recover`` ends it.

Only SIZE and INITSIZE are the structure's own; every other key of
``[[structure]]`` (entry_max, thresholds, exits, offload) says how this daemon
uses the structure, and applies from the config at each start. Without a
repository (``path`` None, in-process tests) the config is all there is.
"""

import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

import structlog

from ..config import Config
from ..storage import repository
from ..storage.repository import RepositoryError

log = structlog.get_logger()
SEEDED = "config"  # changed_by of a definition the config seeded


class Definition(NamedTuple):
    size: int  # SIZE: the most it may grow to
    initsize: int  # INITSIZE: what it is allocated with

    def differences(self, other: "Definition") -> dict[str, int]:
        """This definition's values where ``other`` has others, by key."""
        return {k: v for k, v, w in zip(self._fields, self, other, strict=True) if v != w}


class Held(NamedTuple):
    """A structure as the daemon runs it: its definition, current size, failed flag."""

    definition: Definition
    current_size: int
    failed: bool = False


class _Row(TypedDict):
    """A structure's sizes as repository.record_structure takes them (keywords)."""

    size: int
    initsize: int
    current_size: int


class Definitions:
    def __init__(self, config: Config, path: Path | None = None) -> None:
        self.path = path
        self.configured = {sc.name: Definition(sc.size, sc.initsize) for sc in config.structures}
        self.held = {name: Held(d, d.initsize) for name, d in self.configured.items()}

    def load(self) -> None:
        """At start: take each structure from the repository, seeding the ones it does
        not hold yet from the config, and report every config that disagrees. Raises
        RepositoryError if the repository cannot be read or written."""
        if self.path is None:
            return
        stored = repository.structures(self.path)
        for name, configured in self.configured.items():
            row = stored.get(name)
            if row is None:
                repository.record_structure(self.path, name, **self._row(self.held[name]),
                                            changed_by=SEEDED)
                log.info("structure_defined", structure=name, size=configured.size,
                         initsize=configured.initsize, source="config")
                continue
            self.held[name] = held = _held(row)
            pending = self.pending(name)
            if pending:
                log.warning("structure_config_differs", structure=name, config=pending,
                            repository=held.definition.differences(configured),
                            changed_by=row["changed_by"],
                            action="the repository's definition stays in force; cqsctl "
                                   "rebuild applies the config's")
        for name in sorted(set(stored) - set(self.configured)):
            log.warning("structure_not_configured", structure=name,
                        action="the config no longer defines it: it is not served; its "
                               "definition and data stay in the data directory")

    def refresh(self, names: Iterable[str]) -> None:
        """In a group, as a node takes pairs over: ``names`` as the repository (the
        group's, in the shared data directory) holds them now. Their owner may have
        changed them since this node started (``rebuild --size``, ``alter``, a
        growth), and a failed flag it set is cleared by the takeover's install.
        Raises RepositoryError."""
        if self.path is None:
            return
        stored = repository.structures(self.path)
        for name in names:
            if (row := stored.get(name)) is not None:
                self.held[name] = _held(row)

    def pending(self, name: str) -> dict[str, int] | None:
        """The config's values for ``name`` that are not in force, None if none."""
        return self.configured[name].differences(self.held[name].definition) or None

    def describe(self, name: str) -> dict[str, Any]:
        """What ``display structures`` says of where the definition comes from."""
        pending = self.pending(name)
        return {"definition": "repository" if pending else "config", "pending": pending}

    def resized(self, name: str, current_size: int, by: str) -> None:
        """An alter (the operator's, or a growth) left ``name`` at ``current_size``."""
        held = self.held[name]
        self.held[name] = held._replace(current_size=current_size)
        self._write(name, repository.record_current_size, name, current_size, by)

    def redefined(self, name: str, held: Held) -> None:
        """A rebuild gave ``name`` a new definition and current size."""
        self.held[name] = held._replace(failed=self.held[name].failed)
        self._write(name, functools.partial(repository.record_structure, **self._row(held),
                                            changed_by="rebuild"), name)

    def failed(self, name: str, failed: bool) -> None:
        """An operator failed ``name`` (True), or a recovery brought it back (False)."""
        if self.held[name].failed != failed:
            self.held[name] = self.held[name]._replace(failed=failed)
            self._write(name, repository.record_failed, name, failed)

    @staticmethod
    def _row(held: Held) -> _Row:
        return {"size": held.definition.size, "initsize": held.definition.initsize,
                "current_size": held.current_size}

    def _write(self, name: str, write: Callable[..., None], *args: Any) -> None:
        """A change in memory is made; the repository failing to take it is named,
        and the daemon carries on (the next start uses what the repository has)."""
        if self.path is None:
            return
        try:
            write(self.path, *args)
        except RepositoryError as err:
            log.error("structure_definition_not_saved", structure=name, error=str(err),
                      action="in force until the daemon stops; the next start uses the "
                             "repository's older value")


def _held(row: dict[str, Any]) -> Held:
    """A structure as the repository's row of it says."""
    return Held(Definition(row["size"], row["initsize"]), row["current_size"], row["failed"])
