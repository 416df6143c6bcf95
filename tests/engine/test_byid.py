"""ById against a sorted dict: any sequence of puts, removals and pops from the
front keeps the same values in the same order, and an iteration begun before
changes still yields live ids, in increasing order (cqsd/engine/byid.py)."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cqsd.engine.byid import SLACK, ById

# few ids, so that removed ones come back, and now and then many (past SLACK)
IDS = st.one_of(st.integers(0, 40), st.integers(0, 4 * SLACK))


class Model(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.byid: ById[str] = ById()
        self.model: dict[int, str] = {}
        self.walks: list[tuple[object, list[int]]] = []  # iterators begun, and what they yielded

    @rule(key=IDS, value=st.text(max_size=2))
    def put(self, key: int, value: str) -> None:
        self.byid[key] = value
        self.model[key] = value

    @rule(key=IDS)
    def remove(self, key: int) -> None:
        if key in self.model:
            del self.byid[key]
            del self.model[key]
        else:
            with pytest.raises(KeyError):
                del self.byid[key]

    @rule()
    def pop_first(self) -> None:
        if self.model:
            low = min(self.model)
            assert self.byid.pop_first() == self.model.pop(low)
        else:
            with pytest.raises(IndexError):
                self.byid.pop_first()

    @rule(keys=st.lists(st.integers(0, 6 * SLACK), max_size=3 * SLACK))
    def many(self, keys: list[int]) -> None:
        for key in keys:
            self.byid[key] = "m"
            self.model[key] = "m"
        for key in keys[::2]:
            if key in self.model:
                del self.byid[key]
                del self.model[key]

    @precondition(lambda self: len(self.walks) < 3)
    @rule(after=st.none() | IDS)
    def begin(self, after: int | None) -> None:
        self.walks.append((self.byid.keys() if after is None else self.byid.keys(after), []))

    @precondition(lambda self: self.walks)
    @rule(steps=st.integers(1, 5))
    def step(self, steps: int) -> None:
        walk, seen = self.walks[0]
        for _ in range(steps):
            key = next(walk, None)  # type: ignore[call-overload]
            if key is None:
                self.walks.pop(0)
                return
            assert key in self.model
            assert not seen or key > seen[-1]
            seen.append(key)

    @invariant()
    def same(self) -> None:
        ordered = sorted(self.model)
        assert len(self.byid) == len(ordered)
        assert bool(self.byid) == bool(ordered)
        assert list(self.byid.keys()) == list(self.byid) == ordered
        assert list(self.byid.values()) == [self.model[k] for k in ordered]
        if ordered:
            assert self.byid.first_id() == ordered[0]
            assert self.byid.first() == self.model[ordered[0]]
            assert self.byid.last_id() == ordered[-1]
            middle = ordered[len(ordered) // 2]
            assert list(self.byid.keys(after=middle)) == [k for k in ordered if k > middle]
        for key in (0, 7, SLACK):
            assert (key in self.byid) == (key in self.model)


TestById = Model.TestCase
TestById.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)


def test_built_from_pairs_in_any_order() -> None:
    byid = ById([(5, "e"), (1, "a"), (3, "c")])
    assert list(byid.keys()) == [1, 3, 5]
    assert byid.pop_first() == "a"
    byid[0] = "z"  # below the head: the spent slot is used
    assert list(byid.values()) == ["z", "c", "e"]


def test_a_walk_sees_puts_past_it_and_skips_what_went() -> None:
    byid = ById((k, str(k)) for k in range(10))
    walk = byid.keys()
    assert [next(walk), next(walk)] == [0, 1]
    del byid[2]
    byid[20] = "20"
    byid[5] = "five"
    byid.pop_first()
    assert list(walk) == [3, 4, 5, 6, 7, 8, 9, 20]


def test_a_walk_goes_on_in_the_list_rebuilt_under_it() -> None:
    byid = ById((k, str(k)) for k in range(4 * SLACK))
    walk = byid.keys()
    assert next(walk) == 0
    for k in range(1, 4 * SLACK - 1):  # stale ids past SLACK and past the live: rebuilt
        del byid[k]
    byid[10 * SLACK] = "new"
    assert list(walk) == [4 * SLACK - 1, 10 * SLACK]
