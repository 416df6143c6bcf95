"""The dedup memory of exactly-once puts (cqsd/dedup.py) against a dumb model: every
key ever remembered, with its time, looked up by scanning; and the memory a start
rebuilds from log records equals the one that saw them live."""

import gc

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cqsd.dedup import Remembered, key_field, key_of, key_of_record, rebuild
from cqsd.records import KEY

SECOND = 10**9
keys = st.tuples(st.sampled_from(["A", "B"]), st.sampled_from(["i1", "i2"]),
                 st.integers(0, 5)).map(lambda k: key_of(*k))
parts = st.tuples(st.sampled_from(["A", "B"]), st.sampled_from(["i1", "i2"]),
                  st.integers(0, 5))


class Memory(RuleBasedStateMachine):
    """Puts, resends and the clock moving (forward, or stepping back a little)."""

    @initialize(window=st.sampled_from([0, 1, 2.5, 10]))
    def start(self, window: float) -> None:
        self.memory = Remembered(window)
        self.window_ns = int(window * 1e9)
        self.now = 1_000 * SECOND
        # the model: key -> (ids, time), every key scanned at each expiry; a key is
        # stamped no earlier than the one before it (a clock stepped back stands still),
        # and is forgotten once the clock it is expired by has passed its window: what
        # is forgotten stays forgotten, whatever the clock does after
        self.kept: dict[str, tuple[list[int], int]] = {}
        self.last = 0
        self.behind = 0  # how far the memory's clock is behind self.now's (catch_up)
        self.next_id = 1

    def forget(self, now: int) -> None:
        horizon = now - self.window_ns
        self.kept = {k: v for k, v in self.kept.items() if v[1] >= horizon}

    @rule(key=keys, n=st.integers(1, 3))
    def put(self, key: str, n: int) -> None:
        """A put or commit: a key remembered is answered, else applied and remembered."""
        got = self.memory.recall(key, self.now)
        self.forget(self.now)
        assert (got[0] if got else None) == (self.kept[key][0] if key in self.kept else None)
        if got is None:
            ids = list(range(self.next_id, self.next_id + n))
            self.next_id += n
            self.memory.remember(key, ids, self.now)
            if self.window_ns > 0:  # a window of 0 remembers nothing
                self.last = max(self.last, self.now)
                self.kept[key] = (ids, self.last)
                self.forget(self.last)

    @rule(seconds=st.floats(0, 4))
    def tick(self, seconds: float) -> None:
        self.now += int(seconds * SECOND)

    @precondition(lambda self: self.now > self.last - SECOND)
    @rule()
    def clock_steps_back(self) -> None:
        """A wall clock stepped back: keys stay at least as long as their window."""
        self.now -= SECOND // 2

    @precondition(lambda self: self.last > 0)
    @rule(seconds=st.integers(0, 30))
    def taken_over_by_a_node_ahead(self, seconds: int) -> None:
        """Handed to a node whose clock runs ``seconds`` ahead (or that takes it over
        that long after its newest key): that key counts as stamped now, and every
        key keeps its age (``catch_up``, given the newest key's stamp)."""
        self.now += seconds * SECOND
        shift = max(0, self.now - self.last)
        self.memory.catch_up(self.last - self.behind, self.now)
        self.behind += shift
        self.last += shift
        self.kept = {k: (ids, at + shift) for k, (ids, at) in self.kept.items()}

    @invariant()
    def forgets_what_is_old(self) -> None:
        self.memory.expire(self.now)
        self.forget(self.now)
        assert len(self.memory) == len(self.kept)


TestMemory = Memory.TestCase
TestMemory.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(parts, st.integers(0, 30)), max_size=30), st.integers(0, 40))
def test_a_start_rebuilds_the_memory_the_log_holds(puts, later):
    """Records with keys (and some without, and some of other pairs), in log order:
    the rebuilt memory answers what the live one answered, ``later`` seconds on."""
    live, records, at = Remembered(10), [], 0
    for n, (key, step) in enumerate(puts):
        at += step * SECOND
        if live.recall(key_of(*key), at) is None:
            live.remember(key_of(*key), [n], at)
            records.append((at, {"s": "MSGQ01", "e": [], KEY: key_field(key[0], key[1:], [n])}))
        records.append((at, {"s": "OTHER", "e": [], KEY: key_field(key[0], key[1:], [-1])}))
        records.append((at, {"s": "MSGQ01OV", "e": []}))
    now = at + later * SECOND
    rebuilt = rebuild(records, {"MSGQ01": "MSGQ01", "MSGQ01OV": "MSGQ01"}, 10)
    assert set(rebuilt) == {"MSGQ01"}
    for key, _ in puts:
        assert rebuilt["MSGQ01"].recall(key_of(*key), now) == live.recall(key_of(*key), now)
    assert key_of_record({"s": "X", "e": []}) is None


def test_remembered_keys_are_nothing_the_collector_walks():
    """A window holds hundreds of thousands of keys for the daemon's life: none of
    them may be an object every full collection walks again (cqsd/dedup.py)."""
    memory = Remembered(120)
    gc.collect()
    before = len(gc.get_objects())
    for seq in range(10_000):
        memory.remember(key_of("PROD1", "".join("0123456789abcdef"), seq), [10**18 + seq],
                        1_000 * SECOND + seq)
    gc.collect()
    assert len(memory) == 10_000
    assert len(gc.get_objects()) - before < 100
    seventh = key_of("PROD1", "0123456789abcdef", 7)
    assert memory.recall(seventh, 1_001 * SECOND) == ([10**18 + 7], 0)


def test_keys_remembered_before_a_roll_wait_for_no_lsn_and_later_ones_do():
    """After a group node rolls to a new series, a resend of a key from the old one
    is answered at once (its LSN names the old series, acknowledged to its end); a
    key remembered after the roll still waits for its record."""
    memory = Remembered(120)
    memory.remember(key_of("A", "i1", 1), [7], 1_000 * SECOND, lsn=5_000)
    memory.all_durable()
    memory.remember(key_of("A", "i1", 2), [8], 1_000 * SECOND, lsn=3)
    assert memory.recall(key_of("A", "i1", 1), 1_001 * SECOND) == ([7], 0)
    assert memory.recall(key_of("A", "i1", 2), 1_001 * SECOND) == ([8], 3)
