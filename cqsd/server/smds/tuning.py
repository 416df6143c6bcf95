"""What ``alter-smds`` overrides of a data set's definition: the buffers it asks
of its structure's pool, and whether it may expand; and the pools themselves,
one per structure, sized by what its data sets ask for (docs/smds.md)."""

from ...smds import BufferPool
from ..liveconfig import LiveConfig
from .availability import Availability, DataSetKey


class Tuning:
    def __init__(self, config: LiveConfig, states: Availability) -> None:
        self.config = config
        self.states = states
        self._pools: dict[str, BufferPool] = {}

    def dsexpand(self, key: DataSetKey) -> bool:
        """Whether the data set may expand: its alter-smds override, else the structure's."""
        override = self.states.record(key).get("dsexpand")
        return override == "YES" if override else self.config.structure(key[0]).dsexpand

    def dsbufs(self, key: DataSetKey) -> int:
        """The buffers the data set asks of its structure's pool: its override, else the
        structure's dsbufs."""
        return self.states.record(key).get("dsbufs") or self.config.structure(key[0]).dsbufs

    def pool(self, structure: str) -> BufferPool:
        """The structure's buffer pool, holding the most buffers any of its data sets
        asks for (one pool serves every read of the structure)."""
        sc = self.config.structure(structure)
        want = max([sc.dsbufs, *(self.dsbufs(k) for k in self.states.known(structure))])
        pool = self._pools.get(structure)
        if pool is None:
            pool = self._pools[structure] = BufferPool(want, sc.dsblock)
        elif pool.statistics().buffers != want:
            pool.resize(want)
        return pool
