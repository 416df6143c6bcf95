"""Registered clients (clients.py): one connection holds a name at a time, within
max_clients; a client that drops gets resync_grace to come back before its
locks go back to their queues, through the runtime's settle. Sessions are
unsocketed and the structures real, without a data directory."""

import pytest
import trio

from cqsd.config import loads
from cqsd.engine import CQSError, QueueType, Reason
from cqsd.server.clients import Clients
from cqsd.server.liveconfig import LiveConfig
from cqsd.server.registry import Registry
from cqsd.server.runtime import Runtime

from .conftest import unsocketed

CONFIG = """
[daemon]
max_clients = 2
resync_grace = {grace}
[[structure]]
name = "MSGQ01"
size = "16MiB"
"""


def rooms(grace=10):
    config = LiveConfig(loads(CONFIG.format(grace=grace)))
    registry = Registry(config)
    runtime = Runtime()
    return Clients(config, registry, runtime), registry, runtime


def register(clients, journal, name, **kw):
    session = unsocketed(journal)
    clients.register(session, name, None, False, **kw)
    return session


def test_a_name_is_held_by_one_connection(journal):
    """A second registration of a held name is refused CLIENT_ACTIVE."""
    clients, _, _ = rooms()
    register(clients, journal, "A")
    with pytest.raises(CQSError) as err:
        register(clients, journal, "A")
    assert err.value.reason == Reason.CLIENT_ACTIVE


def test_max_clients_counts_applications_not_operators(journal):
    """Past max_clients an application is refused CLIENT_LIMIT; an operator
    session takes no slot."""
    clients, _, _ = rooms()
    register(clients, journal, "A")
    register(clients, journal, "B")
    register(clients, journal, "OPER", operator=True)
    with pytest.raises(CQSError) as err:
        register(clients, journal, "C")
    assert err.value.reason == Reason.CLIENT_LIMIT and clients.operators == 1


async def test_a_dropped_clients_locks_go_back_after_its_grace(journal, nursery, autojump_clock):
    """A connection lost with a lock: the lock stays for resync_grace, then goes back
    to its queue as a failed delivery, and the change is settled."""
    clients, registry, runtime = rooms()
    settled = []
    runtime.bind(nursery, lambda: settled.append(1) or 0, journal)
    pair = registry.pairs["MSGQ01"]
    pair.put(QueueType.TRAN, "Q", b"m")
    session = register(clients, journal, "A")
    entry = pair.read("A", QueueType.TRAN, "Q")
    clients.connection_lost(session, shutting_down=False)
    await trio.sleep(9)
    assert pair.client_stats() == {"A": 1} and settled == []
    await trio.sleep(2)
    assert pair.client_stats() == {} and settled == [1]
    assert [e.entry_id for e in pair.browse(QueueType.TRAN, "Q")[0]] == [entry.entry_id]


async def test_a_client_back_within_its_grace_keeps_its_locks(journal, nursery, autojump_clock):
    """Registering again within resync_grace cancels peer recovery: its locks are
    resynced to it."""
    clients, registry, runtime = rooms()
    runtime.bind(nursery, lambda: 0, journal)
    pair = registry.pairs["MSGQ01"]
    pair.put(QueueType.TRAN, "Q", b"m")
    session = register(clients, journal, "A")
    pair.read("A", QueueType.TRAN, "Q")
    clients.connection_lost(session, shutting_down=False)
    await trio.sleep(5)
    back = unsocketed(journal)
    locks, _ = clients.register(back, "A", None, False)
    await trio.sleep(10)
    assert len(locks) == 1 and pair.client_stats() == {"A": 1}
