"""The STATUS / ACCESS and SMDSCONN STATUS / AVAIL tables: every transition seed 000
names, the states that refuse requests, and random histories that never reach a
pair of states the seed does not allow."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cqsd.smds.states import (
    TRIGGERED,
    Access,
    Avail,
    Change,
    Conn,
    Event,
    IllegalTransition,
    SmdsState,
    Status,
)

S, A, C, V, E = Status, Access, Conn, Avail, Event
ACTIVE = SmdsState(S.ACTIVE, A.ENABLED, C.CLOSED, V.NORMAL)
OPEN = SmdsState(S.ACTIVE, A.ENABLED, C.OPEN, V.NORMAL)


def run(state: SmdsState, *events: Event) -> SmdsState:
    for event in events:
        state, _ = state.process(event)
    return state


# (seed case, from, events, to)
CASES = [
    ("first activation: NEW, then ACTIVE once opened", SmdsState(),
     [E.ACTIVATE, E.OPEN, E.OPENED], OPEN),
    ("owned data set cannot be allocated: ALLOCFAIL, AVAIL(ERROR), ACCESS(SUSPENDED)", ACTIVE,
     [E.OPEN, E.ALLOC_FAIL], SmdsState(S.ACTIVE, A.SUSPENDED, C.ALLOCFAIL, V.ERROR)),
    ("owned data set cannot be opened: OPENFAIL", ACTIVE,
     [E.OPEN, E.OPEN_FAIL], SmdsState(S.ACTIVE, A.SUSPENDED, C.OPENFAIL, V.ERROR)),
    ("no storage for it: STGFAIL", ACTIVE,
     [E.OPEN, E.STORAGE_FAIL], SmdsState(S.ACTIVE, A.SUSPENDED, C.STGFAIL, V.ERROR)),
    ("header corrupt or unexpectedly empty at open: FAILED + SUSPENDED, DATAFAIL", ACTIVE,
     [E.OPEN, E.DATA_FAIL], SmdsState(S.FAILED, A.SUSPENDED, C.DATAFAIL, V.ERROR)),
    ("permanent I/O error after open: FAILED", OPEN,
     [E.DATA_FAIL], SmdsState(S.FAILED, A.SUSPENDED, C.DATAFAIL, V.ERROR)),
    ("start-smdsconn after an open failure retries and enables it again",
     SmdsState(S.ACTIVE, A.SUSPENDED, C.OPENFAIL, V.ERROR), [E.START, E.OPEN, E.OPENED], OPEN),
    ("reset-smds --access enabled retries a suspended data set",
     SmdsState(S.ACTIVE, A.SUSPENDED, C.ALLOCFAIL, V.ERROR), [E.ENABLE, E.OPEN, E.OPENED], OPEN),
    ("the error is still present: the retry suspends it again",
     SmdsState(S.ACTIVE, A.SUSPENDED, C.OPENFAIL, V.ERROR), [E.ENABLE, E.OPEN, E.OPEN_FAIL],
     SmdsState(S.ACTIVE, A.SUSPENDED, C.OPENFAIL, V.ERROR)),
    ("enabling a FAILED data set leaves it SUSPENDED",
     SmdsState(S.FAILED, A.DISABLED, C.CLOSED, V.NORMAL), [E.ENABLE],
     SmdsState(S.FAILED, A.SUSPENDED, C.CLOSED, V.NORMAL)),
    ("reset-smds --status failed: closed first, then FAILED + SUSPENDED", OPEN,
     [E.CLOSE, E.CLOSED, E.RESET_FAILED], SmdsState(S.FAILED, A.SUSPENDED, C.CLOSED, V.NORMAL)),
    ("reset-smds --status recovered: RECOVERED, ENABLED, the connection retried",
     SmdsState(S.FAILED, A.SUSPENDED, C.DATAFAIL, V.ERROR), [E.RESET_RECOVERED],
     SmdsState(S.RECOVERED, A.ENABLED, C.DATAFAIL, V.NORMAL)),
    ("restart processing after recovery makes it ACTIVE",
     SmdsState(S.RECOVERED, A.ENABLED, C.DATAFAIL, V.NORMAL), [E.OPEN, E.OPENED], OPEN),
    ("a premature RECOVERED goes back to FAILED at open (partial recovery)",
     SmdsState(S.RECOVERED, A.ENABLED, C.CLOSED, V.NORMAL), [E.OPEN, E.DATA_FAIL],
     SmdsState(S.FAILED, A.SUSPENDED, C.DATAFAIL, V.ERROR)),
    ("recover: FAILED -> INRECOVER -> RECOVERED, SUSPENDED -> ENABLED",
     SmdsState(S.FAILED, A.SUSPENDED, C.DATAFAIL, V.ERROR),
     [E.RECOVERY_START, E.RECOVERY_DONE], SmdsState(S.RECOVERED, A.ENABLED, C.DATAFAIL, V.NORMAL)),
    ("recovery finds an ACTIVE data set invalid: FAILED, then INRECOVER",
     SmdsState(S.ACTIVE, A.SUSPENDED, C.ALLOCFAIL, V.ERROR), [E.FOUND_INVALID, E.RECOVERY_START],
     SmdsState(S.INRECOVER, A.SUSPENDED, C.ALLOCFAIL, V.ERROR)),
    ("recovery that cannot complete: back to FAILED",
     SmdsState(S.FAILED, A.SUSPENDED, C.CLOSED, V.NORMAL), [E.RECOVERY_START, E.RECOVERY_FAIL],
     SmdsState(S.FAILED, A.SUSPENDED, C.CLOSED, V.NORMAL)),
    ("recover --purge: EMPTY, and ENABLED again",
     SmdsState(S.FAILED, A.SUSPENDED, C.DATAFAIL, V.ERROR), [E.PURGE],
     SmdsState(S.EMPTY, A.ENABLED, C.DATAFAIL, V.NORMAL)),
    ("the next open of an EMPTY data set makes it ACTIVE",
     SmdsState(S.EMPTY, A.ENABLED, C.CLOSED, V.NORMAL), [E.OPEN, E.OPENED], OPEN),
    ("closed normally holding no messages: EMPTY", OPEN, [E.CLOSE, E.CLOSED, E.CLOSE_EMPTY],
     SmdsState(S.EMPTY, A.ENABLED, C.CLOSED, V.NORMAL)),
    ("reset-smds --access disabled: closed, then DISABLED", OPEN, [E.CLOSE, E.CLOSED, E.DISABLE],
     SmdsState(S.ACTIVE, A.DISABLED, C.CLOSED, V.NORMAL)),
    ("reset-smds --access enabled after a move brings it back",
     SmdsState(S.ACTIVE, A.DISABLED, C.CLOSED, V.NORMAL), [E.ENABLE, E.OPEN, E.OPENED], OPEN),
    ("stop-smdsconn: closed normally, STOPPED", OPEN, [E.CLOSE, E.CLOSED, E.STOP],
     SmdsState(S.ACTIVE, A.ENABLED, C.CLOSED, V.STOPPED)),
    ("start-smdsconn: NORMAL, then open", SmdsState(S.ACTIVE, A.ENABLED, C.CLOSED, V.STOPPED),
     [E.START, E.OPEN, E.OPENED], OPEN),
    ("a recovered data set does not start a stopped connection",
     SmdsState(S.FAILED, A.SUSPENDED, C.CLOSED, V.STOPPED), [E.RESET_RECOVERED],
     SmdsState(S.RECOVERED, A.ENABLED, C.CLOSED, V.STOPPED)),
]


@pytest.mark.parametrize(("case", "start", "events", "end"), CASES, ids=[c[0] for c in CASES])
def test_every_seed_case(case, start, events, end):
    """Each case seed 000 names takes the states where it says."""
    assert run(start, *events) == end


def test_each_change_names_its_state_the_old_and_new_values_and_the_event():
    """One Change per state moved, triggered ones included, in order."""
    _, changes = OPEN.process(E.DATA_FAIL)
    assert changes == [Change("conn", "OPEN", "DATAFAIL", E.DATA_FAIL),
                       Change("avail", "NORMAL", "ERROR", E.DATA_FAIL),
                       Change("status", "ACTIVE", "FAILED", E.DAMAGE),
                       Change("access", "ENABLED", "SUSPENDED", E.DAMAGE)]
    assert ACTIVE.process(E.ENABLE) == (ACTIVE, [])


REFUSED = [
    (OPEN, E.DISABLE), (OPEN, E.RESET_FAILED), (OPEN, E.STOP), (OPEN, E.PURGE),
    (OPEN, E.OPEN), (ACTIVE, E.RESET_RECOVERED), (ACTIVE, E.RECOVERY_START),
    (ACTIVE, E.OPENED), (SmdsState(), E.OPEN), (SmdsState(S.FAILED, A.SUSPENDED), E.OPEN),
    (SmdsState(S.INRECOVER, A.SUSPENDED), E.RESET_FAILED),
    (SmdsState(S.INRECOVER, A.SUSPENDED), E.PURGE),
    (SmdsState(S.ACTIVE, A.DISABLED), E.OPEN), (SmdsState(avail=V.STOPPED), E.OPEN),
    (SmdsState(S.ACTIVE, A.SUSPENDED, C.OPENFAIL, V.ERROR), E.OPEN),
    (SmdsState(S.NOTFOUND), E.CLOSE_EMPTY), (SmdsState(S.EMPTY), E.ACTIVATE),
] + [(ACTIVE, e) for e in sorted(TRIGGERED, key=lambda e: e.name)]  # one order: xdist


@pytest.mark.parametrize(("state", "event"), REFUSED)
def test_events_a_state_does_not_allow_are_refused(state, event):
    """An event with no table entry in the state raises IllegalTransition."""
    with pytest.raises(IllegalTransition):
        state.process(event)


def legal_states():
    for values in itertools.product(S, A, C, V):
        state = SmdsState(*values)
        try:
            state.check()
        except AssertionError:
            continue
        yield state


@pytest.mark.parametrize("state", list(legal_states()), ids=str)
def test_requests_are_refused_in_every_state_but_open(state):
    """A data set serves requests only with its connection OPEN (so ACTIVE, ENABLED,
    NORMAL); every other legal state refuses them with words naming the state."""
    assert state.usable == (state.conn == C.OPEN)
    words = state.why_unavailable()
    if not state.usable:
        assert any(str(v) in words for v in (state.status, state.access, state.conn,
                                             state.avail))


def test_what_may_be_opened():
    """Restart processing opens NEW, ACTIVE, RECOVERED and EMPTY data sets that are
    not DISABLED and whose connection is NORMAL and closed."""
    openable = {(s.status, s.access, s.conn, s.avail) for s in legal_states() if s.may_open()}
    assert {s for s, _, _, _ in openable} == {S.NEW, S.ACTIVE, S.RECOVERED, S.EMPTY}
    assert {a for _, a, _, _ in openable} == {A.ENABLED, A.SUSPENDED}
    assert {v for _, _, _, v in openable} == {V.NORMAL}
    assert C.OPEN not in {c for _, _, c, _ in openable}


FIRED = [e for e in E if e not in TRIGGERED]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FIRED), max_size=60))
def test_random_histories_never_reach_an_illegal_pair_of_states(events):
    """Whatever events arrive in whatever order, a refused one changes nothing and an
    accepted one leaves a pair of states the seed allows."""
    state = SmdsState()
    for event in events:
        try:
            after, changes = state.process(event)
        except IllegalTransition:
            continue
        after.check()
        assert all(c.old != c.new for c in changes)
        assert {c.state for c in changes} == {
            n for n in ("status", "access", "conn", "avail")
            if getattr(state, n) != getattr(after, n)}
        state = after
