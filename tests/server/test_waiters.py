"""Readers waiting for a message are served first come, first served, each
with at most a reply's worth, and woken unserved when their structure fails."""

import trio
import trio.testing

from cqsd.engine import QueueType, Structure
from cqsd.server.waiters import ReadWaiters, Waiter, read_up_to

KEY = (QueueType.TRAN, "Q")
BUDGET = 100  # payload bytes a reply may carry


def structure():
    return Structure("S", 1 << 20)


def put(s, *payloads, key=KEY):
    return [s.put(key[0], key[1], p).entry_id for p in payloads]


async def wait_for(waiter, woken):
    await waiter.event.wait()
    woken.append(waiter)


async def test_the_oldest_waiter_gets_the_first_message(nursery):
    """Two readers wait on one queue: the first put serves the first of them, the
    second put the second."""
    s, waiters, woken = structure(), ReadWaiters(BUDGET), []
    first, second = Waiter("A", 1), Waiter("B", 1)
    for w in (first, second):
        waiters.add(s, KEY, w)
        nursery.start_soon(wait_for, w, woken)
    [one] = put(s, b"1")
    waiters.serve(s)
    await trio.testing.wait_all_tasks_blocked()
    assert woken == [first] and [e.entry_id for e in first.messages] == [one]
    assert first.messages[0].owner == "A" and waiters.count("S", KEY) == 1
    [two] = put(s, b"2")
    waiters.serve(s)
    await trio.testing.wait_all_tasks_blocked()
    assert woken == [first, second] and [e.entry_id for e in second.messages] == [two]
    assert waiters.count("S", KEY) == 0 and KEY not in s.watched


async def test_a_batch_waiter_takes_what_fits_and_leaves_the_rest_for_the_next():
    """A waiter for ten messages gets them until its reply passes the byte budget
    (one message more at most); the next waiter gets the rest."""
    s, waiters = structure(), ReadWaiters(BUDGET)
    big, small = Waiter("A", 10), Waiter("B", 10)
    waiters.add(s, KEY, big)
    waiters.add(s, KEY, small)
    ids = put(s, *[b"x" * 60] * 4)
    waiters.serve(s)
    assert [e.entry_id for e in big.messages] == ids[:2]
    assert [e.entry_id for e in small.messages] == ids[2:]


def test_read_up_to_stops_at_n_at_the_budget_or_when_the_queue_is_empty():
    """read_up_to locks at most n messages, stops once past the budget, and
    returns what there was when the queue runs dry."""
    s = structure()
    ids = put(s, *[b"x" * 30] * 6)
    assert [e.entry_id for e in read_up_to(s, "A", KEY, 2, BUDGET)] == ids[:2]
    assert [e.entry_id for e in read_up_to(s, "A", KEY, 10, 50)] == ids[2:4]
    assert [e.entry_id for e in read_up_to(s, "A", KEY, 10, BUDGET)] == ids[4:]
    assert read_up_to(s, "A", KEY, 10, BUDGET) == []


async def test_a_put_on_another_queue_serves_nobody():
    """Only the queue a waiter watches can serve it."""
    s, waiters = structure(), ReadWaiters(BUDGET)
    waiter = Waiter("A", 1)
    waiters.add(s, KEY, waiter)
    put(s, b"elsewhere", key=(QueueType.TRAN, "OTHER"))
    waiters.serve(s)
    assert waiter.messages is None and not waiter.event.is_set()


async def test_a_waiter_that_gave_up_is_forgotten():
    """A removed waiter (its wait ran out) is not served, and its queue is no
    longer watched, so a put there marks nothing readable."""
    s, waiters = structure(), ReadWaiters(BUDGET)
    waiter = Waiter("A", 1)
    waiters.add(s, KEY, waiter)
    waiters.remove(s, KEY, waiter)
    put(s, b"1")
    assert not s.readable and KEY not in s.watched
    waiters.serve(s)
    assert waiter.messages is None


async def test_a_failed_structure_wakes_every_waiter_unserved(nursery):
    """fail() wakes the waiters of every queue of the structure, marked failed,
    with no messages, and leaves nothing watched."""
    s, waiters, woken = structure(), ReadWaiters(BUDGET), []
    on_q, on_r = Waiter("A", 1), Waiter("B", 1)
    waiters.add(s, KEY, on_q)
    waiters.add(s, (QueueType.LTERM, "R"), on_r)
    for w in (on_q, on_r):
        nursery.start_soon(wait_for, w, woken)
    await trio.testing.wait_all_tasks_blocked()
    waiters.fail(s)
    await trio.testing.wait_all_tasks_blocked()
    assert set(woken) == {on_q, on_r}
    assert all(w.failed and w.messages is None for w in woken)
    assert not s.watched and waiters.count("S", KEY) == 0
