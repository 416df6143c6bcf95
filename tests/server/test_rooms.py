"""The rooms are declared once (rooms.py) and read the config from one place
(liveconfig.py): a reload installs the new config there, and every room sees it.

The daemon runs in-process as in test_dispatch.py."""

import dataclasses

import pytest

from cqsd.server import reload
from cqsd.server.liveconfig import LiveConfig
from cqsd.server.rooms import Rooms

from .test_dispatch import config, daemon, register  # noqa: F401 - fixtures


def holders(d):
    """Every room of the daemon that reads the config."""
    rooms = d.rooms
    return [rooms.clients, rooms.registry, rooms.checkpoints, rooms.operations,
            rooms.smds_commands, rooms.datasets, d.connections, rooms.datasets.tuning,
            rooms.datasets.space, rooms.datasets.open_sets, rooms.datasets.displays]


async def test_every_room_reads_the_one_live_config(daemon):  # noqa: F811
    """No room holds a copy of the config: each holds the daemon's one LiveConfig."""
    assert all(room.config is daemon.rooms.config for room in holders(daemon))


async def test_a_reload_changes_the_config_once_for_every_room(daemon, tmp_path):  # noqa: F811
    """Installing a reloaded config changes what every room reads, from then on."""
    old = daemon.rooms.config.current
    new = dataclasses.replace(old, daemon=dataclasses.replace(old.daemon, resync_grace=7.5))
    reload._install(daemon.rooms, new)
    assert daemon.rooms.config.current is new
    assert {room.config.daemon.resync_grace for room in holders(daemon)} == {7.5}


async def test_the_rooms_record_cannot_be_rebound(daemon):  # noqa: F811
    """The record is made once: a room cannot be swapped for another afterwards."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        daemon.rooms.registry = None


async def test_a_handler_gets_the_rooms_not_the_daemon(daemon, register):  # noqa: F811
    """What a request may use is the Rooms record: the dispatcher holds it, and
    the status it reports reads it (the life of the daemon included)."""
    from cqsd.server import status

    assert isinstance(daemon.dispatcher.rooms, Rooms)
    register("A")
    snapshot = status.snapshot(daemon.rooms)
    assert snapshot["state"] == "ready" and snapshot["clients"] == 1
    assert snapshot["connections"] == len(daemon.rooms.sessions)


def test_the_live_config_reads_as_the_config_it_holds(tmp_path, tmp_path_factory):
    """daemon, structures, clients and structure(name) are the current config's."""
    c = config(tmp_path, tmp_path_factory)
    live = LiveConfig(c)
    assert (live.daemon, live.structures, live.clients) == (c.daemon, c.structures, c.clients)
    assert live.structure("MSGQ01") is c.structure("MSGQ01")
    other = dataclasses.replace(c, daemon=dataclasses.replace(c.daemon, max_clients=3))
    live.install(other)
    assert live.daemon.max_clients == 3 and live.current is other
