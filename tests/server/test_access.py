"""Who may do what, as a pure function: every op is classified, rights allow what they
list and name what they refuse; registration checks secrets, certificates and the
operator right."""

import hashlib

import pytest

from cqsd.config import loads
from cqsd.engine import CQSError
from cqsd.server.access import (
    APPLICATION_OPS,
    OPERATOR_OPS,
    Access,
    Patterns,
    Rights,
    denied,
    is_operator_session,
)
from cqsproto.requests import OPS

DIGEST = hashlib.sha256(b"pw").hexdigest()
RIGHTS = Rights(frozenset({"MSGQ01"}), Patterns(["TRAN*", "EXACT"]), Patterns(["LTERM*"]),
                operator=False)
OVERFLOW = {"MSGQ01OV": "MSGQ01"}


def check(op, rights=RIGHTS, queue_of=lambda s, e: "TRANA", **args):
    return denied(rights, op, {"structure": "MSGQ01", **args}, queue_of, OVERFLOW)


def test_every_op_is_classified_once():
    """Each op of the protocol is an application op or an operator request, not both: a
    new op must be placed before it can pass this test."""
    assert set(OPS) == APPLICATION_OPS | OPERATOR_OPS
    assert not APPLICATION_OPS & OPERATOR_OPS


def test_patterns_match_names_and_prefixes():
    """A pattern is a name or a prefix ending in *; * alone is every queue."""
    p = Patterns(["TRAN*", "EXACT"])
    assert "TRANX" in p and "TRAN" in p and "EXACT" in p
    assert "EXACTLY" not in p and "LTERM" not in p and not p.every
    assert Patterns(["*"]).every and "ANY" in Patterns(["*"])


def test_rights_allow_what_they_list():
    """Puts to TRAN*, reads of LTERM*, moves from a readable queue to a puttable one."""
    assert check("put", queue="TRANX") is None
    assert check("read", queue="LTERMZ") is None
    assert check("move", entry_id=1, queue="TRANB", queue_of=lambda s, e: "LTERMQ") is None
    assert check("delete", entry_id=1, operator=False) is None
    assert check("delete", entry_id=1, operator=False, next={"queue": "LTERMQ"}) is None
    assert check("delete", entry_id=1, next={"queue": 5}) is None  # the handler refuses it
    assert check("commit", ops=[{"op": "put", "queue": "EXACT"}, {"op": "delete",
                                                                   "entry_id": 2}]) is None
    assert check("move", entry_id=9, queue="TRANB", queue_of=lambda s, e: None) is None


@pytest.mark.parametrize(("op", "args", "named"), [
    ("put", {"queue": "LTERMZ"}, "put to queue LTERMZ"),
    ("read", {"queue": "TRANX"}, "read queue TRANX"),
    ("browse", {"queue": None}, "every queue"),
    ("register_interest", {"queue": "TRANX"}, "read queue TRANX"),
    ("move", {"entry_id": 1, "queue": "LTERMZ"}, "read queue TRANA"),
    ("unlock", {"entry_id": 1, "queue": "ELSE"}, "put to queue ELSE"),
    ("commit", {"ops": [{"op": "put", "queue": "TRANX"}, {"op": "move", "entry_id": 3,
                                                          "queue": "TRANY"}]},
     "read queue TRANA"),
    ("query", {"kind": "status"}, "operator requests"),
    ("delete", {"entry_id": 1, "operator": True}, "operator requests"),
    ("delete", {"entry_id": 1, "next": {"queue": "TRANX", "n": 5}}, "read queue TRANX"),
    ("checkpoint", {}, "operator requests"),
])
def test_rights_name_what_they_refuse(op, args, named):
    """Each refusal names its object, as the not_authorized event does."""
    assert named in check(op, **args)


def test_structures_are_checked_by_their_primary():
    """An overflow structure counts as its primary; another structure is refused."""
    assert check("put", queue="TRANX", structure="EMHQ01") == "structure EMHQ01"
    operator = Rights(frozenset({"MSGQ01"}), None, None, operator=True)
    assert check("checkpoint", rights=operator, structure="MSGQ01OV") is None


CONFIG = """
[[structure]]
name = "MSGQ01"
size = "1MiB"
[[client]]
name = "APP"
secret_sha256 = "{d}"
queues = ["TRAN*"]
[[client]]
name = "OPS"
secret_sha256 = "{d}"
operator = true
tls_cn = "ops.example"
""".format(d=DIGEST)


def test_registration_checks_secret_certificate_and_operator_right():
    """A listed client registers with its secret; an operator session needs the right; a
    client certificate must name the client when client certificates are asked for."""
    access = Access(loads(CONFIG))
    assert access.authenticate("OPS", "pw", False, None, operator=True) is None  # all rights
    assert access.authenticate("APP", "pw", False, None, operator=False).put.text == "TRAN*"
    for client, secret, operator in (("APP", "bad", False), ("NOBODY", "pw", False),
                                     ("APP", "pw", True)):
        with pytest.raises(CQSError):
            access.authenticate(client, secret, False, None, operator)
    access.client_ca = True
    assert access.authenticate("OPS", "pw", True, "ops.example", operator=True) is None
    with pytest.raises(CQSError):
        access.authenticate("OPS", "pw", True, "OPS", operator=True)


def test_no_clients_listed_means_everything_over_the_unix_socket():
    """Without [[client]], anyone registers over the Unix socket with every right, and
    nobody over TCP."""
    access = Access(loads('[[structure]]\nname = "S"\nsize = "1MiB"\n'))
    assert access.authenticate("ANY", None, False, None, operator=True) is None
    with pytest.raises(CQSError):
        access.authenticate("ANY", None, True, None, operator=False)


def test_operator_session_owners_are_marked():
    """An operator session's lock owner carries a mark no client name can."""
    assert is_operator_session("OPS:12") and not is_operator_session("OPS")


def test_a_typed_pattern_matches_its_type_alone():
    """``LTERM:REPLY*`` allows REPLY1 of type LTERM (by number or name), not of TRAN;
    plain patterns still match every type; a move's source is judged by its type too."""
    typed = Patterns(["LTERM:REPLY*", "USER1:EXACT", "TRAN*"])
    assert typed.allows("REPLY1", "LTERM") and typed.allows("REPLY1", 5)
    assert not typed.allows("REPLY1", "TRAN") and not typed.allows("REPLY1", None)
    assert typed.allows("EXACT", "USER1") and not typed.allows("EXACTLY", "USER1")
    assert typed.allows("TRANX", "APPC") and not typed.allows("REPLY1", "NOSUCH")
    rights = Rights(None, typed, typed, False)
    assert check("put", rights=rights, queue="REPLY1", qtype="LTERM") is None
    assert "allowed queue names: LTERM:REPLY*" in check("put", rights=rights, queue="REPLY1",
                                                        qtype="TRAN")
    from_lterm, from_tran = (lambda s, e: (5, "REPLY1")), (lambda s, e: (1, "REPLY1"))
    assert check("move", rights=rights, entry_id=1, queue="TRANB", qtype="TRAN",
                 queue_of=from_lterm) is None
    assert check("move", rights=rights, entry_id=1, queue="TRANB", qtype="TRAN",
                 queue_of=from_tran) is not None
    commit = [{"op": "put", "queue": "REPLY1", "qtype": "LTERM", "data": b"x"},
              {"op": "put", "queue": "REPLY2", "data": b"y"}]  # TRAN by default: refused
    assert "REPLY2" in check("commit", rights=rights, ops=commit)
