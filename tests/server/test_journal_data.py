"""The journal keeps the data sets' rule in one place: a record naming blocks
written outside the log reaches the log only after its DataSync has made them
durable, and the DataSync hears of each durable LSN. A fake DataSync stands in
for the data sets."""

import pytest
import trio
import trio.testing

import logstream
from cqsd.server.journal import Journal, NoData

from .conftest import RECORD, SEGMENT


class FakeData:
    """A DataSync that says when blocks were written, and records what it is asked."""

    def __init__(self):
        self.unsynced = False
        self.synced = []  # the journal's position at each sync
        self.durables = []
        self.release = trio.Event()
        self.journal = None

    def take_unsynced(self):
        unsynced, self.unsynced = self.unsynced, False
        return unsynced

    async def sync(self):
        self.synced.append(self.journal.position)
        await self.release.wait()

    def sync_now(self):
        self.synced.append(("now", self.journal.position))

    def durable(self, lsn):
        self.durables.append(lsn)


@pytest.fixture
def data_journal(tmp_path):
    data = FakeData()
    j = Journal(tmp_path / "log", SEGMENT, data)
    data.journal = j
    yield j, data
    j.close()


async def test_a_record_after_blocks_waits_for_the_data_sync(data_journal, nursery):
    """A record logged after blocks were written is held back until the data sync
    has run; one logged with no blocks written goes through without one."""
    journal, data = data_journal
    nursery.start_soon(journal.run)
    assert journal.log([RECORD], urgent=True) == 1
    assert await journal.wait_durable(1)
    assert data.synced == []
    data.unsynced = True
    assert journal.log([RECORD], urgent=True) == 2
    await trio.testing.wait_all_tasks_blocked()
    assert data.synced == [2] and journal.writer.appended_lsn == 1  # held back
    data.release.set()
    assert await journal.wait_durable(2)
    assert journal.writer.appended_lsn == 2


async def test_every_part_of_a_split_record_follows_the_same_blocks(data_journal, nursery):
    """The parts of one request's record are asked about the blocks once: all wait
    for the same sync, and keep their order."""
    journal, data = data_journal
    data.unsynced = True
    parts = [{"s": "S", "e": [("D", n)]} for n in (1, 2, 3)]
    assert journal.log(parts, urgent=True) == 3
    assert not data.unsynced
    data.release.set()
    nursery.start_soon(journal.run)
    assert await journal.wait_durable(3)
    assert data.synced == [3]
    assert [r.body["e"][0][1] for r in logstream.read(journal.directory)] == [1, 2, 3]


async def test_the_data_sync_hears_each_durable_lsn(data_journal, nursery):
    """After each flush the DataSync is told how far the log is durable (the pages
    a delete freed become reusable then)."""
    journal, data = data_journal
    nursery.start_soon(journal.run)
    journal.log([RECORD], urgent=True)
    assert await journal.wait_durable(1)
    journal.log([RECORD], urgent=True)
    assert await journal.wait_durable(2)
    assert data.durables[-1] == 2 and data.durables == sorted(data.durables)


def test_a_clean_stop_syncs_the_data_on_the_loop_before_the_held_records(data_journal):
    """At a clean stop what is held back is written after sync_now, and made durable."""
    journal, data = data_journal
    data.unsynced = True
    journal.log([RECORD], urgent=True)
    journal.finish_held_back()
    assert data.synced == [("now", 1)] and journal.durable == 1


def test_a_journal_made_without_data_sets_never_holds_a_record_back(tmp_path):
    """With no DataSync given (NoData) no record waits for one."""
    journal = Journal(tmp_path / "log", SEGMENT)
    try:
        assert isinstance(journal.data, NoData)
        assert journal.log([RECORD], urgent=False) == 1
        assert journal.writer.appended_lsn == 1
    finally:
        journal.close()
