"""The one timer of leases and delayed puts (timers.py) sleeps until the earliest
deadline any pair holds, at most RECHECK, and on waking expires and ripens what
is due in every pair, then settles once. Fake pairs stand in for the engine."""

import time

import trio
import trio.testing

from cqsd.server.runtime import Runtime
from cqsd.server.timers import RECHECK, Timers


class Pair:
    def __init__(self, name, expiry=None, due=None):
        self.name, self.expiry, self.due = name, expiry, due
        self.expired, self.ripened = [], []

    def next_expiry(self):
        return self.expiry

    def next_due(self):
        return self.due

    def expire(self, mono, spared):
        self.expired.append(set(spared))
        return []

    def ripen(self, wall):
        self.ripened.append(wall)
        return []


class Registry:
    def __init__(self, *pairs):
        self.pairs = {p.name: p for p in pairs}


def test_the_sleep_is_the_earliest_deadline_of_any_pair():
    """A lease on the monotonic clock and a delay on the wall clock: the sooner wins."""
    mono, wall = time.monotonic(), time.time_ns()
    registry = Registry(Pair("A", expiry=mono + 30), Pair("B", due=wall + 5 * 10**9))
    seconds = Timers(registry, Runtime(), set).wait()
    assert 4 < seconds <= 5


def test_with_no_deadline_the_timer_rechecks_the_wall_clock():
    """Nothing due anywhere: it wakes after RECHECK seconds, to notice a clock set
    forward or back; a deadline already past gives no wait at all."""
    assert Timers(Registry(Pair("A")), Runtime(), set).wait() == RECHECK
    past = Registry(Pair("A", expiry=time.monotonic() - 1))
    assert Timers(past, Runtime(), set).wait() == 0.0


async def test_firing_expires_and_ripens_every_pair_then_settles_once(journal, nursery):
    """fire passes the spared owners to each pair's expiry, ripens each pair, and
    settles what they did in one step."""
    a, b, settled = Pair("A"), Pair("B"), []
    runtime = Runtime()
    runtime.bind(nursery, lambda: settled.append(1) or 0, journal)
    Timers(Registry(a, b), runtime, lambda: {"HELD"}).fire()
    assert a.expired == b.expired == [{"HELD"}]
    assert len(a.ripened) == len(b.ripened) == 1 and settled == [1]


async def test_a_poke_wakes_the_timer_to_work_out_its_sleep_again(journal, nursery):
    """A request that sets an earlier deadline pokes the timer, which fires at once
    rather than sleeping on toward the later one."""
    pair, settled = Pair("A"), []
    runtime = Runtime()
    runtime.bind(nursery, lambda: settled.append(1) or 0, journal)
    timers = Timers(Registry(pair), runtime, set)
    nursery.start_soon(timers.run)
    await trio.testing.wait_all_tasks_blocked()
    assert settled == []  # sleeping toward RECHECK
    timers.poke()
    await trio.testing.wait_all_tasks_blocked()
    assert settled == [1] and len(pair.ripened) == 1
