"""The operator's SMDS commands (seed 000; docs/smds.md): ``reset-smds``,
``start-smdsconn``, ``stop-smdsconn`` and ``alter-smds``.

Each is a state change of the tables (cqsd/smds/states.py) with what the
daemon must do around it: close the data set first — normally, saving its
space map, for a stop or ACCESS(DISABLED); abandoned for STATUS(FAILED), which
"tells queue managers that they must stop using it immediately" — and, after
it, try to open the data set again where the new state allows (a SUSPENDED data
set enabled, a connection started, a data set RECOVERED, whose restart
processing deletes the entries whose data is lost). A command the state does
not allow is refused with INVALID_REQUEST naming the state, before anything
is closed.
"""

from dataclasses import replace
from typing import Any

import structlog
import trio

from cqsproto import CLIENT_NAME, CLIENT_NAME_RULE

from ...engine import CQSError, Reason
from ...smds.states import Conn, Event, IllegalTransition, Status
from ..liveconfig import LiveConfig
from ..runtime import Runtime
from .availability import DataSetKey
from .datasets import DataSets

log = structlog.get_logger()

ACCESS = {"enabled": Event.ENABLE, "disabled": Event.DISABLE}
STATUS = {"failed": Event.RESET_FAILED, "recovered": Event.RESET_RECOVERED}
DSEXPAND = {"yes": "YES", "no": "NO", "default": None}
MAX_DSBUFS = 9999  # as the dsbufs config key (MQ's DSBUFS range)


class SmdsCommands:
    def __init__(self, config: LiveConfig, datasets: DataSets, runtime: Runtime) -> None:
        self.config = config
        self.datasets = datasets
        self.states = datasets.states
        self.runtime = runtime

    async def reset(self, structure: str, owner: str, access: str | None,
                    status: str | None) -> dict[str, Any]:
        """RESET SMDS: STATUS(FAILED | RECOVERED), then ACCESS(ENABLED | DISABLED)."""
        key = self._key(structure, owner)
        if access is None and status is None:
            raise _bad("reset-smds: give --access, --status or both")
        chosen = [(_choice("status", status, STATUS), f"reset-smds --status {status}"),
                  (_choice("access", access, ACCESS), f"reset-smds --access {access}")]
        events = [(event, words) for event, words in chosen if event is not None]
        self._exists(key, "reset-smds")
        self._check(key, [event for event, _ in events], "reset-smds")
        if status == "failed":  # it must stop being used at once: no space map saved
            await self.datasets.open_sets.close_one(key, "reset-smds --status failed", save=False)
        if access == "disabled":  # closed normally, its space map saved
            await self.datasets.open_sets.close_one(key, "reset-smds --access disabled")
        for event, words in events:
            self._fire(key, event, words)
        await self.datasets.open_sets.open_aside(key, "reset-smds")
        self.runtime.settle()  # deletes of messages a restart found lost
        return self.datasets.displays.cfstatus_row(key)

    async def stop(self, structure: str, owner: str | None) -> list[dict[str, Any]]:
        """STOP SMDSCONN: each data set closed normally, its connection STOPPED, which a
        restart remembers."""
        keys = self._keys(structure, owner, "stop-smdsconn")
        self._check_all(keys, Event.STOP, "stop-smdsconn")
        for key in keys:
            await self.datasets.open_sets.close_one(key, "stop-smdsconn")
            self._fire(key, Event.STOP, "stop-smdsconn")
        return [self.datasets.displays.smdsconn_row(key) for key in keys]

    async def start(self, structure: str, owner: str | None) -> list[dict[str, Any]]:
        """START SMDSCONN: each connection NORMAL, and its data set opened if it may be."""
        keys = self._keys(structure, owner, "start-smdsconn")
        for key in keys:
            self.states.fire(key, Event.START, "start-smdsconn")
            await self.datasets.open_sets.open_aside(key, "start-smdsconn")
        self.runtime.settle()
        return [self.datasets.displays.smdsconn_row(key) for key in keys]

    def alter(self, structure: str, owner: str, dsbufs: int | str | None,
              dsexpand: str | None) -> trio.Event | None:
        """ALTER SMDS DSBUFS / DSEXPAND: the data set's overrides ("default" drops one).
        Turning expansion back on retries it at once if the data set is full enough
        to want it, or a put found no room (seed 000: "to trigger a retry"): the
        growth started, set when it is done."""
        key = self._key(structure, owner)
        fields: dict[str, Any] = {}
        if dsbufs is not None:
            if dsbufs != "default" and not (type(dsbufs) is int and 1 <= dsbufs <= MAX_DSBUFS):
                raise _bad(f"alter-smds: dsbufs must be 1 to {MAX_DSBUFS} or default, "
                           f"not {dsbufs!r}")
            fields["dsbufs"] = None if dsbufs == "default" else dsbufs
        if dsexpand is not None:
            if dsexpand not in DSEXPAND:
                raise _bad(f"alter-smds: dsexpand must be yes, no or default, not {dsexpand!r}")
            fields["dsexpand"] = DSEXPAND[dsexpand]
        if not fields:
            raise _bad("alter-smds: give --dsbufs, --dsexpand or both")
        self._exists(key, "alter-smds")
        self.states.set(key, **fields)
        if dsexpand is not None:
            self.datasets.space.refused.pop(key, None)
        log.info("smds_altered", structure=structure, owner=owner, **fields)
        if "dsbufs" in fields:
            self.datasets.tuning.pool(structure)  # resized to what its data sets ask for now
        dataset = self.datasets.open_sets.open.get(key)
        if dsexpand is not None and self.datasets.tuning.dsexpand(key) and dataset is not None \
                and dataset.space is not None \
                and (dataset.space.wants_growth or key in self.datasets.space.short):
            return self.datasets.space.grow(dataset)
        return None

    # -- inside ----------------------------------------------------------------------

    def _key(self, structure: str, owner: str) -> DataSetKey:
        """(structure, owner) of an offloading structure; raises UNKNOWN_STRUCTURE or
        INVALID_REQUEST."""
        self._offloading(structure)
        if not CLIENT_NAME.fullmatch(owner):
            raise _bad(f"{owner!r} is not a client name: {CLIENT_NAME_RULE}")
        return (structure, owner)

    def _exists(self, key: DataSetKey, command: str) -> DataSetKey:
        """``key`` if its data set exists (not NOTFOUND): a command naming an owner
        that never put an offloaded message is refused, and nothing is recorded of it."""
        structure, owner = key
        if self.states.state(key).status == Status.NOTFOUND:
            known = [k[1] for k in self.datasets.open_sets.keys([structure])
                     if self.states.state(k).status != Status.NOTFOUND]
            raise _bad(f"{command}: {owner} has no data set in {structure} (NOTFOUND: it has "
                       f"put no offloaded message there); the data sets of {structure} are "
                       f"{', '.join(known) or 'none yet'}")
        return key

    def _offloading(self, structure: str) -> None:
        names = [sc.name for sc in self.config.structures]
        if structure not in names:
            raise CQSError(Reason.UNKNOWN_STRUCTURE, f"no structure named {structure!r}; this "
                                                     f"daemon has {', '.join(names)}")
        if self.config.structure(structure).offload_rules is None:
            raise _bad(f"structure {structure} keeps no data sets (offload = \"none\")")

    def _keys(self, structure: str, owner: str | None, command: str) -> list[DataSetKey]:
        """One data set, or every activated data set of the structure."""
        if owner is not None:
            return [self._exists(self._key(structure, owner), command)]
        self._offloading(structure)
        return [k for k in self.datasets.open_sets.keys([structure])
                if self.states.state(k).status != Status.NOTFOUND]

    def _fire(self, key: DataSetKey, event: Event, words: str) -> None:
        """``fire``, a refusal being the operator's (another command may have changed
        the state while this one closed the data set)."""
        try:
            self.states.fire(key, event, words)
        except IllegalTransition as err:
            raise _bad(f"{words}: {err}") from None

    def _check(self, key: DataSetKey, events: list[Event], command: str) -> None:
        """Refuse, before anything changes, a command the data set's state does not
        allow (taken as it will be once the command has closed the data set)."""
        state = replace(self.states.state(key), conn=Conn.CLOSED)
        for event in events:
            try:
                state, _ = state.process(event)
            except IllegalTransition as err:
                now = self.states.state(key)
                raise _bad(f"{command}: the data set of {key[1]} in {key[0]} is {now.status}, "
                           f"ACCESS({now.access}): {err}") from None

    def _check_all(self, keys: list[DataSetKey], event: Event, command: str) -> None:
        for key in keys:
            self._check(key, [event], command)


def _choice(what: str, value: str | None, events: dict[str, Event]) -> Event | None:
    if value is None:
        return None
    if value not in events:
        raise _bad(f"reset-smds: {what} must be {' or '.join(events)}, not {value!r}")
    return events[value]


def _bad(message: str) -> CQSError:
    return CQSError(Reason.INVALID_REQUEST, message)
