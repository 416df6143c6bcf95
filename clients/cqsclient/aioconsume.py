"""The async consume loop: ``async for m in s.consume("TRANX")``.

The same loop as :mod:`cqsclient.consume` (whose design note this follows),
awaited: a read waiting on the daemon runs in a cancel scope that ``stop()``
cancels, and the async connection gives back what such a read locks if its
reply comes after all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio

from .consume import SHUTDOWN_PAUSE, ConsumerBase, Handout
from .errors import ConnectionLost, CQSError, RequestTimeout, ShuttingDown
from .model import Message
from .ops import CLIENT_TIMEOUT, Timeout
from .source import AsyncSource
from .unitofwork import ALREADY_RELEASED

__all__ = ["Consumer", "Delivery"]

log = logging.getLogger("cqsclient")

# How long giving back what was read ahead may take when the consumer is being
# cancelled: it runs shielded, so it must be bounded (as the client's cleanup).
CLOSE_TIMEOUT = 5.0


class Consumer(ConsumerBase):
    """An async iterator of :class:`Delivery` values; from ``StructureHandle.consume``.

    ``stop()`` (from any task) ends the iteration at the next message, cancelling
    a read waiting on the daemon; ``close()`` stops and gives back what was read
    ahead; ``async with s.consume(q) as messages:`` closes on exit.
    """

    source: AsyncSource
    _scope: anyio.CancelScope | None = None  # the read waiting on the daemon, for stop()

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Delivery:
        while True:
            if self._stopping:
                await self.close()
                raise StopAsyncIteration
            message = self._next_ahead()
            if message is not None:
                delivery: Delivery = self._deliver(Delivery, message)
                return delivery
            await self._fill()

    async def _fill(self) -> None:
        source = self.source
        with anyio.CancelScope() as self._scope:
            if self._stopping:
                return
            try:
                got = await source.request(self._read_call(source.name), self.timeout)
            except ShuttingDown:
                if not source.reconnects:
                    self._stopping = True
                    return
                await anyio.sleep(SHUTDOWN_PAUSE)
                return
            except RequestTimeout as timeout:
                if not source.reconnects:
                    raise
                log.warning("cqsd consumer of %s: %s; reading again", self.queue, timeout)
                return
            self._ahead.extend(got)
        self._scope = None

    def stop(self) -> None:
        """End the loop at the next message; a read waiting on the daemon is cancelled."""
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()

    async def close(self) -> None:
        """Stop, and give back the messages read ahead and not handed out. Idempotent."""
        ahead = self._take_ahead()
        if self._scope is not None:
            self._scope.cancel()
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            for message in ahead:
                await self.source.give_back(message.entry_id)

    async def _settle(self, message: Delivery, failed: bool | None, timeout: Timeout) -> bool:
        if not self._start_settling(message):
            return False
        source = self.source
        call = self._settle_call(source.name, message.entry_id, failed)
        while True:
            try:
                got = await source.request(call, timeout)
            except ALREADY_RELEASED:
                return False
            except ConnectionLost:
                if not source.reconnects or source.closed:
                    raise
                if not source.holds(source.name, message.entry_id):
                    return False
                continue
            extra = self._refill(call, got)
            if extra:
                with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
                    for m in extra:
                        await source.give_back(m.entry_id)
            return True

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Delivery(Message):
    """A message an async consumer handed out; see :class:`cqsclient.Delivery`.

    ``await m.ack()``, ``await m.nack()``, or ``async with m:``.
    """

    _handout: Any = field(default=None, compare=False)

    @property
    def settled(self) -> bool:
        """True once acked or nacked."""
        handout: Handout = self._handout
        return handout.settled

    async def ack(self, *, timeout: Timeout = CLIENT_TIMEOUT) -> bool:
        """Delete the message: it has been dealt with."""
        consumer: Consumer = self._handout.consumer
        return await consumer._settle(self, None, timeout)

    async def nack(self, failed: bool = True, *, timeout: Timeout = CLIENT_TIMEOUT) -> bool:
        """Give the message back, as a failed delivery unless ``failed=False``."""
        consumer: Consumer = self._handout.consumer
        return await consumer._settle(self, failed, timeout)

    async def __aenter__(self) -> Delivery:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.settled:
            return
        if exc is None:
            await self.ack()
            return
        # Shielded: a message whose handler was cancelled is still given back, as
        # unread (a cancellation is not the message's fault; an error is a failure).
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            try:
                await self.nack(failed=isinstance(exc, Exception))
            except CQSError as error:
                exc.add_note(f"could not give back entry {self.entry_id}: {error}")
