"""Who may do what, through the SDK against a real daemon: every kind of denial gets
NOT_AUTHORIZED and a not_authorized event naming the client, the request and the
object; what the rights allow goes through."""

import hashlib
import os
import stat

import pytest

import cqsclient
from cqsclient.errors import NotAuthorized

SECRET = "s3cret"
DIGEST = hashlib.sha256(SECRET.encode()).hexdigest()
STRUCTURES = """
[[structure]]
name = "MSGQ01"
size = "4MiB"
overflow = "MSGQ01OV"

[[structure]]
name = "MSGQ01OV"
size = "1MiB"

[[structure]]
name = "EMHQ01"
size = "1MiB"
"""


def client(name: str, **keys: str) -> str:
    lines = "".join(f"{k} = {v}\n" for k, v in keys.items())
    return f'[[client]]\nname = "{name}"\nsecret_sha256 = "{DIGEST}"\n{lines}'


CLIENTS = (
    client("FRONT", structures='["MSGQ01"]', put_queues='["TRAN*"]',
           read_queues='["LTERM*", "REPLY"]')
    + client("BACK", structures='["MSGQ01"]', queues='["TRAN*", "LTERM*"]')
    + client("OPS", operator="true")
    + client("AUDIT", operator="true", structures='["EMHQ01"]')
)


@pytest.fixture(scope="module")
def daemon():
    from .harness import Daemon
    d = Daemon(structures=STRUCTURES, extra=CLIENTS).start()
    yield d
    d.cleanup()


def connect(daemon, name, **kw):
    return cqsclient.connect(daemon.address, client=name, secret=SECRET, **kw)


def denied(daemon, name, op, action, object_part):
    """``action`` fails with NotAuthorized, logged as not_authorized with this object."""
    before = daemon.mark()
    with pytest.raises(NotAuthorized) as err:
        action()
    assert err.value.reason == "NOT_AUTHORIZED"
    events = daemon.wait_for("not_authorized", after=before, op=op)
    assert object_part in events[-1]["object"], events[-1]
    assert events[-1]["client"].split(":")[0] == name
    return err.value


def test_rights_allow_what_they_list(daemon):
    """FRONT puts to TRAN* and reads LTERM*; BACK reads TRAN* and puts LTERM*: a round trip."""
    with connect(daemon, "FRONT") as front, connect(daemon, "BACK") as back:
        f, b = front.structure("MSGQ01"), back.structure("MSGQ01")
        f.put("TRANX", b"request")
        m = b.read("TRANX", wait=5)
        with b.unit_of_work() as uow:
            uow.put("LTERMZ", b"reply", qtype="LTERM")
            uow.delete(m.entry_id)
        assert f.read("LTERMZ", qtype="LTERM").data == b"reply"
        front.register_interest("MSGQ01", "LTERMZ", qtype="LTERM")
        assert list(f.browse("LTERMZ", "LTERM")) == []  # allowed; the reply is locked


def test_structures_outside_the_list_are_refused(daemon):
    """A structure the client may not use is refused for a handle, a put and a checkpoint
    (an overflow structure counts as its primary)."""
    with connect(daemon, "FRONT") as front, connect(daemon, "AUDIT") as audit:
        denied(daemon, "FRONT", "connect", lambda: front.structure("EMHQ01"), "EMHQ01")
        denied(daemon, "AUDIT", "checkpoint", lambda: audit.checkpoint("MSGQ01OV"), "MSGQ01OV")
        denied(daemon, "AUDIT", "query", lambda: audit.query("queues", "MSGQ01"), "MSGQ01")


def test_queues_outside_the_patterns_are_refused(daemon):
    """Put, read, browse (one queue or all), interest, move, unlock to a queue and a commit
    are each checked against the put or read patterns."""
    with connect(daemon, "FRONT") as front, connect(daemon, "BACK") as back:
        f, b = front.structure("MSGQ01"), back.structure("MSGQ01")
        denied(daemon, "FRONT", "put", lambda: f.put("LTERMZ", b"x", qtype="LTERM"),
               "put to queue LTERMZ")
        denied(daemon, "FRONT", "read", lambda: f.read("TRANX"), "read queue TRANX")
        denied(daemon, "FRONT", "browse", lambda: f.browse("TRANX"), "read queue TRANX")
        denied(daemon, "FRONT", "browse", lambda: f.browse(), "every queue")
        denied(daemon, "FRONT", "register_interest",
               lambda: front.register_interest("MSGQ01", "TRANX"), "read queue TRANX")
        eid = f.put("TRANA", b"to move")
        denied(daemon, "FRONT", "move", lambda: f.move(eid, "TRANB"), "read queue TRANA")
        denied(daemon, "BACK", "move", lambda: b.move(eid, "OTHER"), "put to queue OTHER")
        m = b.read("TRANA")
        denied(daemon, "BACK", "unlock", lambda: b.unlock(m.entry_id, queue="ELSEWHERE"),
               "put to queue ELSEWHERE")
        b.unlock(m.entry_id, queue="LTERMQ")  # allowed: BACK may put to LTERM*

        def commit():
            with f.unit_of_work() as uow:
                uow.put("TRANOK", b"fine")
                uow.put("PAYROLL", b"not fine")
        denied(daemon, "FRONT", "commit", commit, "put to queue PAYROLL")
        assert f.put("TRANOK", b"the commit put nothing") and len(b.browse("TRANOK")) == 1


def test_a_delete_reads_its_next_queue_only_if_the_rights_allow(daemon):
    """A delete whose ``next`` reads a queue outside the read patterns is refused whole:
    the message stays locked, undeleted; with a queue it may read, both go through."""
    with connect(daemon, "FRONT") as front, connect(daemon, "BACK") as back:
        f, b = front.structure("MSGQ01"), back.structure("MSGQ01")
        b.put("LTERMN", b"first", qtype="LTERM")
        b.put("LTERMN", b"second", qtype="LTERM")
        m = f.read("LTERMN", qtype="LTERM")
        denied(daemon, "FRONT", "delete", lambda: f.delete_and_read(m.entry_id, "TRANX"),
               "read queue TRANX")
        assert [x.data for x in b.browse("LTERMN", "LTERM")] == [b"second"]  # first: locked
        [second] = f.delete_and_read(m.entry_id, "LTERMN", qtype="LTERM")
        assert second.data == b"second"
        with pytest.raises(cqsclient.errors.EntryNotFound):
            f.delete(m.entry_id)


def test_operator_requests_need_the_operator_right(daemon):
    """Every operator request, and an operator session, is refused to a client without
    operator = true; OPS may run them."""
    with connect(daemon, "BACK") as back:
        s = back.structure("MSGQ01")
        eid = s.put("TRANOP", b"x")
        for op, action in [
            ("query", lambda: back.query("structures")),
            ("checkpoint", lambda: back.checkpoint("MSGQ01")),
            ("recover", lambda: back.recover("MSGQ01")),
            ("alter", lambda: back.alter("MSGQ01", 4 * 1024 * 1024)),
            ("rebuild", lambda: back.rebuild("MSGQ01")),
            ("delete_structure", lambda: back.delete_structure("MSGQ01")),
            ("dequeue", lambda: s.dequeue("TRANOP")),
            ("requeue", lambda: s.requeue(eid)),
            ("delete", lambda: s.operator_delete(eid)),
        ]:
            denied(daemon, "BACK", op, action, "operator requests")
    denied(daemon, "BACK", "register", lambda: connect(daemon, "BACK", operator=True),
           "may not open an operator session")
    with connect(daemon, "OPS", operator=True) as ops:
        assert {r["name"] for r in ops.query("structures")} >= {"MSGQ01", "EMHQ01"}
        assert ops.structure("MSGQ01").dequeue("TRANOP") == 1


def test_registration_is_refused_and_logged(daemon):
    """A wrong secret and an unknown name are refused, each with a not_authorized event."""
    before = daemon.mark()
    with pytest.raises(NotAuthorized):
        cqsclient.connect(daemon.address, client="FRONT", secret="wrong")
    with pytest.raises(NotAuthorized):
        cqsclient.connect(daemon.address, client="NOBODY", secret=SECRET)
    assert len(daemon.wait_for("not_authorized", 2, after=before, op="register")) == 2


def test_socket_mode_and_group_let_other_users_connect(make_daemon):
    """socket_mode and socket_group give the Unix socket the bits and group asked for."""
    group = os.getgid()
    d = make_daemon(f'socket_mode = 0o660\nsocket_group = "{group}"').start()
    st = os.stat(d.socket)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == group
