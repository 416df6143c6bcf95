"""The CQS system checkpoint: which clients are registered and the interests each
registered, kept on disk so that a client coming back warm after the daemon
restarts (a clean stop or a crash) finds them, not only its locks (seed 004,
"CQS system checkpoint ... used to restart CQS and resynchronize with IMS").

Design note. Locks are structure state and come back with the structure from
its image and the log. Registrations and interests are not: they belong to no
structure, no fold or checkpoint job needs them, and there are few of them (at
most ``max_clients`` clients, each with its queues). So they are not log
records, which every fold would have to skip and every trim would have to
carry over (CQS re-logs its system checkpoint for that reason), but one small
file, ``clients.ckpt``, written whole after each change: temp file → fsync →
rename → fsync of the directory, so it is the old state or the new one, never
half of either. Writes are coalesced: a change made while one is being written
is written by the next, and a request that changed what the file says is
answered once a write that includes its change is durable
(``Registrations.durable``). The writes run in a worker thread: an fsync never
stalls the event loop.

What is kept: a client from its first registration until it deregisters (a
normal end forgets it; a dropped connection, a peer recovery or a daemon stop
do not), and its interests until it deregisters them, deregisters, or
registers cold (a cold start begins anew). Operator sessions are not kept: they
never come back. A file that cannot be read is kept as ``clients.ckpt.broken``
and the daemon starts without it (clients then register their interests
again, as the SDK does on reconnect); the event says so.
"""

import os
import struct
from pathlib import Path

import msgpack
import structlog
import trio
from crc32c import crc32c

from logstream.durable import replace_file

log = structlog.get_logger()
Interest = tuple[str, int, str]  # (structure, queue type, queue name)
FORMAT = "cqsd-clients"
VERSION = 1
_CRC = struct.Struct(">I")  # CRC32C of the msgpack body, after it


class Damaged(Exception):
    """The file is not a system checkpoint this daemon can read; the message says why."""


def encode(clients: dict[str, set[Interest]]) -> bytes:
    """The file's bytes: a msgpack map, then the CRC32C of it."""
    body = msgpack.packb({"format": FORMAT, "version": VERSION,
                          "clients": {name: sorted([list(k) for k in keys])
                                      for name, keys in sorted(clients.items())}},
                         use_bin_type=True)
    return body + _CRC.pack(crc32c(body))


def decode(data: bytes) -> dict[str, set[Interest]]:
    """What ``encode`` wrote; raises Damaged."""
    body, crc = data[:-_CRC.size], data[-_CRC.size:]
    if len(crc) < _CRC.size or _CRC.unpack(crc)[0] != crc32c(body):
        raise Damaged("its CRC does not match its contents")
    try:
        top = msgpack.unpackb(body, raw=False)
        if top.get("format") != FORMAT or top.get("version") != VERSION:
            raise Damaged(f"format {top.get('format')!r} version {top.get('version')!r}, "
                          f"not {FORMAT!r} {VERSION}")
        return {str(name): {(str(s), int(q), str(n)) for s, q, n in keys}
                for name, keys in top["clients"].items()}
    except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as err:
        raise Damaged(f"{type(err).__name__}: {err}") from None


class Registrations:
    """The registered clients and their interests, and the file that keeps them.
    ``path`` None keeps them in memory only (in-process tests)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.clients: dict[str, set[Interest]] = {}
        self._changes = 0  # changes made
        self._written = 0  # changes the file holds durably (or that failed to be written)
        self._writing = False
        self._done = trio.Event()  # set when a write ends

    def load(self) -> None:
        """At start: the registrations the last run left. A damaged file is moved
        aside and named; none is no registration yet."""
        if self.path is None:
            return
        try:
            self.clients = decode(self.path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, Damaged) as err:
            broken = self.path.with_name(self.path.name + ".broken")
            os.replace(self.path, broken)
            log.error("system_checkpoint_damaged", path=str(self.path), error=str(err),
                      kept=str(broken), action="started without it: clients register their "
                                               "interests again")
            return
        log.info("system_checkpoint_loaded", clients=len(self.clients),
                 interests=sum(len(k) for k in self.clients.values()))

    def changed(self, spawn) -> None:
        """Something in ``clients`` changed: write it (``spawn`` starts the writer)."""
        self._changes += 1
        if self.path is not None and not self._writing:
            self._writing = True
            spawn("system checkpoint", self._writer)

    def pending(self) -> bool:
        """Whether a change is not yet durable."""
        return self._written < self._changes

    async def durable(self) -> None:
        """Wait until every change made so far is in the file (or failed to be written,
        which is logged)."""
        wanted = self._changes
        while self._written < wanted and self.path is not None:
            await self._done.wait()

    async def _writer(self) -> None:
        assert self.path is not None  # changed() spawns it only with a path
        try:
            while self._written < self._changes:
                upto, data = self._changes, encode(self.clients)
                try:
                    await trio.to_thread.run_sync(replace_file, self.path, data, 0o600)
                except OSError as err:
                    log.error("system_checkpoint_not_saved", path=str(self.path),
                              error=str(err), action="registrations and interests are in "
                              "force until the daemon stops; the next change writes them again")
                self._written = upto
                self._done.set()
                self._done = trio.Event()
        finally:
            self._writing = False
