"""Overflow moves (overflowmoves.py) carry out what the engine's relief decides:
one task of moves per pair, batch after batch, each batch settled (one log
record) with the requests that arrived meanwhile served in between. A fake pair
stands in for the engine."""

import structlog
import trio
import trio.testing

from cqsd.engine import CQSError, Reason, Relief
from cqsd.server.overflowmoves import OverflowMoves
from cqsd.server.runtime import Runtime


class Pair:
    def __init__(self, batches, relief=None):
        self.name = "P"
        self.batches = batches  # messages each move_some moves, in turn
        self.relief = relief if relief is not None else Relief(selected=[{"queue": "Q"}])
        self.overflow = type("Overflow", (), {"name": "POV"})()

    @property
    def moving(self):
        return bool(self.batches)

    def relieve(self):
        if isinstance(self.relief, Exception):
            raise self.relief
        return self.relief

    def move_some(self):
        return self.batches.pop(0)


def moves(pair, journal, nursery, settled):
    runtime = Runtime()
    runtime.bind(nursery, lambda: settled.append(len(pair.batches)) or 0, journal)
    registry = type("Registry", (), {"pairs": {"P": pair}})()
    return OverflowMoves(registry, runtime)


async def test_the_moves_run_batch_by_batch_each_settled(journal, nursery):
    """Selected queues are moved in batches until none is left, each batch settled
    before the next, and the total is logged."""
    pair, settled = Pair([3, 2, 1]), []
    with structlog.testing.capture_logs() as logs:
        moves(pair, journal, nursery, settled).relieve(pair)
        await trio.testing.wait_all_tasks_blocked()
    assert settled == [2, 1, 0] and not pair.moving
    [done] = [e for e in logs if e["event"] == "overflow_moved"]
    assert (done["structure"], done["overflow"], done["messages"]) == ("P", "POV", 6)


async def test_one_mover_per_pair_however_often_it_is_relieved(journal, nursery):
    """A pair relieved again while its moves run gets no second task."""
    pair, settled = Pair([1, 1]), []
    room = moves(pair, journal, nursery, settled)
    room.relieve(pair)
    room.relieve(pair)
    await trio.testing.wait_all_tasks_blocked()
    assert settled == [1, 0]


async def test_a_relief_the_engine_refuses_is_logged_and_moves_nothing(journal, nursery):
    """A CQSError from the engine's relief is an event, not a failed settle."""
    pair, settled = Pair([1], relief=CQSError(Reason.STRUCTURE_FULL, "no room")), []
    with structlog.testing.capture_logs() as logs:
        moves(pair, journal, nursery, settled).relieve(pair)
        await trio.testing.wait_all_tasks_blocked()
    assert settled == [] and pair.batches == [1]
    assert [e["error"] for e in logs if e["event"] == "overflow_relief_failed"] == ["no room"]
