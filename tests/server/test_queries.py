"""Query kinds have one home on the daemon's side (queries.KINDS), as the ops'
handlers do (handlers.HANDLERS): each kind answers rows, an unknown one is
refused naming the kinds there are, and cqsctl offers the same kinds."""

import pytest

from cqsclient.ctl import QUERY_KINDS
from cqsd.engine import CQSError, Reason
from cqsd.server import queries
from cqsd.server.handlers import HANDLERS
from cqsproto import requests

from .test_dispatch import config, daemon, put, register  # noqa: F401 - fixtures


def test_cqsctl_displays_the_kinds_the_daemon_answers():
    """cqsctl display offers every kind but status, which is a command of its own."""
    assert set(QUERY_KINDS) | {"status"} == set(queries.KINDS)


def test_every_op_has_its_handler_in_the_one_table():
    """The handler table names a handler for each op of the protocol, and no other."""
    assert set(HANDLERS) == set(requests.OPS)
    assert all(fn.__name__ == f"op_{op}" for op, fn in HANDLERS.items())


@pytest.mark.parametrize("kind", sorted(queries.KINDS))
async def test_every_kind_answers_rows(daemon, register, kind):  # noqa: F811
    """Each kind gives a list of rows (maps) for the whole daemon."""
    session, _ = register("A")
    put(daemon, session)
    rows = queries.rows(daemon.rooms, kind, None)
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)


async def test_a_kind_over_one_structure(daemon, register):  # noqa: F811
    """queues of one structure lists its queue with the message put; an unknown
    structure is refused with UNKNOWN_STRUCTURE."""
    session, _ = register("A")
    put(daemon, session, queue="ONE")
    [row] = [r for r in queries.rows(daemon.rooms, "queues", "MSGQ01") if r["queue"] == "ONE"]
    assert (row["structure"], row["depth"]) == ("MSGQ01", 1)
    with pytest.raises(CQSError) as err:
        queries.rows(daemon.rooms, "queues", "NOPE")
    assert err.value.reason == Reason.UNKNOWN_STRUCTURE


async def test_an_unknown_kind_is_refused_naming_the_kinds(daemon):  # noqa: F811
    """A kind the daemon does not have is INVALID_REQUEST, listing those it has."""
    with pytest.raises(CQSError) as err:
        queries.rows(daemon.rooms, "everything", None)
    assert err.value.reason == Reason.INVALID_REQUEST
    assert all(kind in err.value.message for kind in queries.KINDS)
