"""The structure engine against a deliberately simple model, over long random histories.

The model and the rules every engine shares are in model.py; here a lone structure,
small enough to fill often, whose fit is judged from the model's own count of
elements and entries rather than from what the engine reports.
"""

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from cqsd.engine import Put, Structure
from cqsd.recovery.fold import fold

from .model import (
    DELAYS,
    ENTRY_MAX,
    MAX_DELIVERIES,
    TYPES,
    ModelMachine,
    as_logged,
    cost,
    recoverable_rows,
    run,
)

SIZE = 40 * 512  # 40 data elements: small enough to fill often
INITSIZE = 16 * 512  # a put that does not fit grows it toward SIZE first
MAX_ENTRIES = 30
CLIENTS = ["IMS1", "IMS2", "IMS3"]
NAMES = ["A", "B", "TRANX"]


class EngineVersusModel(ModelMachine):
    clients = st.sampled_from(CLIENTS)
    keys = st.tuples(st.sampled_from(TYPES), st.sampled_from(NAMES))
    sizes = st.one_of(st.integers(0, 600), st.integers(ENTRY_MAX + 1, 3 * ENTRY_MAX + 50))

    def __init__(self):
        super().__init__(Structure(
            "SQ", SIZE, initsize=INITSIZE, entry_max=ENTRY_MAX, max_entries=MAX_ENTRIES,
            max_deliveries=MAX_DELIVERIES, clock=self.wall_clock, ticks=self.mono_clock,
        ))
        self.replayed: dict[int, list] = {}  # the fold of every effect logged so far
        self.grown_to = INITSIZE // 512  # data elements of the current size

    def used(self, leaving=()):
        totals = [cost(len(m.data)) for m in self.msgs.values() if m not in leaving]
        return sum(t[0] for t in totals), sum(t[1] for t in totals)

    def fits(self, sizes_, freed=()):
        e, n = self.used(freed)
        for size in sizes_:
            c = cost(size)
            e, n = e + c[0], n + c[1]
        return e <= SIZE // 512 and n <= MAX_ENTRIES

    def commit_reason(self, client, ops, status):
        """The first entry that fails, else the puts not fitting beside what stays."""
        reason = self.batch_reason(client, ops)
        if reason is None and not self.fits([len(o.data) for o in ops if type(o) is Put],
                                            self.freed(ops)):
            return "STRUCTURE_FULL"
        return reason

    @rule(key=keys, size=sizes, recoverable=st.booleans(), delay=DELAYS)
    def put(self, key, size, recoverable, delay):
        data = self.payload(size)
        fits = self.fits([size])
        e = self.expect(None if fits else "STRUCTURE_FULL",
                        lambda: self.s.put(*key, data, recoverable, **self.later(delay)))
        if e is not None:
            self.admit(e, key, data, delay)

    @invariant()
    def fifo_and_no_entry_in_two_places(self):
        everything = self.browse_through(limit=7)
        found = [e.entry_id for e in everything]
        assert sorted(found) == sorted(self.msgs), "browse-all must show each message exactly once"
        assert all(e.qtype not in (2, 6) for e in everything), "a staging segment was visible"
        for key in {m.key for m in self.msgs.values()}:
            queue = [e.entry_id for e in self.s.browse(*key, limit=1000)[0]]
            assert queue == sorted(queue)

    @invariant()
    def log_effects_fold_to_the_recoverable_content(self):
        """Replaying the effects (through msgpack, as the log stores them) gives the
        recoverable messages exactly as the engine holds them."""
        record = as_logged({"s": "SQ", "e": self.s.effects})
        self.s.effects.clear()
        fold(self.replayed, [record], "SQ")
        assert self.replayed == recoverable_rows(self.s)

    @invariant()
    def capacity_arithmetic(self):
        """What is used is what the model holds, within the current size, which
        only ever grows, and only as far as the content needs (at 80%)."""
        elements, entries = self.used()
        assert (self.s.elements_used, self.s.entries_used) == (elements, entries)
        assert elements <= self.s.elements_total and entries <= MAX_ENTRIES
        assert self.s.elements_total >= self.grown_to
        if self.s.elements_total > self.grown_to:
            assert self.s.elements_total <= max(INITSIZE // 512, -(-elements * 5 // 4))
        self.grown_to = self.s.elements_total
        rows = self.s.header_stats()
        assert sum(r["elements"] for r in rows) == elements
        assert sum(r["entries"] for r in rows) == entries

    @invariant()
    def lock_ownership(self):
        for client in CLIENTS:
            want = sorted(e for e, m in self.msgs.items()
                          if m.place == "locked" and m.owner == client)
            assert [e.entry_id for e in self.s.client_locks(client)] == want


def test_engine_agrees_with_model_over_random_histories():
    """At least 2,000 random steps across clients, types, long messages and a full
    structure, leases expiring and delayed puts ripening among them."""
    EngineVersusModel.expired = EngineVersusModel.ripened = 0
    steps = run(EngineVersusModel, 80)
    assert steps >= 2000, f"only {steps} steps ran"
    for _ in range(3):  # expiries and ripening need lucky ticks: some runs see few
        if EngineVersusModel.expired >= 5 and EngineVersusModel.ripened >= 5:
            break
        run(EngineVersusModel, 80)
    assert EngineVersusModel.expired >= 5 and EngineVersusModel.ripened >= 5
