"""Who may do what: registration (names, secrets, client certificates, operator
sessions) and the rights of each registered client, checked before every request.

Design note. With no ``[[client]]`` in the config every client may do
everything (the Unix socket's mode is the protection, as before). Once clients
are listed, each has rights: the structures it may use, the queue-name
patterns it may put to and read from, and whether it may run operator
requests. A session carries its client's ``Rights`` (None: unrestricted, the
fast path: one comparison a request); SIGHUP replaces them (reload.py).

Requests are classified once, here: ``APPLICATION_OPS`` are what an
application does with messages, every other op is an operator request. A new
op is therefore an operator request until it is listed (a test checks every
op is classified). Reading covers ``read``, ``browse``, ``register_interest``
and a ``delete``'s ``next``; a ``move`` reads its message's queue and puts to
the target; an unlock to another queue puts there; a commit is checked op by op.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import pwd
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from ..config import ClientConfig, Config
from ..engine import CQSError, QueueType, Reason, parse_qtype

log = structlog.get_logger()

APPLICATION_OPS = frozenset({
    "register", "deregister", "connect", "put", "read", "browse", "delete", "move", "unlock",
    "commit", "register_interest", "deregister_interest", "renew", "ping",
})
OPERATOR_OPS = frozenset({
    "query", "requeue", "dequeue", "checkpoint", "recover", "alter", "rebuild",
    "delete_structure", "reset_smds", "start_smdsconn", "stop_smdsconn", "alter_smds",
    "fail_structure", "move_structure",
})
READS = frozenset({"read", "browse", "register_interest"})
OPERATOR_MARK = ":"  # in an operator session's owner name; no client name holds one


class Patterns:
    """Queue-name patterns: names, and prefixes written with a trailing ``*``, of any
    queue type; or, written ``TYPE:PATTERN`` ("LTERM:REPLY*"), of that type alone."""

    __slots__ = ("exact", "prefixes", "text", "typed")

    def __init__(self, patterns: Iterable[str]) -> None:
        patterns = tuple(patterns)
        self.text = ",".join(patterns) or "none"
        by_type: dict[int, list[str]] = {}
        plain = []
        for p in patterns:
            qtype, colon, rest = p.partition(":")
            if colon and qtype in QueueType.__members__:
                by_type.setdefault(int(QueueType[qtype]), []).append(rest)
            else:
                plain.append(p)
        self.exact = frozenset(p for p in plain if not p.endswith("*"))
        self.prefixes = tuple(p[:-1] for p in plain if p.endswith("*"))
        self.typed = {t: Patterns(names) for t, names in by_type.items()}

    def __contains__(self, name: str) -> bool:
        return name in self.exact or name.startswith(self.prefixes)

    def allows(self, name: str, qtype: object = None) -> bool:
        """Whether queue ``name`` of type ``qtype`` (a number or name as a request
        gives it; None when unknown, which only untyped patterns match) is covered."""
        if name in self:
            return True
        if not self.typed or qtype is None:
            return False
        try:
            typed = self.typed.get(int(parse_qtype(qtype)))
        except CQSError:  # the handler refuses the type itself
            return False
        return typed is not None and name in typed

    @property
    def every(self) -> bool:
        return "" in self.prefixes


@dataclass(frozen=True)
class Rights:
    """What one client may do; None in a field means no restriction."""

    structures: frozenset[str] | None
    put: Patterns | None
    read: Patterns | None
    operator: bool

    @classmethod
    def of(cls, c: ClientConfig) -> Rights | None:
        """The rights of a configured client; None if it may do everything."""
        if c.operator and c.structures is None and c.put_queues is None and c.read_queues is None:
            return None
        return cls(None if c.structures is None else frozenset(c.structures),
                   None if c.put_queues is None else Patterns(c.put_queues),
                   None if c.read_queues is None else Patterns(c.read_queues), c.operator)


# (structure, entry id) -> its queue, as (type, name) or its name alone, if it exists
QueueOf = Callable[[str, int], "tuple[int, str] | str | None"]


def denied(rights: Rights, op: str, args: Mapping[str, Any], queue_of: QueueOf,
           overflow_of: Mapping[str, str]) -> str | None:
    """What ``rights`` do not allow of request ``op`` (its object, as the log names
    it), or None if they allow it all. Pure: ``queue_of`` looks a message up."""
    structure = args.get("structure")
    if structure is not None and rights.structures is not None:
        # a recover names a list of structures (cqsproto/requests.py)
        for name in structure if isinstance(structure, list) else [structure]:
            if not isinstance(name, str) or overflow_of.get(name, name) not in rights.structures:
                return f"structure {name}"
    if op == "delete" and args.get("next") is not None:
        why = _next(rights, args["next"])
        if why is not None:
            return why
    if op not in APPLICATION_OPS or (op == "delete" and args.get("operator")):
        return None if rights.operator else "operator requests"
    if op == "put":
        return _queue(rights.put, "put to", args["queue"], args.get("qtype"))
    if op in READS:
        queue = args["queue"]
        if queue is None:  # a browse of the whole structure
            return None if rights.read is None or rights.read.every else "every queue"
        return _queue(rights.read, "read", queue, args.get("qtype"))
    if op == "move":
        # move and commit require the field (cqsproto/requests.py)
        return _move(rights, args["structure"], args["entry_id"], args["queue"], queue_of,
                     args.get("qtype"))
    if op == "unlock" and args.get("queue") is not None:
        return _queue(rights.put, "put to", args["queue"], args.get("qtype"))
    if op == "commit":
        return _commit(rights, args["structure"], args["ops"], queue_of)
    return None


def _queue(patterns: Patterns | None, verb: str, queue: str,
           qtype: object = None) -> str | None:
    if patterns is None or patterns.allows(queue, qtype):
        return None
    # a plain pattern matches names of any type: "LTERM*" allows LTERMX, not REPLY1 of
    # type LTERM, which "LTERM:REPLY*" allows
    return f"{verb} queue {queue} (allowed queue names: {patterns.text})"


def _next(rights: Rights, read: Any) -> str | None:
    """A delete's ``next`` reads its queue (a malformed one: the handler refuses it)."""
    queue = read.get("queue") if isinstance(read, dict) else None
    return (_queue(rights.read, "read", queue, read.get("qtype", "TRAN"))
            if isinstance(queue, str) else None)


def _move(rights: Rights, structure: str, entry_id: int, target: str,
          queue_of: QueueOf, qtype: object = "TRAN") -> str | None:
    read = rights.read
    if read is not None:
        found = queue_of(structure, entry_id)
        source_type, source = found if isinstance(found, tuple) else (None, found)
        if source is not None and not read.allows(source, source_type):
            return f"read queue {source} (entry {entry_id}; allowed queue names: {read.text})"
    return _queue(rights.put, "put to", target, qtype)


def _commit(rights: Rights, structure: str, ops: Any, queue_of: QueueOf) -> str | None:
    for op in ops if isinstance(ops, list) else ():
        if not isinstance(op, dict):
            continue  # the handler refuses it
        kind, queue = op.get("op"), op.get("queue")
        if kind == "put" and isinstance(queue, str):
            why = _queue(rights.put, "put to", queue, op.get("qtype", "TRAN"))
        elif kind == "move" and isinstance(queue, str) and type(op.get("entry_id")) is int:
            why = _move(rights, structure, op["entry_id"], queue, queue_of,
                        op.get("qtype", "TRAN"))
        elif kind == "unlock" and isinstance(queue, str):
            why = _queue(rights.put, "put to", queue, op.get("qtype"))
        else:
            why = None
        if why is not None:
            return why
    return None


class Access:
    """The clients the config lists and their rights; ``reload`` swaps them."""

    def __init__(self, config: Config) -> None:
        self.reload(config)

    def reload(self, config: Config) -> None:
        self.operator_uids = _uids(config.daemon.operator_users)
        self.clients = {c.name: c for c in config.clients}
        self.rights = {c.name: Rights.of(c) for c in config.clients}
        self.overflow_of = {sc.overflow: sc.name for sc in config.structures if sc.overflow}
        self.client_ca = bool(config.daemon.tls_client_ca)

    def authenticate(self, client: str, secret: str | None, over_tcp: bool,
                     cert_cn: str | None, operator: bool, peer_uid: int | None = None,
                     peer: str = "") -> Rights | None:
        """The rights ``client`` registers with; NOT_AUTHORIZED (logged with the peer)
        says why not. An operator session that gives no secret, from a user of
        ``operator_users`` over the Unix socket, needs none: the kernel vouches for
        its user (SO_PEERCRED). A secret given says who the client is, and is checked."""
        if operator and secret is None and self._peer_operator(peer_uid):
            return None
        refuse = functools.partial(_refuse, peer=peer)
        if not self.clients:
            if over_tcp:
                raise refuse(client, "registration over TCP needs a configured client")
            return None
        c = self.clients.get(client)
        digest = hashlib.sha256(secret.encode()).hexdigest() if secret is not None else ""
        if c is None or not hmac.compare_digest(digest, c.secret_sha256):
            raise refuse(client, f"client {client} is not authorized with that secret")
        if over_tcp and self.client_ca and cert_cn != (c.tls_cn or c.name):
            raise refuse(client, f"the client certificate (CN={cert_cn}) is not "
                                  f"{client}'s (CN={c.tls_cn or c.name})")
        if operator and not c.operator:
            raise refuse(client, f"client {client} may not open an operator session "
                                  "(operator = false)")
        return self.rights[client]

    def rights_for(self, client: str, operator: bool,
                   peer_uid: int | None = None) -> Rights | None:
        """The rights a registered ``client`` has now (after a reload); NOT_AUTHORIZED
        if it is no longer listed, or its operator session no longer allowed."""
        if operator and self._peer_operator(peer_uid) and client not in self.clients:
            return None  # admitted by its peer credentials
        if not self.clients:
            return None
        c = self.clients.get(client)
        if c is None:
            raise CQSError(Reason.NOT_AUTHORIZED, f"client {client} is no longer configured")
        if operator and not c.operator:
            raise CQSError(Reason.NOT_AUTHORIZED, f"client {client} may no longer run "
                                                  "operator sessions")
        return self.rights[client]

    def _peer_operator(self, peer_uid: int | None) -> bool:
        return peer_uid is not None and peer_uid in self.operator_uids

    def check(self, session: Any, op: str, args: Mapping[str, Any], queue_of: QueueOf) -> None:
        """Raise NOT_AUTHORIZED (and log it) if ``session`` may not run this request."""
        rights = session.rights
        if rights is None:
            return
        why = denied(rights, op, args, queue_of, self.overflow_of)
        if why is not None:
            log.warning("not_authorized", client=session.client, peer=session.peer, op=op,
                        object=why)
            raise CQSError(Reason.NOT_AUTHORIZED, f"{op}: client {session.client} may not "
                                                  f"use {why}")


def _refuse(client: str, why: str, peer: str = "") -> CQSError:
    log.warning("not_authorized", client=client, peer=peer, op="register", object=why)
    return CQSError(Reason.NOT_AUTHORIZED, why)


def _uids(users: tuple[str, ...]) -> frozenset[int]:
    """The uids of ``users`` (names or numbers); a name this host lacks is left out."""
    uids = set()
    for user in users:
        if user.isdigit():
            uids.add(int(user))
            continue
        try:
            uids.add(pwd.getpwnam(user).pw_uid)
        except KeyError:
            pass
    return frozenset(uids)


def is_operator_session(owner: str) -> bool:
    """Whether a lock owner is an operator session (it never comes back for its locks)."""
    return OPERATOR_MARK in owner
