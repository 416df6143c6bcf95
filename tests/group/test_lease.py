"""The local lease deadline: what an acknowledgement checks after its fsync."""

from cqsd.group.lease import DRIFT, MARGIN, LeaseClock, now


def test_a_granted_lease_counts_less_than_its_ttl_from_when_it_was_asked():
    """A 5 s lease asked for at t=100 is trusted until 100 + 5*(1-DRIFT) - MARGIN."""
    clock = LeaseClock()
    clock.granted(7, 5, sent_at=100.0)
    deadline = 100.0 + 5 * (1 - DRIFT) - MARGIN
    assert clock.valid(deadline - 0.001) and not clock.valid(deadline)
    assert clock.left(100.0) == deadline - 100.0 and clock.left(200.0) == 0


def test_a_late_answer_to_an_early_keepalive_never_extends_past_its_sending():
    """Validity runs from when the keep-alive was sent, however late it is answered."""
    clock = LeaseClock()
    clock.granted(7, 5, sent_at=100.0)
    clock.renewed(5, sent_at=101.0)
    assert clock.valid_until == 101.0 + 5 * (1 - DRIFT) - MARGIN
    clock.renewed(5, sent_at=100.5)  # an older keep-alive answered last moves nothing back
    assert clock.valid_until == 101.0 + 5 * (1 - DRIFT) - MARGIN


def test_a_keepalive_answered_with_ttl_zero_fences_at_once():
    """etcd saying the lease is gone ends validity now, whatever the deadline was."""
    clock = LeaseClock()
    clock.granted(7, 5, sent_at=100.0)
    clock.renewed(0, sent_at=101.0)
    assert not clock.valid(101.0) and clock.lease == 0


def test_renewal_is_due_a_third_of_the_way_through():
    """The next keep-alive goes early enough that two more can fail before the deadline."""
    clock = LeaseClock()
    clock.granted(7, 6, sent_at=0.0)
    assert 1.5 < clock.renew_at() < 2.0


def test_the_clock_is_boottime_and_moves_forward():
    """now() reads a clock that only goes forward."""
    a = now()
    assert now() >= a > 0
