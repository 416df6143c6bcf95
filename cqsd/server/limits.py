"""Every size limit a request can hit, checked before the engine applies anything.

The frame limit is the decoder's (a request frame over ``max_message`` plus
``FRAME_HEADROOM`` never reaches a handler); ``max_message`` is the
operator's; a recoverable payload must fit one log record
(``recovery/records.py``), and so must all the recoverable payloads of one
commit, which is one record. The structure's space, staging segments
included, is the engine's to check (STRUCTURE_FULL), as are the commit's op
count (``protocol/requests.py``). A refusal names the limit so the caller
can act: split the unit of work, or put the message non-recoverable.
"""

from ..engine import CQSError, Put, Reason
from ..protocol.codec import MAX_FRAME_LIMIT
from ..recovery.records import EFFECT_BOUND, RECORD_BUDGET

FRAME_HEADROOM = 1024 * 1024  # room for a request's other fields around a max_message payload
# A reply's share of its frame beyond the payloads: ids, names, times per message.
REPLY_HEADROOM = 2 * FRAME_HEADROOM


class Limits:
    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.max_frame = min(max_message + FRAME_HEADROOM, MAX_FRAME_LIMIT)
        # Replies carry up to ``reply_bytes`` of payload plus one more message
        # (read and browse stop once past it), and their per-message fields.
        self.reply_bytes = max_message
        self.max_reply = min(2 * max_message + REPLY_HEADROOM, MAX_FRAME_LIMIT)
        self.recoverable = RECORD_BUDGET - EFFECT_BOUND  # one put's record

    def check_message(self, data: bytes, recoverable: bool) -> None:
        """Raises MESSAGE_TOO_LARGE past max_message, or past one log record if
        ``recoverable``."""
        if len(data) > self.max_message:
            raise CQSError(Reason.MESSAGE_TOO_LARGE,
                           f"message of {len(data)} bytes exceeds max_message {self.max_message}")
        if recoverable and len(data) > self.recoverable:
            raise CQSError(Reason.MESSAGE_TOO_LARGE,
                           f"recoverable message of {len(data)} bytes exceeds {self.recoverable}, "
                           "the most one log record holds; put it non-recoverable or smaller")

    def check_commit(self, batch: list) -> None:
        """Raises MESSAGE_TOO_LARGE if a commit's log record could not hold it."""
        logged = EFFECT_BOUND * len(batch)
        for op in batch:
            if type(op) is Put:
                self.check_message(op.data, op.recoverable)
                if op.recoverable:
                    logged += len(op.data)
        if logged > RECORD_BUDGET:
            raise CQSError(Reason.MESSAGE_TOO_LARGE,
                           f"commit of {len(batch)} operations would log {logged} bytes; one "
                           f"commit is one log record of at most {RECORD_BUDGET}: split the unit "
                           "of work")
