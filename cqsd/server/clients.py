"""Registered clients: who may register, the interests they registered, and
peer recovery of the locks of a client that drops without deregistering.

A client is a name held by one connection at a time (an IMS subsystem, an MQ
queue manager). When its connection drops, its locked messages wait
``resync_grace`` seconds for it to come back and resync them; then they go
back to their queues as failed deliveries, as CQS returns a failed member's
work. Locks a restart of the daemon finds wait the same, but go back as they
were: the daemon stopping was no failure of the client's, and must not push
its messages toward the suspend queue; until their holder registers again
(``held_over``), a lease of theirs that ends goes back the same way. A cold
start instead moves them to the cold queue for the operator. A client's
registration and interests outlive its connection and the daemon
(registrations.py): registering warm again, it finds them.
"""

import hmac
import secrets

import structlog
import trio

from cqsproto import CLIENT_NAME, CLIENT_NAME_RULE, encode_frame

from ..engine import CQSError, QueueType, Reason, StructurePair
from . import wire
from .access import OPERATOR_MARK, Access, is_operator_session
from .liveconfig import LiveConfig
from .registrations import Interest, Registrations
from .registry import Registry
from .runtime import Runtime
from .session import Session

log = structlog.get_logger()


class Clients:
    def __init__(self, config: LiveConfig, registry: Registry, runtime: Runtime,
                 registrations: Registrations | None = None) -> None:
        self.config = config
        self.registry = registry
        self.runtime = runtime
        self.registrations = registrations or Registrations()
        self.sessions: dict[str, Session] = {}  # the connection each registered name holds
        self.pending: dict[str, trio.CancelScope] = {}  # grace timers of dropped clients
        self.tokens: dict[str, str] = {}  # the takeover token of each registered name
        self.interest: dict[Interest, set[Session]] = {}
        self.access = Access(config.current)
        self.operators = 0  # operator sessions among ``sessions``: they take no client slot
        # clients whose locks a restart found, until they register again or peer
        # recovery ends them: their leases' expiries are no failed deliveries
        self.held_over: set[str] = set()

    # -- registration ------------------------------------------------------------

    def register(self, session: Session, client: str, secret: str | None, cold: bool,
                 operator: bool = False, takeover: str | None = None) -> tuple[list[dict], str]:
        """Give ``client`` to ``session``, taking it from the connection holding it if
        ``takeover`` is that registration's token; returns the locks it resyncs (none
        if ``cold``: they go to the cold queue) and the token of this registration.
        An ``operator`` session (cqsctl) takes no client slot and holds its locks as
        ``client:<session id>``, its own (and no token: nothing takes it over)."""
        if session.client is not None:
            raise _bad(f"this connection is already registered as {session.client}")
        if not CLIENT_NAME.fullmatch(client):
            raise _bad(f"client name {client!r} must be {CLIENT_NAME_RULE}")
        session.rights = self.access.authenticate(client, secret, session.over_tcp,
                                                  session.cert_cn, operator, session.peer_uid,
                                                  session.peer)
        session.name = client
        if operator:
            return self._operator_session(session, client), ""
        old = self.sessions.get(client)
        if old is not None:
            if takeover is None or not hmac.compare_digest(takeover, self.tokens[client]):
                raise CQSError(Reason.CLIENT_ACTIVE, f"client {client} is already registered")
            old.cut(f"client {client} was taken over by a new connection ({session.peer})")
        elif len(self.sessions) - self.operators >= self.config.daemon.max_clients:
            raise CQSError(Reason.CLIENT_LIMIT, f"{len(self.sessions) - self.operators} "
                                                "clients are registered, the maximum")
        session.client = client
        self.sessions[client] = session
        self.held_over.discard(client)
        self.tokens[client] = token = secrets.token_hex(16)
        pending = self.pending.pop(client, None)
        if pending is not None:
            pending.cancel()
        locks = []
        for s in self.registry.pairs.values():
            if cold:
                moved = s.cold_client(client)
                if moved:
                    log.info("cold_start_locks", client=client, structure=s.name,
                             messages=len(moved))
            else:
                locks += [wire.lock(s.name, e) for e in s.client_locks(client)]
        log.info("register", client=client, peer=session.peer, cold=cold, resync_locks=len(locks),
                 takeover=old is not None)
        return locks, token

    def resume(self, session: Session, cold: bool) -> list[Interest]:
        """After ``register``: the interests ``session``'s client registered before
        (on an earlier connection, or before the daemon restarted), registered
        again for this session; a cold start forgets them instead. Those of a
        structure not served here now (not configured, or a group's pair another
        node owns: the client's own register_interest finds the owner) stay kept,
        for when it is."""
        client = session.client
        assert client is not None  # registered: the handler calls it after register
        if session.operator:
            return []
        kept = self.registrations.clients.get(client)
        if kept is None or (cold and kept):
            self.registrations.clients[client] = set()
            self.registrations.changed(self.runtime.spawn)
            return []
        served = (set(self.registry.pairs) | set(self.registry.failed)) - self.registry.standby
        found = [key for key in sorted(kept) if key[0] in served]
        for key in found:
            self.interest.setdefault(key, set()).add(session)
            session.interests.add(key)
        if found:
            log.info("interests_resumed", client=client, interests=len(found))
        return found

    def _operator_session(self, session: Session, client: str) -> list[dict]:
        session.client = f"{client}{OPERATOR_MARK}{session.id}"
        session.operator = True
        self.sessions[session.client] = session
        self.operators += 1
        # cqsctl comes and goes many times a day: its sessions at debug, not info
        log.debug("register", client=session.client, peer=session.peer, operator=True)
        return []

    def reauthorize(self) -> None:
        """After a reload: each session gets its client's rights as they are now (in
        the live config); one whose client is no longer listed is cut off."""
        self.access.reload(self.config.current)
        for session in list(self.sessions.values()):
            assert session.name is not None  # registered, as every session here is
            try:
                session.rights = self.access.rights_for(session.name, session.operator,
                                                        session.peer_uid)
            except CQSError as err:
                session.cut(err.message)

    def deregister(self, session: Session) -> None:
        """A normal end: the name is free at once, and its locks go back unfailed."""
        client = session.client
        assert client is not None
        session.deregistered = True
        self._forget(session)  # before the reply: its name may register again at once
        if not session.operator and self.registrations.clients.pop(client, None) is not None:
            # not waited for: the connection ends with the reply (a crash before the
            # write leaves the registration kept, and its interests found again)
            self.registrations.changed(self.runtime.spawn)
        for s in self.registry.pairs.values():
            s.release_client(client, failed=False)
        (log.debug if session.operator else log.info)("deregister", client=client)

    def connection_lost(self, session: Session, shutting_down: bool) -> None:
        """``session`` has ended; if it held a client that did not deregister, that
        client's locks go to peer recovery (at a shutdown they stay, for the image)."""
        for key in list(session.interests):
            self.drop_interest(session, key)
        client = session.client
        if client is None or self.sessions.get(client) is not session:
            return
        self._forget(session)
        if shutting_down:
            return
        log.info("connection_lost", client=client, peer=session.peer, cut_off=session.cut_off)
        self.schedule_peer_recovery(client)

    def _forget(self, session: Session) -> None:
        client = session.client
        assert client is not None  # registered: both callers check
        del self.sessions[client]
        self.tokens.pop(client, None)
        if session.operator:
            self.operators -= 1

    # -- peer recovery -------------------------------------------------------------

    def schedule_peer_recovery(self, client: str, failed: bool = True,
                               grace: float | None = None) -> None:
        """Release a dropped client's locks after ``resync_grace`` (or ``grace``, if
        longer) unless it comes back: as failed deliveries if the client failed, as
        they were if the daemon stopped under it (``failed=False``: a restart is no
        failure of the client's)."""
        grace = max(self.config.daemon.resync_grace, grace or 0)
        if grace == 0 or is_operator_session(client):  # an operator session never comes back
            self.recover_peer(client, failed)
            return
        scope = trio.CancelScope()
        self.pending[client] = scope
        self.runtime.spawn(f"resync grace of {client}", self._grace, client, scope, grace, failed)

    async def _grace(self, client: str, scope: trio.CancelScope, grace: float,
                     failed: bool) -> None:
        with scope:
            await trio.sleep(grace)
            if self.pending.get(client) is scope:
                del self.pending[client]
                self.recover_peer(client, failed)

    def recover_peer(self, client: str, failed: bool = True) -> None:
        """Its locks go back to their places; as failed deliveries (suspended past
        max_deliveries) if ``failed``."""
        self.held_over.discard(client)
        for s in self.registry.pairs.values():
            released = s.release_client(client, failed)
            if released:
                suspended = sum(1 for e in released if e.qtype == QueueType.TRAN_SUSPEND)
                log.info("peer_recovery", client=client, structure=s.name,
                         returned=len(released) - suspended, suspended=suspended,
                         failed=failed)
        self.runtime.settle()

    # -- interests and notifications -------------------------------------------------

    def add_interest(self, session: Session, key: Interest, has_work: bool) -> None:
        self.interest.setdefault(key, set()).add(session)
        session.interests.add(key)
        if not session.operator:
            self._keep(session, key, True)
        if has_work:
            session.send(notification(*key))

    def deregister_interest(self, session: Session, key: Interest) -> None:
        """The client's own deregister_interest: forgotten for good, not only for
        this connection."""
        self.drop_interest(session, key)
        if not session.operator:
            self._keep(session, key, False)

    def _keep(self, session: Session, key: Interest, keep: bool) -> None:
        assert session.client is not None  # registered: every interest op is
        kept = self.registrations.clients.setdefault(session.client, set())
        if (key in kept) != keep:
            (kept.add if keep else kept.discard)(key)
            self.registrations.changed(self.runtime.spawn)

    def announce_to(self, session: Session, keys: list[Interest]) -> None:
        """Notify ``session`` of each of ``keys`` whose queue has work now."""
        for key in keys:
            pair = self.registry.pairs.get(key[0])
            if pair is not None and pair.queue_stats(key[1], key[2])["depth"]:
                session.send(notification(*key))

    def drop_interest(self, session: Session, key: Interest) -> None:
        session.interests.discard(key)
        sessions = self.interest.get(key)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self.interest[key]

    def notify(self, key: Interest) -> None:
        """Tell every session interested in ``key`` that it has work."""
        sessions = self.interest.get(key)
        if sessions:
            frame = encode_frame(notification(*key))
            for session in list(sessions):
                session.send_bytes(frame)

    def announce(self, pair: StructurePair) -> None:
        """After a pair is rebuilt or recovered: notify the interests it has work for."""
        for key in [k for k in self.interest if k[0] == pair.name]:
            if pair.queue_stats(key[1], key[2])["depth"]:
                self.notify(key)


def notification(structure: str, qtype: int, queue: str) -> dict:
    return {"notify": "work", "structure": structure, "qtype": QueueType(qtype).name,
            "queue": queue}


def _bad(message: str) -> CQSError:
    return CQSError(Reason.INVALID_REQUEST, message)
