"""The daemon's side of a group: a pair taken over is rebuilt and served here; a
fenced node drops what it owned (docs/group.md).

A pair this node does not own is on ``Registry.standby``: its requests get
NOT_OWNER naming the owner's address and epoch (Redis Cluster's MOVED) while
there is one, and STRUCTURE_FAILED saying why while there is none (a takeover
under way, no live node of its preference list, etcd out of reach).
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import structlog
import trio

from logstream.errors import LogWriteFailed

from ..config import Config
from ..dedup import Remembered
from ..engine import CQSError, Reason, Structure, StructurePair
from ..group.etcd import EtcdError
from ..group.lease import now
from ..group.node import Deposed, GroupNode, RejoinFailed, Takeover
from ..group.standby import Tailer, finish, purged
from ..records import EFFECTS, EPOCH, SEALED, STRUCTURE
from ..recovery.keys import pair_of, remembered
from ..recovery.restart import Rebuilt
from ..recovery.sealed import rebuild_pair
from ..storage import image
from ..storage.datadir import DataDir
from ..storage.repository import RepositoryError
from .checkpoints import Checkpoints
from .clients import Clients
from .dedup import Dedup
from .journal import Fenced, Journal, writer_for
from .operations import Operations, copied
from .registry import Registry
from .runtime import Runtime
from .smds.datasets import DataSets
from .waiters import ReadWaiters

log = structlog.get_logger()

# seconds the locks of clients not (yet) connected here wait for them after a planned
# move, at least: they are alive, and follow the pair here within a second or so
MOVE_GRACE = 10.0
MOVE_WAIT = 60.0  # seconds move_structure waits for the target to serve the pair


class Membership:
    """Implements the node's ``Host``: what a takeover and a fence do to the daemon."""

    def __init__(self, config: Config, datadir: DataDir, registry: Registry, journal: Journal,
                 clients: Clients, waiters: ReadWaiters, runtime: Runtime,
                 datasets: DataSets, checkpoints: Checkpoints, operations: Operations,
                 dedup: Dedup | None = None) -> None:
        assert config.group is not None
        self.config = config
        self.datadir = datadir
        self.registry = registry
        self.journal = journal
        self.clients = clients
        self.waiters = waiters
        self.runtime = runtime
        self.dedup = dedup if dedup is not None else Dedup(0)
        self.datasets = datasets
        self.checkpoints = checkpoints
        self.operations = operations
        pairs = {name: config.structure(name).prefer for name in registry.pairs}
        self.node = GroupNode(config.group, pairs, self)
        if config.group.standby == "warm":
            overflow = {p: o for o, p in registry.overflow_of.items()}
            self.node.tailer = Tailer(
                self.node, {name: (name, *([overflow[name]] if name in overflow else []))
                            for name in pairs},
                datadir.images, datadir.srds, datadir.logstream, self.node.poll,
                registry.new_pair, self.dedup.window)
        journal.guard(self.node.valid, self.node.fence)
        registry.standby = set(registry.pairs) | set(registry.failed)
        registry.pairs, registry.failed = {}, {}
        registry.elsewhere = self.refusal
        self.claimed = 0.0  # seconds the last warm takeover waited for the tail
        self.moving: dict[str, str] = {}  # pairs handed over by a planned move -> the target

    @property
    def writer(self) -> str:
        return self.journal.writer_id

    @property
    def log_dir(self) -> Path:
        return self.datadir.logstream

    def role(self) -> dict:
        """This node in ``cqsctl status``: owner of which pairs, standby for which."""
        node, group = self.node, self.config.group
        assert group is not None
        return {"group": group.name, "node": group.node, "writer": self.journal.writer_id,
                "standby": group.standby, "owns": sorted(node.owned),
                "stands_by": sorted(self.registry.standby),
                "lease_left": round(node.lease.left(now()), 3),
                "fenced": node.fenced_since is not None, "etcd_error": node.etcd_error,
                "disk_error": None if node.disk_error is None else str(node.disk_error),
                "takeovers": node.takeovers}

    def refusal(self, name: str) -> CQSError:
        """Why pair ``name`` is not served here, and where it is."""
        node = self.node
        owner = node.owner(name)
        me = self.config.group.node  # type: ignore[union-attr]
        if name in self.moving and (owner is None or owner.node == me):
            if name in node.released:  # its key is gone: the target is taking it now
                err = CQSError(Reason.NOT_OWNER, f"structure {name} moved to the node at "
                               f"{self.moving[name]}")
                err.details = {"owner": self.moving[name], "epoch": None}
                return err
            return CQSError(Reason.STRUCTURE_FAILED, f"structure {name} has no owner: it is "
                            f"moving to the node at {self.moving[name]}")
        if node.etcd_error is not None and node.fenced_since is not None:
            return CQSError(Reason.STRUCTURE_FAILED, f"structure {name} has no owner this "
                            f"node can know of: etcd is unreachable ({node.etcd_error})")
        if owner is not None and owner.node != me and name not in node.owned:
            err = CQSError(Reason.NOT_OWNER, f"structure {name} is owned by node {owner.node} "
                           f"(epoch {owner.epoch}) at {owner.advertise}")
            err.details = {"owner": owner.advertise, "epoch": owner.epoch}
            return err
        if name in node.taking:
            why = "this node is taking it over"
        elif name in node.receiving and owner is None:  # its owner let it go, just now
            why = "it is moving to this node"
        elif node.disk_error is not None:
            why = f"this node cannot write its log ({node.disk_error})"
        elif node.etcd_error is not None:
            why = f"etcd is unreachable ({node.etcd_error})"
        else:
            why = "no node owns it now (a takeover is under way, or no node of its " \
                  "preference list is live)"
        return CQSError(Reason.STRUCTURE_FAILED, f"structure {name} has no owner: {why}")

    def cut(self, name: str) -> dict[str, int]:
        """The log positions the pair ``name``'s state covers, by writer: the sealed
        series at their cuts, this node's at its position."""
        return {**self.node.cuts(self.registry.overflow_of.get(name, name)),
                self.journal.writer_id: self.journal.position}

    async def take(self, takeover: Takeover) -> None:
        name = takeover.structure
        position = self.journal.durable  # none of the pair in this series comes later
        cut = {**takeover.cut, self.journal.writer_id: position}
        started = now()
        self._defined(name)
        warm = await self._warm(takeover)
        # the keys the earlier owners took in the window, so their resends apply nothing:
        # a warm standby kept them as it tailed, a cold one reads them back
        if warm is not None:
            pair, reports, kept = warm
            pair = self._as_defined(pair)
            keys = {name: kept}
        else:
            pair = self.registry.new_pair(name)
            reports = await trio.to_thread.run_sync(
                rebuild_pair, pair.structures(), self.datadir.images, self.datadir.logstream,
                self.datadir.srds, cut)
            keys = await trio.to_thread.run_sync(
                remembered, self.datadir.logstream, cut, pair_of({name: pair}),
                self.dedup.window, time.time_ns(), takeover.timestamp)
        loaded = now()
        if not takeover.current():  # fenced while rebuilding: a successor may own it now
            raise Deposed(f"this node lost {name} (epoch {takeover.epoch}) while rebuilding it")
        # the epoch's first record repeats the seal; its stamp, and all after it, come
        # after every sealed record's, whatever this node's clock says
        self.journal.writer.stamp_after(takeover.timestamp)
        self.journal.append({STRUCTURE: name, EFFECTS: [], EPOCH: takeover.epoch,
                             SEALED: takeover.cut})
        pair.derive_status()
        self.dedup.install(keys, takeover.timestamp)
        self.registry.standby.discard(name)
        self.checkpoints.held(name)
        self.registry.install(pair)
        self.datasets.open_sets.taken_over([s.name for s in pair.structures()])
        self.clients.announce(pair)
        self.moving.pop(name, None)
        owners = set().union(*(r.lock_owners for r in reports)) - set(self.clients.sessions)
        for client in sorted(owners):  # their holders may come back to resync
            self.clients.held_over.add(client)
            # after a planned move they are alive, on their way from the old owner
            self.clients.schedule_peer_recovery(
                client, failed=False, grace=MOVE_GRACE if takeover.planned else None)
        self.runtime.settle()
        self.runtime.spawn(f"checkpoint count of {name}", self.checkpoints.taken_over, name,
                           takeover.cut)
        if warm is None:
            takeover.phases["load"] = round(loaded - started, 3)
        else:  # the records up to the seal, then the pair installed as it stands
            tail = min(loaded - started, reports[0].replay_seconds + self.claimed)
            takeover.phases["tail"] = round(tail, 3)
            takeover.phases["restore"] = round(loaded - started - tail, 3)
        takeover.phases["listen"] = round(now() - loaded, 3)
        for r in reports:
            log.info("structure_rebuilt", structure=r.structure, clean=r.clean, source=r.source,
                     messages=r.messages, records_replayed=r.replayed, epoch=takeover.epoch,
                     image_seconds=round(r.image_seconds, 3),
                     replay_seconds=round(r.replay_seconds, 3))

    def _defined(self, name: str) -> None:
        """Pair ``name``'s definitions as the repository holds them now (its earlier
        owners may have changed them); those read at start if it cannot be read."""
        sc = self.config.structure(name)
        try:
            self.registry.definitions.refresh([name, *([sc.overflow] if sc.overflow else [])])
        except RepositoryError as err:
            log.error("structure_definitions_unread", structure=name, error=str(err),
                      action="taking the pair over with the definitions read at start")

    def _as_defined(self, pair: StructurePair) -> StructurePair:
        """The warm ``pair``, made when the tail loaded it, with the SIZE and current
        size in force now: copied into a pair made as they say if an earlier owner
        changed them since (as ``rebuild`` copies), so a takeover never serves the
        pair with sizes its owner had given up."""
        held = self.registry.definitions.held
        if all((s.size, s.current_size) == (held[s.name].definition.size,
                                            held[s.name].current_size)
               for s in pair.structures()):
            return pair
        return copied(self.registry, pair)

    async def _warm(self, takeover: Takeover
                    ) -> tuple[StructurePair, list[Rebuilt], Remembered] | None:
        """A warm standby's takeover: the tail's live pair, the records up to the seal
        folded into it, and the keys it kept (docs/group.md); None to rebuild cold: no
        warm pair, a clean image to start from (a clean stop keeps non-recoverable
        messages, the tail does not have them), or a pair that went past the seal."""
        tailer = self.node.tailer
        if tailer is None:
            return None
        t0 = now()
        standing = await tailer.claim(takeover.structure)
        self.claimed = now() - t0  # waiting out a pass under way counts as tailing
        if standing is None or any(image.path_for(self.datadir.images, s.name).exists()
                                   for s in standing.pair.structures()):
            return None
        if purged(standing.warm, self.datadir.srds):
            log.warning("warm_image_purged", structure=takeover.structure,
                        action="rebuilding the pair from its purged checkpoint and the log")
            return None
        reports = await trio.to_thread.run_sync(finish, standing, takeover.cut)
        if reports is None:
            log.warning("warm_image_past_seal", structure=takeover.structure,
                        action="rebuilding the pair from its base and the sealed log")
            return None
        return standing.pair, reports, standing.warm.keys

    async def move(self, name: str, to: str) -> dict:
        """``cqsctl move-structure``: ask the group to move pair ``name`` to node ``to``
        and wait until ``to`` serves it (MOVE_WAIT seconds at most)."""
        node, started = self.node, now()
        try:
            await node.ask_move(name, to)
        except ValueError as err:
            raise CQSError(Reason.INVALID_REQUEST, f"move_structure: {err}") from None
        except EtcdError as err:
            raise CQSError(Reason.STRUCTURE_FAILED, f"move_structure: etcd is unreachable "
                           f"({err})") from None
        while now() - started < MOVE_WAIT:
            owner = node.moved(name, to)
            if owner is not None:
                return {"structure": name, "owner": to, "epoch": owner.epoch,
                        "seconds": round(now() - started, 3)}
            await trio.sleep(node.poll / 5)
        raise CQSError(Reason.STRUCTURE_FAILED, f"move_structure: {name} did not reach "
                       f"node {to} within {MOVE_WAIT:g}s (the move stays asked for; see "
                       f"`cqsctl display owners` and the nodes' logs)")

    async def recovered(self, name: str) -> None:
        await self.operations.recovered(name)

    async def release(self, name: str, to: str) -> None:
        """Hand pair ``name`` over to node ``to``. A pair failed here moves as well: the
        target rebuilds it from the log, as a recovery would (docs/group.md, "Planned
        moves"), and this node keeps no failed pair of its own to recover (a recover
        here once purged the checkpoints of a pair the target served, and its next
        takeover met the deletes of messages the purge had dropped)."""
        pair = self.registry.pairs.pop(name, None)
        failed = self.registry.failed.pop(name, None)
        held = pair if pair is not None else failed
        if held is None:
            return
        self.registry.standby.add(name)
        self.moving[name] = to
        if pair is not None:
            self.waiters.fail(pair)  # waiting reads end; their clients ask again where it went
        await self.journal.wait_durable(self.journal.position)
        structures = held.structures()
        self.dedup.drop(name)  # the target has the keys from the log
        self.datasets.open_sets.drop([s.name for s in structures])  # written no more here
        if pair is not None and any(s.holds_unlogged() for s in structures):
            # never logged: the target starts from this clean image to keep them (slower)
            cuts = {s.name: self.cut(s.name) for s in structures}
            await trio.to_thread.run_sync(self._save, structures, cuts)

    def _save(self, structures: list[Structure], cuts: dict[str, dict[str, int]]) -> None:
        for s in structures:
            count = image.save(image.path_for(self.datadir.images, s.name), s, cuts[s.name])
            log.info("image_saved", structure=s.name, messages=count, why="planned move")

    async def roll(self) -> tuple[str, int]:
        writer = writer_for(self.config.group.node, self.datadir.logstream)  # type: ignore[union-attr]
        rolled = await self.journal.roll(writer)
        self.dedup.rolled()  # a resend's reply waits for no LSN of the old series
        return rolled

    def end(self) -> tuple[str, int, int]:
        return self.journal.writer_id, self.journal.durable, self.journal.writer.last_timestamp

    def lose(self, why: str) -> None:
        self.journal.fence(Fenced(why))
        self.moving.clear()
        for name in list(self.registry.pairs):
            pair = self.registry.pairs.pop(name)
            self.registry.standby.add(name)  # first: its waiting reads are told it went
            self.dedup.drop(name)
            self.waiters.fail(pair)
            self.datasets.open_sets.drop([s.name for s in pair.structures()])
            log.warning("owner_lost", structure=name, why=why)
        # failed by an operator, or being recovered: the new owner's takeover recovers
        # it, and a recovery under way here finds it gone (operations.py)
        for name in list(self.registry.failed):
            pair = self.registry.failed.pop(name)
            self.datasets.open_sets.drop([s.name for s in pair.structures()])
            self.registry.standby.add(name)
            log.warning("owner_lost", structure=name, why=why, failed=True)

    def rejoin(self) -> str:
        log_dir = self.datadir.logstream
        writer = writer_for(self.config.group.node, log_dir)  # type: ignore[union-attr]
        need = self.journal.writer.segment_size
        try:
            room = os.statvfs(log_dir)  # a series starts by preallocating a segment
            if room.f_bavail * room.f_frsize < need:
                raise OSError(errno.ENOSPC, f"No space left on device ({need} bytes needed "
                              f"for a log segment, {room.f_bavail * room.f_frsize} free)")
            self.journal.rotate(writer)
        except LogWriteFailed as err:
            raise RejoinFailed(log_dir, err.error) from err
        except OSError as err:
            raise RejoinFailed(log_dir, err) from err
        return writer
