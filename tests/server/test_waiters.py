"""Readers waiting for a message are served first come, first served, each
with at most a reply's worth, answered unserved when their structure fails,
and timed out by one timer for all of them."""

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


def waiter(client, n=1, wait=60.0):
    return Waiter(None, 1, client, n, None, wait)


def answering(budget=BUDGET):
    """ReadWaiters whose answers are kept, in order."""
    waiters, answered = ReadWaiters(budget), []
    waiters.answer = answered.append
    return waiters, answered


async def test_the_oldest_waiter_gets_the_first_message():
    """Two readers wait on one queue: the first put serves the first of them, the
    second put the second; each is answered only when the settle asks
    (answer_served), once its locks are logged."""
    s, (waiters, answered) = structure(), answering()
    first, second = waiter("A"), waiter("B")
    for w in (first, second):
        waiters.park(s, KEY, w)
    [one] = put(s, b"1")
    waiters.serve(s)
    assert answered == [] and waiters.served == [first]
    waiters.answer_served()
    assert answered == [first] and [e.entry_id for e in first.messages] == [one]
    assert first.messages[0].owner == "A" and waiters.count("S", KEY) == 1
    [two] = put(s, b"2")
    waiters.serve(s)
    waiters.answer_served()
    assert answered == [first, second] and [e.entry_id for e in second.messages] == [two]
    assert waiters.count("S", KEY) == 0 and KEY not in s.watched


async def test_a_batch_waiter_takes_what_fits_and_leaves_the_rest_for_the_next():
    """A waiter for ten messages gets them until its reply passes the byte budget
    (one message more at most); the next waiter gets the rest."""
    s, (waiters, _) = structure(), answering()
    big, small = waiter("A", 10), waiter("B", 10)
    waiters.park(s, KEY, big)
    waiters.park(s, KEY, small)
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
    s, (waiters, answered) = structure(), answering()
    w = waiter("A")
    waiters.park(s, KEY, w)
    put(s, b"elsewhere", key=(QueueType.TRAN, "OTHER"))
    waiters.serve(s)
    waiters.answer_served()
    assert w.messages is None and answered == [] and not w.done


async def test_a_waiter_whose_wait_runs_out_is_answered_by_the_timer_and_forgotten(
        nursery, autojump_clock):
    """One timer task answers each waiter at its deadline, earliest first, even one
    parked after the timer went to sleep on a later one; a timed-out waiter is not
    served, and its queue is no longer watched, so a put there marks nothing
    readable."""
    s, waiters, answered, both = structure(), ReadWaiters(BUDGET), [], trio.Event()

    def answer(w):
        answered.append((w, trio.current_time() - started))
        if len(answered) == 2:
            both.set()

    waiters.answer = answer
    nursery.start_soon(waiters.run)
    late, early = waiter("A", wait=10.0), waiter("B", wait=2.0)
    started = trio.current_time()
    waiters.park(s, KEY, late)
    await trio.testing.wait_all_tasks_blocked()  # the timer sleeps until 10 s
    waiters.park(s, KEY, early)
    await both.wait()
    assert [w for w, _ in answered] == [early, late]
    assert [round(t) for _, t in answered] == [2, 10]
    assert early.messages is None and late.messages is None
    put(s, b"1")
    assert not s.readable and KEY not in s.watched
    waiters.serve(s)
    assert waiters.served == []


async def test_served_waiters_leave_the_timer_nothing_to_do(nursery, autojump_clock):
    """Waiters served long before their deadline are not answered again when it
    comes, and the timer's heap keeps only a bounded number of them."""
    s, (waiters, answered) = structure(), answering()
    nursery.start_soon(waiters.run)
    for _ in range(1000):
        waiters.park(s, KEY, waiter("A"))
        put(s, b"x")
        waiters.serve(s)
        waiters.answer_served()
    assert len(answered) == 1000 and len(set(map(id, answered))) == 1000
    assert len(waiters._deadlines) <= 64
    await trio.sleep(120)
    assert len(answered) == 1000


async def test_a_failed_structure_answers_every_waiter_unserved():
    """fail() answers the waiters of every queue of the structure, marked failed,
    with no messages, and leaves nothing watched."""
    s, (waiters, answered) = structure(), answering()
    on_q, on_r = waiter("A"), waiter("B")
    waiters.park(s, KEY, on_q)
    waiters.park(s, (QueueType.LTERM, "R"), on_r)
    waiters.fail(s)
    assert set(answered) == {on_q, on_r}
    assert all(w.failed and w.messages is None for w in answered)
    assert not s.watched and waiters.count("S", KEY) == 0
