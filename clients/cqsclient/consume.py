"""Consume loops: ``for m in s.consume("TRANX"): ...`` and what each message is.

Design note
-----------
A consumer reads up to ``prefetch`` messages at a time (each locked by this
client) and hands them out one by one as :class:`Delivery` values: Messages
that know how to settle themselves, by ``ack()`` (delete) or ``nack()`` (give
back; ``failed=True`` counts a failed delivery, so a message that keeps
failing ends on the suspend queue after ``max_deliveries``), or as a context
manager that acks on success and nacks on an exception (which it re-raises;
an interrupt or a cancellation gives the message back as unread instead).

When the queue is empty the consumer waits on the daemon: a read with a
server-side ``wait``, which the daemon serves the moment a message becomes
readable (a put, an unlock, a move, the end of a SERIAL queue's message in
flight), so nothing polls. Interest notifications would not do here: they
fire when a queue goes from empty to non-empty, and a SERIAL queue whose next
message becomes readable is not empty before. ``stop()`` ends the loop
without waiting for the read's ``wait``: the read is abandoned, and what it
locks if served later is given back. The messages read ahead and not handed
out are given back (plain unlocks, not failures) when the consumer closes:
leaving a ``with s.consume(...)`` block, on ``close()``, or once stopped.

An ack with nothing read ahead carries the refill: it is a ``delete`` with
``next`` (``StructureHandle.delete_and_read``), so the next messages come back
with it and a consumer of one message at a time makes one round trip a
message, not two (an AMQP consumer gets its next delivery the same way). The
ack still returns once the delete is durable, and settles as before when the
delete fails (nothing is read then); what it brings waits in the buffer, like
a prefetch, so a loop left without ``close()`` (or a ``with`` block) holds
those locks until the client closes. A nack, an ack with messages still read
ahead, and one of a consumer that has stopped carry no ``next``; what an ack
brings to a consumer stopped meanwhile is given back at once.

With ``lease`` every message is read on a lease (``read(..., lease=)``): a
worker that dies or hangs without its connection dropping loses the message
after that many seconds, as a failed delivery. The lease runs from the read,
so a message read ahead (``prefetch``) spends part of it waiting in the
buffer; a handler that takes longer renews it (``s.renew(m.entry_id, s)``).
Settling a message whose lease has expired raises LOCK_NOT_HELD. The read an
ack carries takes the same lease.

With ``reconnect`` the loop carries on through a lost connection or a daemon
restart: the read is sent again on the new connection, messages read ahead
whose locks did not come back are dropped from the buffer (someone else may
get them), and a Delivery whose lock was lost settles as False instead of
raising. A daemon shutting down ends the loop of a client without
``reconnect``; with it, the loop waits for the daemon to come back.

The bookkeeping here is shared with the async consumer (``cqsclient.aio``);
the blocking :class:`Consumer` and :class:`Delivery` follow it.

A consumer reaches its structure and client only through the
:class:`~cqsclient.source.Source` that ``StructureHandle.consume`` hands it,
so this module imports no client module and calls no client's private method.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import Any, Final

from . import ops
from .connection import Abandoned
from .errors import ConnectionLost, CQSError, RequestTimeout, ShuttingDown
from .model import Message, QType
from .ops import CLIENT_TIMEOUT, Timeout
from .source import Source, SourceBase
from .unitofwork import ALREADY_RELEASED

__all__ = ["Consumer", "ConsumerBase", "Delivery", "Handout"]

log = logging.getLogger("cqsclient")

# Seconds a consumer waits before reading again while the daemon shuts down
# (its connection is about to drop; the reconnect then takes over).
SHUTDOWN_PAUSE: Final = 0.2

_MESSAGE_FIELDS: Final = tuple(f.name for f in fields(Message))


class Handout:
    """What a Delivery carries besides its message: who handed it out, and whether
    it has been settled (a Delivery is a frozen Message: this is its one mutable part)."""

    __slots__ = ("consumer", "settled")

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.settled = False


class ConsumerBase:
    """What both consumers keep: their queue and settings, and the messages read ahead."""

    source: SourceBase

    def __init__(
        self,
        source: SourceBase,
        queue: str,
        qtype: QType,
        prefetch: int,
        wait: float,
        timeout: Timeout = CLIENT_TIMEOUT,
        lease: float | None = None,
    ) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {prefetch}")
        if not wait > 0:
            raise ValueError(f"wait must be a positive number of seconds, got {wait}")
        self.source = source  # what the consumer needs of its structure and client
        self.handle = source.handle
        self.queue = queue
        self.qtype = qtype
        self.prefetch = prefetch
        self.wait = wait
        self.timeout = timeout
        self.lease = lease  # of every message read, from its read (read ahead too)
        self._ahead: deque[Message] = deque()
        self._stopping = False
        self._resync: object = None  # the client's last_resync when the buffer was checked

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.Consumer {self.qtype}:{self.queue} of {self.source.name}>"

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` or ``close()`` was called (or the daemon shut down)."""
        return self._stopping

    def _read_call(self, structure: str) -> ops.Call:
        return ops.read_batch(structure, self.queue, self.prefetch, self.qtype, self.wait,
                              self.lease)

    def _next_ahead(self) -> Message | None:
        """The next message read ahead whose lock this client still holds, or None."""
        source = self.source
        if source.last_resync is not self._resync:
            # A reconnect: what it did not hand back is someone else's now.
            self._resync = source.last_resync
            kept = [m for m in self._ahead if source.holds(m.structure, m.entry_id)]
            self._ahead = deque(kept)
        return self._ahead.popleft() if self._ahead else None

    def _take_ahead(self) -> list[Message]:
        """Every message read ahead and not handed out, for giving back."""
        self._stopping = True
        ahead, self._ahead = list(self._ahead), deque()
        return ahead

    @staticmethod
    def _start_settling(delivery: Any) -> bool:
        """True if *delivery* was not settled yet (it is now being settled)."""
        handout: Handout = delivery._handout
        if handout.settled:
            return False
        handout.settled = True
        return True

    def _settle_call(self, structure: str, entry_id: int, failed: bool | None) -> ops.Call:
        if failed is not None:
            return ops.unlock(structure, entry_id, failed)
        if self._ahead or self._stopping:
            return ops.delete(structure, entry_id)
        return ops.delete_and_read(structure, entry_id, self.queue, self.prefetch, self.qtype,
                                   self.lease)

    def _refill(self, call: ops.Call, got: Any) -> list[Message]:
        """Buffer what an ack read (see the design note); returns what to give back,
        because the consumer stopped while the ack was on its way."""
        if not call.locks or not got:
            return []
        if self._stopping:
            return list(got)
        self._ahead.extend(got)
        return []

    def _deliver(self, cls: type[Any], message: Message) -> Any:
        return cls(*(getattr(message, name) for name in _MESSAGE_FIELDS), Handout(self))


class Consumer(ConsumerBase):
    """An iterator of :class:`Delivery` values; from :meth:`StructureHandle.consume`.

    ``stop()`` ends the iteration at the next message (safe from another thread
    or a signal handler: it only sets a flag and wakes the read); ``close()``
    stops and gives back what was read ahead. As a context manager it closes on
    exit: use ``with s.consume(q, prefetch=10) as messages:`` when reading ahead,
    so that leaving the loop early gives the rest back at once.
    """

    source: Source

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> Delivery:
        while True:
            if self._stopping:
                self.close()
                raise StopIteration
            message = self._next_ahead()
            if message is not None:
                delivery: Delivery = self._deliver(Delivery, message)
                return delivery
            self._fill()

    def _fill(self) -> None:
        source = self.source
        try:
            got = source.request(self._read_call(source.name), self.timeout, self._cancelled)
        except Abandoned:
            return
        except ShuttingDown:
            if not source.reconnects:
                self._stopping = True
                return
            source.pause(SHUTDOWN_PAUSE)
            return
        except RequestTimeout as timeout:
            if not source.reconnects:
                raise
            log.warning("cqsd consumer of %s: %s; reading again", self.queue, timeout)
            return
        self._ahead.extend(got)

    def _cancelled(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """End the loop at the next message; a read waiting on the daemon is abandoned."""
        self._stopping = True
        self.source.wake()

    def close(self) -> None:
        """Stop, and give back the messages read ahead and not handed out. Idempotent."""
        for message in self._take_ahead():
            self.source.give_back(message.entry_id)

    def _settle(self, message: Delivery, failed: bool | None, timeout: Timeout) -> bool:
        if not self._start_settling(message):
            return False
        source = self.source
        call = self._settle_call(source.name, message.entry_id, failed)
        while True:
            try:
                got = source.request(call, timeout)
            except ALREADY_RELEASED:
                return False
            except ConnectionLost:
                if not source.reconnects or source.closed:
                    raise
                # Reconnected: if the lock came back, the request was not applied.
                if not source.holds(source.name, message.entry_id):
                    return False
                continue
            for extra in self._refill(call, got):
                source.give_back(extra.entry_id)
            return True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Delivery(Message):
    """A message a consumer handed out, locked by this client until it is settled.

    ``ack()`` deletes it; ``nack()`` gives it back (``failed=True``: a failed
    delivery; ``failed=False``: as if never read). Both return True when done,
    False when this client no longer held the lock (it was settled already, or
    the lock was lost across a reconnect or to peer recovery): the message may
    then be delivered again. As a context manager: ack on success, nack on an
    exception, which goes on up. A message deleted in a unit of work instead
    (``uow.delete(m.entry_id)``, with a reply put atomically) needs neither.
    """

    _handout: Any = field(default=None, compare=False)

    @property
    def settled(self) -> bool:
        """True once acked or nacked."""
        handout: Handout = self._handout
        return handout.settled

    def ack(self, *, timeout: Timeout = CLIENT_TIMEOUT) -> bool:
        """Delete the message: it has been dealt with."""
        consumer: Consumer = self._handout.consumer
        return consumer._settle(self, None, timeout)

    def nack(self, failed: bool = True, *, timeout: Timeout = CLIENT_TIMEOUT) -> bool:
        """Give the message back, as a failed delivery unless ``failed=False``."""
        consumer: Consumer = self._handout.consumer
        return consumer._settle(self, failed, timeout)

    def __enter__(self) -> Delivery:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.settled:
            return
        if exc is None:
            self.ack()
            return
        try:
            # An error in the handler is a failed delivery; an interrupt is not the
            # message's fault (KeyboardInterrupt, SystemExit): it goes back as unread.
            self.nack(failed=isinstance(exc, Exception))
        except CQSError as error:
            exc.add_note(f"could not give back entry {self.entry_id}: {error}")
