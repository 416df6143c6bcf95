"""What the SMDS displays show of each data set: ``display smds``, ``display usage
--type smds``, ``display cfstatus --type smds`` and ``display smdsconn``
(docs/smds.md). Only activated data sets are shown: NOTFOUND ones are not
(seed 000)."""

from typing import Any

from ...smds.states import Conn, Status
from ..liveconfig import LiveConfig
from .availability import Availability, DataSetKey
from .opened import OpenDataSets
from .tuning import Tuning


class Displays:
    def __init__(self, config: LiveConfig, states: Availability, tuning: Tuning,
                 opened: OpenDataSets) -> None:
        self.config = config
        self.states = states
        self.tuning = tuning
        self.opened = opened

    def rows(self, structure: str | None) -> list[dict[str, Any]]:
        """One row per activated data set: `display smds` and `display usage --type smds`."""
        return [self.row(k) for k in self._activated(structure)]

    def cfstatus(self, structure: str | None) -> list[dict[str, Any]]:
        """`display cfstatus --type smds`: each activated data set's shared state."""
        return [self.cfstatus_row(k) for k in self._activated(structure)]

    def smdsconn(self, structure: str | None) -> list[dict[str, Any]]:
        """`display smdsconn`: the daemon's connection to each activated data set."""
        return [self.smdsconn_row(k) for k in self._activated(structure)]

    def _activated(self, structure: str | None) -> list[DataSetKey]:
        return [k for k in self.states.known(structure)
                if self.states.state(k).status != Status.NOTFOUND]

    def row(self, key: DataSetKey) -> dict[str, Any]:
        state = self.states.state(key)
        dataset = self.opened.open.get(key)
        if dataset is not None and dataset.space is not None:
            size, used = dataset.size, dataset.space.usage().used_percent
        else:
            size, used = self.opened.last.get(key, (0, 0.0))
        pool = self.tuning.pool(key[0]).statistics()
        return {
            "structure": key[0], "owner": key[1], "size": size,
            "used_percent": round(used, 2), "dsblock": self.config.structure(key[0]).dsblock,
            "dsbufs": self.tuning.dsbufs(key), "dsexpand": self.tuning.dsexpand(key),
            "status": str(state.status), "access": str(state.access),
            "buffers": pool.buffers, "lru_hit_percent": round(pool.lru_hit_percent, 2),
            "waits": pool.waits, "lowest_free": pool.lowest_free, "available": state.usable,
        }

    def cfstatus_row(self, key: DataSetKey) -> dict[str, Any]:
        state, record = self.states.state(key), self.states.record(key)
        return {"structure": key[0], "owner": key[1], "status": str(state.status),
                "access": str(state.access), "rcvtime": record.get("rcvtime"),
                "failtime": record.get("failtime")}

    def smdsconn_row(self, key: DataSetKey) -> dict[str, Any]:
        state = self.states.state(key)
        return {"structure": key[0], "owner": key[1], "status": str(state.conn),
                "avail": str(state.avail),
                "openmode": "UPDATE" if state.conn == Conn.OPEN else "NONE"}
