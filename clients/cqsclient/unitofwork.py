"""The bookkeeping of a unit of work, shared by the blocking and async clients.

Design note
-----------
A unit of work is MQ's syncpoint over cqsd's ``commit`` request: reads happen
at once (the message must be locked before the application can work on it),
while puts, deletes, moves and unlocks are only *gathered*; on a successful
exit they go to the daemon as one ``commit``, which it applies atomically and
logs as one record. So ``put``, ``delete``, ``move`` and ``unlock`` are plain
(synchronous) methods in both clients: they do no I/O, and an ``await`` on them
would suggest something happened when nothing has. ``read`` is the only method
that talks to the daemon before the end.

Leaving the block with an exception, or a commit the daemon refuses, sends
nothing of what was gathered and gives back (a plain unlock, which does not
count as a failed delivery) every message the unit of work read: nothing it
did is left behind. An unlock answered with ENTRY_NOT_FOUND or LOCK_NOT_HELD
means the message was already dealt with outside the unit of work and is
skipped. After a lost connection nothing is sent: the daemon's peer recovery
releases the locks of a client that dropped; unless the client reconnects, which
takes the locks back (warm resync), so it gives them back on the new
connection. A commit whose reply was lost may or may not have been applied:
ConnectionLost says so, and the give-back skips what the commit deleted.

Messages read but not named by any gathered op stay locked by the client
after a successful commit, exactly as after a plain ``read``; delete, move or
unlock them (inside the unit of work, to make it atomic).
"""

from __future__ import annotations

from typing import Any

from . import ops
from .errors import ConnectionLost, CQSError, EntryNotFound, LockNotHeld
from .model import Message
from .ops import Call, Payload, QType

__all__ = ["UnitOfWorkBase"]

# Unlock failures that mean "already released elsewhere", not a problem.
ALREADY_RELEASED = (EntryNotFound, LockNotHeld)


class UnitOfWorkBase:
    """The gathered ops and the messages read; subclasses add ``read`` and the context."""

    def __init__(self, structure: str, max_message: int | None) -> None:
        self.structure = structure
        self._max_message = max_message
        self._ops: list[dict[str, Any]] = []
        self._read_ids: list[int] = []
        self._closed = False
        self.entry_ids: list[int] = []
        """The entry ids of the gathered puts, in order, once the commit succeeded."""

    @property
    def ops(self) -> list[dict[str, Any]]:
        """The commit ops gathered so far (a copy)."""
        return list(self._ops)

    @property
    def read_ids(self) -> list[int]:
        """The entry ids this unit of work has read and locked, in order."""
        return list(self._read_ids)

    def put(
        self, queue: str, data: Payload, qtype: QType = "TRAN", recoverable: bool = True,
        *, delay: float | None = None, not_before: float | None = None,
    ) -> None:
        """Gather a put (delayed by *delay* seconds from the commit, or until epoch
        seconds *not_before*); its entry id is in ``entry_ids`` after the commit.

        Raises MessageTooLarge at once if *data* exceeds the server's max_message.
        """
        self._check_open()
        self._ops.append(ops.put_op(queue, data, qtype, recoverable, self._max_message,
                                    delay, not_before))

    def delete(self, entry_id: int) -> None:
        """Gather the delete of a message (normally one this unit of work read)."""
        self._check_open()
        self._ops.append(ops.delete_op(entry_id))

    def move(self, entry_id: int, queue: str, qtype: QType = "TRAN") -> None:
        """Gather the move of a message to another queue."""
        self._check_open()
        self._ops.append(ops.move_op(entry_id, queue, qtype))

    def unlock(
        self,
        entry_id: int,
        failed: bool = False,
        queue: str | None = None,
        qtype: QType | None = None,
    ) -> None:
        """Gather an unlock (``failed`` counts a failed delivery; ``queue`` moves it)."""
        self._check_open()
        self._ops.append(ops.unlock_op(entry_id, failed, queue, qtype))

    # --- for the subclasses ---

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this unit of work has already ended")

    def _note_read(self, messages: list[Message]) -> None:
        self._read_ids.extend(m.entry_id for m in messages)

    def _commit_call(self) -> Call | None:
        """The commit to send on success, or None when nothing was gathered."""
        self._closed = True
        if not self._ops:
            return None
        return ops.commit(self.structure, self._ops)

    def _gives_back(self, cause: BaseException, reconnects: bool) -> bool:
        """Whether to send the give-back unlocks after *cause* (see the design note)."""
        if isinstance(cause, ConnectionLost) and not reconnects:
            self._closed = True
            return False
        return True

    def _giveback_calls(self) -> list[Call]:
        """The plain unlocks that give back every message read, for an abort."""
        self._closed = True
        return [ops.unlock(self.structure, entry_id) for entry_id in self._read_ids]

    @staticmethod
    def _note_giveback_error(cause: BaseException | None, entry_id: int, error: CQSError) -> None:
        # The unit of work already failed with *cause*; an unlock error must not
        # hide it, but the operator should hear that the message stayed locked.
        if cause is not None:
            cause.add_note(f"could not give back entry {entry_id}: {error}")
