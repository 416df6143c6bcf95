"""The live-daemon fuzzer's rules for the shared message data sets (a mixin of its
machine; issue 28): the SMDS displays, and the operator's commands — reset-smds,
start-smdsconn, stop-smdsconn, alter-smds — with every kind of bad argument,
against the "smds" shape's offloading MSGQ01 and the structures without data
sets.

A command that makes a data set unavailable is undone within the same step
(stopped then started, disabled then enabled, FAILED then RECOVERED), so the
model of what is stored needs no SMDS states: between the two, a browse of the
whole structure must show every message the model holds, each with its data
or, offloaded to the data set that is down, with none and ``unavailable`` set;
after the step the usual checks compare everything again, restart processing
included."""

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from .fuzz_checks import MAX_BATCH, Checks
from .fuzz_draws import CLIENTS, operator_structures, picks
from .fuzz_model import digest

SMDS_KINDS = ["smds", "usage", "cfstatus", "smdsconn"]
OWNERS = st.sampled_from(CLIENTS * 3 + ["NOSUCH", "bad name", ""])
SELF = "self"  # the owner is the client sending the command
# (undo-able change, its undoing) as (op, fields) pairs; owner None: every data set
ROUND_TRIPS = {
    "stop": (("stop_smdsconn", {}), ("start_smdsconn", {})),
    "disable": (("reset_smds", {"access": "disabled"}), ("reset_smds", {"access": "enabled"})),
    "fail": (("reset_smds", {"status": "failed"}), ("reset_smds", {"status": "recovered"})),
}
NORMAL = ("ACTIVE", "ENABLED", "OPEN", "NORMAL")
BAD_RESETS = [{}, {"access": "bogus"}, {"status": "bogus"}, {"status": "recovered"},
              {"status": "failed", "access": 1}]
DSBUFS = st.sampled_from([None, 1, 7, 9999, 0, 10000, "default", "x", -1])
DSEXPAND = st.sampled_from([None, "yes", "no", "default", "maybe", ""])


class SmdsRules:
    def smds_state(self):
        """{owner: (STATUS, ACCESS, SMDSCONN, AVAIL)} of MSGQ01's data sets, as the
        checker's displays show them."""
        if not self.shape.offload:
            return {}
        cf = {r["owner"]: r for r in self.checked_query("cfstatus", "MSGQ01")}
        conn = {r["owner"]: r for r in self.checked_query("smdsconn", "MSGQ01")}
        assert set(cf) == set(conn) <= set(CLIENTS), f"data sets {sorted(cf)}, {sorted(conn)}"
        return {o: (cf[o]["status"], cf[o]["access"], conn[o]["status"], conn[o]["avail"])
                for o in cf}

    def smds_faults(self, structure, owner, known):
        """What an SMDS command naming ``owner`` (None: every data set) must be refused
        with: an unknown structure, one without data sets, a bad client name, an
        owner that has no data set."""
        if self.structure_faults(structure, operator=True):
            return {"UNKNOWN_STRUCTURE"}
        if structure != "MSGQ01" or not self.shape.offload:
            return {"INVALID_REQUEST"}
        if owner is not None and owner not in known:
            return {"INVALID_REQUEST"}
        return set()

    @precondition(lambda self: self.live(registered=True))
    @rule(i=picks, kind=st.sampled_from(SMDS_KINDS), structure=operator_structures)
    def display_smds(self, i, kind, structure):
        """The SMDS displays: rows only for MSGQ01's data sets, of clients that put."""
        fields = {"kind": kind, "structure": structure}
        faults = self.structure_faults(structure, operator=True)

        def shown(result):
            owners = {r["owner"] for r in result["rows"]}
            assert owners <= set(CLIENTS), f"display {kind} shows {sorted(owners)}"
            assert not owners or (structure == "MSGQ01" and self.shape.offload), (
                f"display {kind} {structure} shows data sets {sorted(owners)}")
        self.judge(self.send(self.pick(i, registered=True), "query", fields), faults,
                   on_ok=shown)

    @precondition(lambda self: self.live(registered=True))
    @rule(i=picks, structure=operator_structures,
          owner=st.one_of(st.just(SELF), st.just(SELF), st.none(), OWNERS),
          trip=st.sampled_from(sorted(ROUND_TRIPS)))
    def smds_round_trip(self, i, structure, owner, trip):
        """A data set made unavailable and available again: each command answered,
        every message still there meanwhile (with its data, or marked unavailable),
        and the data set back to ACTIVE, ENABLED, OPEN and NORMAL."""
        peer = self.pick(i, registered=True)
        if self.shape.offload and structure == "MSGQ01" and peer.client not in (
                states := self.smds_state()):  # an offloaded put gives it a data set
            self.put_on(peer, "MSGQ01", ("TRAN", "A"), self.shape.entry_max + 1, i % 2 == 0,
                        False)
            if peer.closed:
                return
        states = self.smds_state()
        owner = peer.client if owner == SELF else owner
        (op, change), (back_op, back) = ROUND_TRIPS[trip]
        if op == "reset_smds" and owner is None:
            owner = CLIENTS[i % len(CLIENTS)]  # reset-smds names one data set
        faults = self.smds_faults(structure, owner, states)
        fields = {"structure": structure, "owner": owner}
        if faults:
            return self.judge(self.send(peer, op, fields | change), faults)
        chosen = list(states) if owner is None else [owner]
        if any(states[o] != NORMAL for o in chosen):
            Checks.stats["smds round trip skipped: not normal"] += 1
            return  # only a normal data set is taken down, so it can be brought back
        self.judge(self.send(peer, op, fields | change), set())
        self.browse_while_down(set(chosen))
        self.judge(self.send(peer, back_op, fields | back), set())
        now = self.smds_state()
        assert all(now[o] == NORMAL for o in chosen), f"after {trip} and back: {now}"
        Checks.stats[f"smds {trip} and back"] += 1

    def browse_while_down(self, down):
        """Every message the model holds is browsed, in order: with its data, or with
        none and ``unavailable`` when offloaded to a data set of ``down``."""
        shown, cursor, ids = self.model.listing("MSGQ01"), None, []
        while True:
            reply = self.checker.request("browse", structure="MSGQ01", cursor=cursor,
                                         limit=MAX_BATCH)
            assert reply is not None and reply.ok, f"a browse with {sorted(down)} down: {reply}"
            for m in reply.result["messages"]:
                ids.append(m["entry_id"])
                model = next((s for s in shown if s.eid == m["entry_id"]), None)
                if model is None:
                    continue
                if m.get("unavailable") is not None:
                    assert m["data"] == b"" and model.digest[0] > self.shape.entry_max, (
                        f"entry {m['entry_id']} unavailable ({m['unavailable']})")
                else:
                    assert digest(m["data"]) == model.digest, f"entry {m['entry_id']} changed"
            cursor = reply.result["cursor"]
            if cursor is None:
                break
        assert ids == [s.eid for s in shown], (
            f"with {sorted(down)} down a browse shows {ids}, the model holds "
            f"{[s.eid for s in shown]}")

    @precondition(lambda self: self.live(registered=True))
    @rule(i=picks, structure=operator_structures, owner=OWNERS, change=st.sampled_from(
        BAD_RESETS))
    def reset_smds_refused(self, i, structure, owner, change):
        """reset-smds with nothing to do, a value that is no value, or a change the
        state does not allow (RECOVERED of an ACTIVE data set): refused, nothing done."""
        states = self.smds_state()
        faults = self.smds_faults(structure, owner, states) or {"INVALID_REQUEST"}
        if any(type(v) is not str for v in change.values()):
            faults = {"INVALID_REQUEST"}  # a field of the wrong type, before all else
        if faults == {"INVALID_REQUEST"} and change == {"status": "recovered"} \
                and states.get(owner, NORMAL)[0] in ("FAILED", "INRECOVER"):
            return  # allowed there: not a refusal to draw
        self.judge(self.send(self.pick(i, registered=True), "reset_smds",
                             {"structure": structure, "owner": owner} | change), faults)
        assert self.smds_state() == states, "a refused reset-smds changed a data set"

    @precondition(lambda self: self.live(registered=True))
    @rule(i=picks, structure=operator_structures, owner=OWNERS, dsbufs=DSBUFS,
          dsexpand=DSEXPAND)
    def alter_smds(self, i, structure, owner, dsbufs, dsexpand):
        """alter-smds: the overrides set, or refused for a bad value (an expansion it
        retries may make SMDS_FULL reachable sooner: puts allow it anyway)."""
        states = self.smds_state()
        faults = self.smds_faults(structure, owner, states)
        bad_bufs = dsbufs is not None and dsbufs != "default" and not (
            type(dsbufs) is int and 1 <= dsbufs <= 9999)
        if not faults and (bad_bufs or dsexpand not in (None, "yes", "no", "default")
                           or (dsbufs is None and dsexpand is None)):
            faults = {"INVALID_REQUEST"}
        fields = {"structure": structure, "owner": owner, "dsbufs": dsbufs,
                  "dsexpand": dsexpand}
        self.judge(self.send(self.pick(i, registered=True), "alter_smds", fields), faults)
