"""What the live-daemon fuzzer checks after every step (a mixin of its machine):
the daemon runs and answers on a fresh connection, its log holds no traceback
or error, and it stores exactly what the model says, its space accounted for,
every interested client notified."""

from collections import Counter

from hypothesis.stateful import invariant

from .fuzz_model import seen_view, within
from .fuzz_peers import RawPeer

CHECKER = "FZCHECK"  # the registered client the checks browse and query with
MAX_BATCH = 10_000  # the most a read or browse may ask for (cqsd/server/handlers.py)
# Events that mean something went wrong in the daemon, whatever their level.
BAD_EVENTS = {"text", "internal_error", "request_internal_error", "connection_failed",
              "reply_too_large", "settle_failed", "task_died", "log_record_refused"}


def check_page(page, cursor, shown, limit, budget, what="browse shows"):
    """A page is the next messages of ``shown``, as many as ``limit`` and the
    reply budget allow, with a cursor iff more may follow."""
    expected = within(shown[:limit], budget)
    got = [(m["entry_id"], seen_view(m)) for m in page]
    want = [(m.eid, m.view()) for m in expected]
    if got != want or (cursor is None and len(page) != len(shown)) or (
            cursor is not None and len(page) != limit and len(page) == len(shown[:limit])):
        raise AssertionError(
            f"{what} {[g[0] for g in got]} (cursor {cursor}); the model expects "
            f"{[m.eid for m in expected]} of {len(shown)}; first difference: "
            f"{next(((g, w) for g, w in zip(got, want, strict=False) if g != w), None)}")


class Checks:
    stats: Counter = Counter()

    @invariant()
    def daemon_answers_and_stores_what_it_acknowledged(self):
        if self.d is None:
            return
        Checks.stats["steps"] += 1
        assert self.d.proc.poll() is None, (
            f"the daemon exited with {self.d.proc.returncode}: "
            f"{[e.get('text', e) for e in self.d.lines[-40:]]}")
        fresh = RawPeer(self.d.socket)
        reply = fresh.request("query", kind="structures")
        assert reply is not None and reply.reason == "NOT_REGISTERED", f"fresh connection: {reply}"
        fresh.close()
        for structure in ("MSGQ01", "SMALL"):
            self.check_listing(structure)
        self.check_rows("locks", None, self.checked_query("locks"))
        self.check_rows("clients", None, self.checked_query("clients"))
        rows = self.checked_query("structures")
        self.check_rows("structures", None, rows)
        self.count_coverage(rows)
        self.check_notes()
        self.check_log()

    def checked_query(self, kind, structure=None):
        reply = self.checker.request("query", kind=kind, structure=structure)
        assert reply is not None and reply.ok, f"the checker's query {kind}: {reply}"
        return reply.result["rows"]

    def check_listing(self, structure):
        """Browse the whole structure, page by page, and compare."""
        shown, cursor = self.model.listing(structure), None
        while True:
            limit = max(1, min(MAX_BATCH, len(shown)))
            reply = self.checker.request("browse", structure=structure, cursor=cursor, limit=limit)
            assert reply is not None and reply.ok, f"the checker's browse of {structure}: {reply}"
            page, cursor = reply.result["messages"], reply.result["cursor"]
            check_page(page, cursor, shown, limit, self.shape.max_message, f"{structure} holds")
            shown = shown[len(page):]
            if cursor is None:
                break

    def check_rows(self, kind, structure, rows):
        chosen = {"MSGQ01", "SMALL"} if structure is None else {structure}
        if kind == "locks":
            got = {r["entry_id"]: r["owner"] for r in rows}
            held = {m.eid: m.owner for m in self.model.msgs.values()
                    if m.where == "locked" and m.structure in chosen}
            assert got == held, f"query locks shows {got}, the model holds {held}"
        elif kind == "clients" and structure is None:
            got = {r["client"] for r in rows}
            assert got == self.model.registered | {CHECKER}, (
                f"query clients shows {sorted(got)}, registered are "
                f"{sorted(self.model.registered | {CHECKER})}")
        elif kind == "structures":
            for name in chosen:
                mine = [r for r in rows if name in (r.get("name"), r.get("overflow_of"))]
                got = tuple(sum(r[k] for r in mine)
                            for k in ("elements_used", "entries_used", "messages"))
                assert got == self.model.usage(name), (
                    f"{name} accounts (elements, entries, messages) {got}, "
                    f"its messages need {self.model.usage(name)}")
        elif kind == "queues":
            for r in rows:
                key = (r["structure"], (r["qtype"], r["queue"]))
                ready = len(self.model.ready(*key))
                assert r["depth"] == ready, f"queue {key} depth {r['depth']}, model {ready}"

    def check_notes(self):
        """Every interested connection heard of each queue that went from empty to
        holding messages in this step (and of the ones that held some when it
        registered), and of none whose puts all went straight to waiting readers."""
        now = self.model.ready_keys()
        became = now - self.ready_before
        self.ready_before = now
        quiet, self.quiet = self.quiet, set()
        for peer in self.live(registered=True):
            notes = {(n["structure"], (n["qtype"], n["queue"])) for n in peer.drain_notes()}
            missing = ((became & peer.interests) | peer.expect) - notes
            peer.expect = set()
            assert not missing, f"{peer.client} was not notified of work on {sorted(missing)}"
            assert not notes & quiet, (
                f"{peer.client} was told of work on {sorted(notes & quiet)}, which only "
                "waiting readers got")

    def check_log(self):
        """No traceback, internal error, or error-level event in the daemon's log."""
        seen = self.d.mark()
        lines, self.log_seen = self.d.lines[self.log_seen:seen], seen
        bad = [e for e in lines if e.get("event") in BAD_EVENTS or "exception" in e
               or e.get("level") in ("error", "critical")]
        assert not bad, f"the daemon logged {bad[:5]}"

    def count_coverage(self, rows):
        """How many steps ended in the states worth reaching (printed at the end)."""
        states = {m.where for m in self.model.msgs.values()}
        states |= {"suspended" for m in self.model.msgs.values() if m.home}
        states |= {"overflow mode" for r in rows if r.get("overflow_mode")}
        states |= {"full" for r in rows if r.get("full")}
        for state in states:
            Checks.stats[f"steps with {state}"] += 1
        most = Checks.stats
        most["most messages"] = max(most["most messages"], len(self.model.msgs))
        most["most bytes"] = max(most["most bytes"],
                                 sum(m.digest[0] for m in self.model.msgs.values()))
