"""The fdatasyncs of the data sets: which were written since the last one, and
whether a record appended now must wait for the next (journal.py holds it back).

Design note. A recoverable offloaded put writes its blocks on the event loop
(datasets.py); the log record naming them may not reach the log before they
are on disk. This room remembers the data sets written since the last sync and
whether any were (``take_unsynced``, asked by the journal for each record), and
syncs them all in one worker thread when the flusher asks (``sync``): every put
waiting on a data set shares one fdatasync (group commit). A sync that fails
names the data set; the caller makes it FAILED.
"""

import trio

from ...smds import SmdsError
from ...smds.dataset import DataSet

Failures = list[tuple[DataSet, Exception]]


class Syncs:
    def __init__(self) -> None:
        self._dirty: set[DataSet] = set()  # written since the last sync
        self.lock = trio.Lock()  # held while a worker thread fdatasyncs open data sets
        self.unsynced = False  # a recoverable offloaded put since the last take_unsynced

    def wrote(self, dataset: DataSet) -> None:
        """A recoverable message's blocks were written to ``dataset``."""
        self._dirty.add(dataset)
        self.unsynced = True

    def forget(self, dataset: DataSet) -> None:
        """``dataset`` is closed or abandoned: nothing of it is synced any more."""
        self._dirty.discard(dataset)

    def take_unsynced(self) -> bool:
        """Whether a record appended now must wait for ``sync`` (it names blocks
        written since the last one)."""
        unsynced, self.unsynced = self.unsynced, False
        return unsynced

    async def sync(self) -> Failures:
        """fdatasync every data set written since the last call, in a worker thread
        (taken once no command is closing one: a close fsyncs it itself); the data
        sets that failed, with why."""
        async with self.lock:
            dirty, self._dirty = self._dirty, set()
            if not dirty:
                return []
            return await trio.to_thread.run_sync(sync_all, list(dirty))

    def sync_now(self) -> Failures:
        """``sync`` on the loop, for the stop path."""
        dirty, self._dirty = self._dirty, set()
        return sync_all(list(dirty))


def sync_all(datasets: list[DataSet]) -> Failures:
    failed: Failures = []
    for dataset in datasets:
        try:
            dataset.sync()
        except (SmdsError, ValueError) as err:  # ValueError: abandoned after damage meanwhile
            failed.append((dataset, err))
    return failed
