"""The configuration the daemon runs with now, held in one place.

Design note. Every room that reads the config (the limits of a connection,
the grace of a dropped client, the volume that triggers a checkpoint) holds
this one object and reads through it at the moment it needs a value, so a
SIGHUP reload (reload.py) that installs a new config here changes it for all
of them at once; none keeps a copy of its own. It reads as a ``Config`` does
(``daemon``, ``structures``, ``clients``, ``structure(name)``);
``current`` is the ``Config`` itself, for code outside the server that takes
one.
"""

from ..config import ClientConfig, Config, DaemonConfig, GroupConfig, StructureConfig


class LiveConfig:
    __slots__ = ("current",)

    def __init__(self, config: Config) -> None:
        self.current = config

    def install(self, config: Config) -> None:
        """From now on every room reads ``config`` (a reload's merged config)."""
        self.current = config

    @property
    def daemon(self) -> DaemonConfig:
        return self.current.daemon

    @property
    def structures(self) -> tuple[StructureConfig, ...]:
        return self.current.structures

    @property
    def clients(self) -> tuple[ClientConfig, ...]:
        return self.current.clients

    @property
    def group(self) -> GroupConfig | None:
        return self.current.group

    def structure(self, name: str) -> StructureConfig:
        return self.current.structure(name)

    def client(self, name: str) -> ClientConfig:
        return self.current.client(name)
