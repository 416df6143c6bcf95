"""Lock leases and delayed puts: what ``expire`` and ``ripen`` do, one case at a time."""

import pytest

from cqsd.engine import CQSError, Put, QueueType, QueueWork, Structure
from cqsd.engine.qtypes import DELAYED_LH

S = 10**9  # ns in a second


class Clocks:
    """A wall clock in ns (ids, put times, not_before) and a monotonic one in seconds."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_000 * S, 50.0

    def structure(self, **kw) -> Structure:
        return Structure("S", 1 << 20, clock=lambda: self.wall, ticks=lambda: self.mono, **kw)


@pytest.fixture
def clocks():
    return Clocks()


def raises(reason):
    return pytest.raises(CQSError, match=f"^{reason}")


def test_an_unrenewed_lease_expires_as_a_failed_delivery(clocks):
    """At its deadline the lock goes back to its place, counted; its holder can no
    longer delete it, and the next reader gets it with delivery count 2."""
    s = clocks.structure()
    e = s.put("TRAN", "Q", b"x")
    s.read("IMS1", "TRAN", "Q", lease=30.0)
    clocks.mono += 29.9
    assert s.expire(clocks.mono) == []
    clocks.mono += 0.1
    assert s.expire(clocks.mono) == [e]
    with raises("LOCK_NOT_HELD"):
        s.delete("IMS1", e.entry_id)
    assert s.read("IMS2", "TRAN", "Q").delivery_count == 2
    assert s.counts.expiries == 1


def test_a_renew_moves_the_deadline_and_is_logged(clocks):
    """A renew starts the lease again from now; the old deadline passes harmlessly."""
    s = clocks.structure()
    e = s.put("TRAN", "Q", b"x")
    s.read("IMS1", "TRAN", "Q", lease=10.0)
    clocks.mono += 8
    s.effects.clear()
    s.renew("IMS1", e.entry_id, 10.0)
    assert s.effects == [("T", e.entry_id, 10 * S, clocks.wall + 10 * S)]
    clocks.mono += 5
    assert s.expire(clocks.mono) == [] and s.next_expiry() == 68.0
    with raises("LOCK_NOT_HELD"):
        s.renew("IMS2", e.entry_id, 10.0)


def test_expiries_count_toward_max_deliveries_and_suspend(clocks):
    """An expiry is a failed delivery: the last one allowed sends it to the suspend queue."""
    s = clocks.structure(max_deliveries=2)
    e = s.put("TRAN", "Q", b"x")
    for _ in range(2):
        s.read("IMS1", "TRAN", "Q", lease=1.0)
        clocks.mono += 1
        s.expire(clocks.mono)
    assert (e.qtype, e.home, e.where) == (QueueType.TRAN_SUSPEND, (QueueType.TRAN, "Q"), "ready")


def test_a_spared_owner_s_lease_expires_without_a_failed_delivery(clocks):
    """A lock a restart found goes back as it was: not suspended, however often read."""
    s = clocks.structure(max_deliveries=1)
    e = s.put("TRAN", "Q", b"x")
    s.read("IMS1", "TRAN", "Q", lease=1.0)
    clocks.mono += 1
    assert s.expire(clocks.mono, spared={"IMS1"}) == [e]
    assert e.qtype == QueueType.TRAN


def test_a_lease_ended_by_unlock_or_delete_never_fires(clocks):
    """Lazy deletion: the stale heap item is skipped, and next_expiry does not wake for it."""
    s = clocks.structure()
    a, b = s.put("TRAN", "Q", b"a"), s.put("TRAN", "Q", b"b")
    s.read("IMS1", "TRAN", "Q", lease=1.0)
    s.read("IMS1", "TRAN", "Q", lease=2.0)
    s.unlock("IMS1", a.entry_id)
    s.delete("IMS1", b.entry_id)
    assert s.next_expiry() is None
    clocks.mono += 5
    assert s.expire(clocks.mono) == [] and a.delivery_count == 1


def test_a_restored_lease_runs_for_the_wall_clock_time_it_had_left(clocks):
    """Restart: the logged wall-clock deadline becomes a monotonic one on this clock."""
    s = clocks.structure()
    row = [7, 1, "Q", b"x", True, 1, 1, "locked", "IMS1", None, None,
           [30 * S, clocks.wall + 12 * S], None]
    s.load([row])
    assert s.next_expiry() == clocks.mono + 12
    late = clocks.structure()
    late.load([[*row[:11], [30 * S, clocks.wall - 5 * S], None]])
    assert late.next_expiry() == clocks.mono  # already due: at the next expire


def test_a_delayed_put_is_invisible_until_its_time_then_fifo_by_id(clocks):
    """Not readable, not in its queue's browse, not its depth; once due it is read
    before a message put after it without a delay."""
    s = clocks.structure()
    later = s.put("TRAN", "Q", b"later", not_before=clocks.wall + 5 * S)
    assert s.take_events() == []  # no work yet
    with raises("NO_MESSAGE"):
        s.read("IMS1", "TRAN", "Q")
    now = s.put("TRAN", "Q", b"now")
    assert [e.entry_id for e in s.browse("TRAN", "Q")[0]] == [now.entry_id]
    assert s.queue_stats("TRAN", "Q")["depth"] == 1
    assert s.queue_stats("TRAN", "Q")["delayed"] == 1
    s.read("IMS1", "TRAN", "Q")
    s.take_events()
    assert s.next_due() == clocks.wall + 5 * S
    assert s.ripen(clocks.wall + 5 * S) == [later]
    assert s.take_events() == [QueueWork("S", QueueType.TRAN, "Q")]
    assert s.read("IMS2", "TRAN", "Q") is later


def test_a_waiter_s_key_becomes_readable_when_a_delayed_put_ripens(clocks):
    """A watched queue is marked readable by the ripening, as by a put."""
    s = clocks.structure()
    s.watched.add((QueueType.TRAN, "Q"))
    s.put("TRAN", "Q", b"x", not_before=clocks.wall + 1)
    assert not s.readable
    s.ripen(clocks.wall + 1)
    assert s.readable == {(QueueType.TRAN, "Q")}


def test_a_past_not_before_is_no_delay_and_is_not_logged(clocks):
    """A not_before already passed is an ordinary put: ready, no N effect."""
    s = clocks.structure()
    e = s.put("TRAN", "Q", b"x", not_before=clocks.wall)
    assert e.where == "ready" and e.not_before is None
    assert [effect[0] for effect in s.effects] == ["P"]


def test_a_delayed_message_moved_keeps_its_time_and_the_operator_sees_it(clocks):
    """Move takes it to another queue, still delayed; browse-all shows it on its own
    list header; an operator delete takes it; commits delay puts too."""
    s = clocks.structure()
    e = s.put("TRAN", "Q", b"x", not_before=clocks.wall + S)
    s.move(None, e.entry_id, "TRAN", "R")
    assert (e.where, e.name) == ("delayed", "R")
    assert s.queue_stats("TRAN", "R")["delayed"] == 1
    assert [x.entry_id for x in s.browse()[0]] == [e.entry_id]
    assert [r["lh"] for r in s.header_stats()] == [DELAYED_LH]
    (c,) = s.commit("IMS1", [Put("TRAN", "R", b"y", not_before=clocks.wall + S)])
    assert c.where == "delayed" and s.stats()["delayed"] == 2
    s.delete(None, e.entry_id)
    assert s.ripen(clocks.wall + S) == [c]
