"""The states of every data set the daemon knows, as seed 000 keeps them: the
shared STATUS and ACCESS and the stopped-connection flag in the repository
(they outlive the daemon), the SMDSCONN STATUS and AVAIL in memory.

The tables are ``cqsd/smds/states.py``; this room holds one ``SmdsState`` per
(structure, owner), fires events at it, writes what must survive a restart,
and logs every change as one event with the old state, the new one and why
(docs/architecture.md, "The rules"): ``smds_status_changed``, ``smds_access_changed``,
``smdsconn_status_changed``, ``smdsconn_avail_changed``.
"""

import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import structlog

from ...smds.states import Access, Avail, Conn, Event, SmdsState, Status
from ...storage import repository

log = structlog.get_logger()
DataSetKey = tuple[str, str]  # (structure, owner): one data set

EVENT_NAMES = {"status": "smds_status_changed", "access": "smds_access_changed",
               "conn": "smdsconn_status_changed", "avail": "smdsconn_avail_changed"}
# new values an operator must act on: logged as warnings
WORRYING = {Status.FAILED, Access.SUSPENDED, Avail.ERROR, Conn.ALLOCFAIL, Conn.OPENFAIL,
            Conn.STGFAIL, Conn.DATAFAIL}


class Availability:
    def __init__(self, repository_path: Path) -> None:
        self.path = repository_path
        self._states: dict[DataSetKey, SmdsState] = {}
        self._records: dict[DataSetKey, dict[str, Any]] = {}  # the repository's row of each

    def load(self, structures: list[str] | None = None,
             keep: Collection[DataSetKey] = ()) -> None:
        """Read the states the repository keeps: all at start; in a group, those of
        ``structures`` again at a takeover, as their earlier owners left them,
        except the data sets in ``keep`` (open here)."""
        for row in repository.smds_datasets(self.path):
            key = (row["structure"], row["owner"])
            if (structures is not None and key[0] not in structures) or key in keep:
                continue
            self._records[key] = row
            self._states[key] = SmdsState(Status(row["status"]), Access(row["access"]),
                                          Conn.CLOSED,
                                          Avail.STOPPED if row["stopped"] else Avail.NORMAL)

    def state(self, key: DataSetKey) -> SmdsState:
        return self._states.get(key, SmdsState())

    def record(self, key: DataSetKey) -> dict[str, Any]:
        """The repository's row of a data set (empty if it has none)."""
        return self._records.get(key, {})

    def known(self, structure: str | None = None) -> list[DataSetKey]:
        """Every data set with a state, of one structure or all, in name order."""
        return sorted(k for k in self._states if structure in (None, k[0]))

    def fire(self, key: DataSetKey, event: Event, reason: str) -> SmdsState:
        """Apply ``event`` (and what it triggers); persist and log each change.
        Raises IllegalTransition, changing nothing, if the state refuses it."""
        old = self.state(key)
        new, changes = old.process(event)
        self._states[key] = new
        fields: dict[str, Any] = {}
        if new.status != old.status or key not in self._records:
            fields["status"] = str(new.status)
            if new.status == Status.FAILED:
                fields["failtime"] = time.time_ns()
            elif new.status == Status.ACTIVE:
                fields["failtime"] = None
                if old.status in (Status.NEW, Status.EMPTY):  # logging of its contents begins
                    fields["rcvtime"] = time.time_ns()
        if new.access != old.access or key not in self._records:
            fields["access"] = str(new.access)
        if (new.avail == Avail.STOPPED) != (old.avail == Avail.STOPPED):
            fields["stopped"] = int(new.avail == Avail.STOPPED)
        if fields:
            self.set(key, **fields)
        for change in changes:
            level = log.warning if change.new in WORRYING else log.info
            level(EVENT_NAMES[change.state], structure=key[0], owner=key[1], old=change.old,
                  new=change.new, cause=str(change.event), reason=reason)
        return new

    def forget(self, key: DataSetKey) -> None:
        """The data set is gone for good (``OpenDataSets.discard``): NOTFOUND again."""
        repository.forget_smds(self.path, *key)
        self._records.pop(key, None)
        self._states.pop(key, None)

    def set(self, key: DataSetKey, **fields: Any) -> None:
        """Write fields of the data set's repository row (and keep them)."""
        repository.update_smds(self.path, key[0], key[1], **fields)
        record = self._records.setdefault(key, {"structure": key[0], "owner": key[1],
                                                "created": 0, "map_time": None})
        record.update(fields)
        self._states.setdefault(key, SmdsState())
