"""The live-daemon fuzzer's rules for connections (a mixin of its machine):
clients that register (SDK and raw, warm and cold, refused), drop, deregister,
send what no SDK would (requests that are no request, frames that are no
frame, thousands pipelined), and a daemon that restarts under them."""

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import cqsclient
from cqsproto import PROTOCOL_VERSION
from cqsproto.requests import MAX_REGISTER_FRAME

from .fuzz_bytes import BROKEN, MALFORMED, broken, malformed
from .fuzz_checks import CHECKER, Checks
from .fuzz_draws import CAPACITY, CLIENT_NAME, CLIENTS, MAX_CLIENTS, MAX_PEERS, picks
from .fuzz_model import digest
from .fuzz_peers import RawPeer, Reply, SdkPeer


def locked_ids(reply):
    """The entry ids a register reply gives back (warm resync)."""
    return [lock["entry_id"] for lock in reply.result["locks"]]


class ConnectionRules:
    # -- registration ---------------------------------------------------------------------

    def register_faults(self, name, version=PROTOCOL_VERSION):
        faults = set()
        if version != PROTOCOL_VERSION or not CLIENT_NAME.fullmatch(name):
            faults.add("INVALID_REQUEST")
        if name in self.model.registered or name == CHECKER:
            faults.add("CLIENT_ACTIVE")
        if len(self.model.registered) + 1 >= MAX_CLIENTS:
            faults.add("CLIENT_LIMIT")
        return faults

    def registered(self, peer, name, cold, locks):
        """A registration succeeded: a warm one is given back what it held."""
        held = [m.eid for m in self.model.locks_of(name)]
        if cold:
            assert locks == [], f"a cold start resynced {locks}"
            self.model.cold_start(name)
        else:
            assert sorted(locks) == held, f"{name} resynced {sorted(locks)}, held {held}"
        self.model.registered.add(name)
        peer.client = name

    @precondition(lambda self: len(self.live()) < MAX_PEERS)
    @rule(name=st.sampled_from(CLIENTS), cold=st.booleans())
    def connect_with_the_sdk(self, name, cold):
        faults = self.register_faults(name)
        try:
            client = cqsclient.connect(self.d.address, client=name, cold=cold, timeout=30)
        except cqsclient.errors.CQSError as err:
            return self.judge(Reply(False, reason=err.reason, message=err.message), faults)
        assert not faults, f"registered {name}, which must be refused with one of {faults}"
        peer = SdkPeer(client)
        self.registered(peer, name, cold, [lock.entry_id for lock in client.resync_locks])
        self.peers.append(peer)

    @precondition(lambda self: len(self.live()) < MAX_PEERS)
    @rule(name=st.sampled_from(CLIENTS * 3 + ["", "x" * 17, "ab cd", "é"]), cold=st.booleans(),
          register=st.sampled_from(["yes"] * 4 + ["no", "bad_version", "twice"]))
    def connect_raw(self, name, cold, register):
        peer = RawPeer(self.d.socket)
        self.peers.append(peer)
        if register == "no":
            return
        version = PROTOCOL_VERSION + (register == "bad_version")
        faults = self.register_faults(name, version)
        reply = self.send(peer, "register", {"client": name, "version": version, "cold": cold})
        self.judge(reply, faults, on_ok=lambda r: self.registered(
            peer, name, cold, locked_ids(reply)))
        if register == "twice":
            self.judge(peer.register(name), {"INVALID_REQUEST"} if peer.client else
                       self.register_faults(name))
            if peer.client is None:  # the first one was refused; this one may not be
                peer.close()

    @precondition(lambda self: self.live())
    @rule(i=picks)
    def drop_a_connection(self, i):
        """Close a socket without deregistering, as a killed client would."""
        peer = self.pick(i)
        before = self.lost_count(peer.client) if peer.client else 0
        peer.close()
        self.ended(peer, before)

    @precondition(lambda self: self.live(registered=True))
    @rule(i=picks, then_put=st.booleans())
    def deregister(self, i, then_put):
        """Deregister; a request pipelined after it is never served."""
        peer = self.pick(i, registered=True)
        name = peer.client
        if peer.kind == "raw" and then_put:
            _, first = peer.frame_for("deregister")
            _, after = peer.frame_for("put", structure="SMALL", queue="A", data=b"after")
            peer.send(first + after)
            reply = peer.reply(peer.next_id - 1)
        else:
            reply = self.send(peer, "deregister", {})
        self.judge(reply, set())
        self.model.release(name, failed=False)
        self.model.registered.discard(name)
        if peer.kind == "raw":
            assert peer.at_eof(), "the daemon answered a request sent after deregister"
        peer.close()

    # -- bytes no SDK would send --------------------------------------------------------

    @precondition(lambda self: self.live())
    @rule(i=picks, how=st.sampled_from(MALFORMED))
    def malformed_request(self, i, how):
        """A frame that decodes but is no request: INVALID_REQUEST, and the
        connection goes on."""
        peer = self.pick(i)
        if peer.kind != "raw":
            return
        peer.next_id += 1
        frame, rid = malformed(how, peer.next_id)
        peer.send(frame)
        reply = peer.reply(rid)
        assert reply is not None, f"the daemon closed the connection over a {how} request"
        # a commit's operations are only looked at once the sender is registered
        allowed = {"INVALID_REQUEST"} | ({"NOT_REGISTERED"} if peer.client is None
                                        and how.startswith("commit") else set())
        assert not reply.ok and reply.reason in allowed, f"{how}: {reply}"
        assert reply.rid == rid, f"{how}: reply id {reply.rid}, not {rid}"

    @precondition(lambda self: len(self.live()) < MAX_PEERS)
    @rule(register=st.booleans(), first=st.booleans(), how=st.sampled_from(BROKEN))
    def broken_frame(self, register, first, how):
        """A frame that cannot be decoded: an id-less refusal, then the connection
        (only it) is closed; requests before it in the same write are served."""
        peer = self.fresh_peer(register)
        before = self.lost_count(peer.client) if peer.client else 0
        prefix, rid = b"", None
        if first and peer.client:
            rid, prefix = peer.frame_for("put", structure="SMALL", queue="B", data=b"before",
                                         recoverable=False)
        bad, reason = broken(how, self.max_frame if peer.client else MAX_REGISTER_FRAME)
        peer.send(prefix + bad)
        if how.startswith("truncated"):
            peer.shut_write()
        if rid is not None:
            self.judge(peer.reply(rid), set(), may=CAPACITY, on_ok=lambda r: self.model.added(
                "SMALL", r["entry_id"], ("TRAN", "B"), digest(b"before"), False))
        reply = peer.reply(None)
        assert reply is not None and reply.rid is None and reply.reason == reason, (
            f"{how}: expected an id-less {reason} refusal, got {reply}")
        assert peer.at_eof(), f"{how}: the connection stayed open"
        self.ended(peer, before)

    @rule(count=st.sampled_from([10, 300, 3000]), register=st.booleans())
    def pipeline(self, count, register):
        """Many requests sent while their replies are read: every one is answered,
        in order, however the daemon paces the connection (docs/protocol.md)."""
        peer = self.fresh_peer(register)
        replies = peer.pipeline([peer.frame_for("query", kind="headers") for _ in range(count)])
        assert all(r is not None for r in replies), (
            f"a paced client was cut off: {self.d.events('client_cut_off')[-1:]}")
        assert all(r.ok == (peer.client is not None) for r in replies), f"pipeline: {replies[:3]}"
        before = self.lost_count(peer.client) if peer.client else 0
        peer.close()
        self.ended(peer, before)

    def fresh_peer(self, register):
        """A raw connection of the rule's own, registered (under a name holding no
        locks) if asked and a name is free."""
        peer = RawPeer(self.d.socket)
        name = next((c for c in CLIENTS if not self.register_faults(c)
                     and not self.model.locks_of(c)), None) if register else None
        if name is not None:
            self.registered(peer, name, False, locked_ids(peer.register(name)))
        return peer

    def unregistered(self, peer, op, fields):
        """Before register every request is refused NOT_REGISTERED (or its frame)."""
        if self.too_big(peer, op, fields):
            return self.frame_refused(peer, op, fields)
        self.judge(self.send(peer, op, fields), {"NOT_REGISTERED"})

    def frame_refused(self, peer, op, fields):
        """A request frame past the frame limit: MESSAGE_TOO_LARGE, id-less, and the
        connection closed."""
        before = self.lost_count(peer.client) if peer.client else 0
        peer.send(peer.frame_for(op, **fields)[1])
        reply = peer.reply(None)
        assert reply is None or (reply.rid is None and reply.reason == "MESSAGE_TOO_LARGE"), (
            f"an oversized {op} frame got {reply}")
        assert peer.at_eof(), "the connection stayed open after an oversized frame"
        self.ended(peer, before)

    # -- the daemon itself ---------------------------------------------------------------

    @rule(clean=st.booleans(), go=st.sampled_from([False] * 9 + [True]))
    def restart(self, clean, go):
        """SIGTERM (everything kept, locks for their holders to resync) or SIGKILL
        (recoverable messages kept), with clients connected; then start again."""
        if not go:
            return
        if clean:
            rc = self.d.stop()
            assert rc == 0, f"a clean stop exited {rc}: {self.d.lines[-5:]}"
        else:
            self.d.kill()
        for peer in self.peers + [self.checker]:
            peer.close()
        self.peers = []
        self.model.restarted(clean)
        self.d.restart()
        self.connect_checker()
        Checks.stats["restarts"] += 1
