"""This daemon as a node of a group: its lease, the pairs it owns, its takeovers.

Design note. Patroni's HA loop, for structure pairs (docs/group.md). The node
holds one etcd lease; a key ``nodes/<NODE>`` bound to it says the node is
live, and each pair it owns has ``owners/<PAIR>`` bound to it too, so when
the node stops renewing, etcd drops all of them at once after ``lease``
seconds and the standbys see free pairs. Two tasks:

- the *keep-alive*: renews a third of the way through the lease; if the local
  deadline (lease.py) passes without an answer, the node is **fenced**: it
  acknowledges nothing more, drops every pair it owned (their requests get
  STRUCTURE_FAILED naming etcd) and, once etcd answers again, rejoins as a new
  incarnation writing a new series (its old one is sealed by the next owners);
- the *watch*: reads the group's keys every ``poll`` seconds; a pair free and
  wanted here (ownership.py) is tried with a create-if-absent transaction;
  winning it starts a **takeover**: seal the other writers' series, record the
  seal in etcd, rebuild the pair (the daemon's ``Host.take``), then serve. An
  owner key of ours that vanished while the lease is valid (an operator
  deleted it) fences the node too: a successor may seal it at any moment.

A warm standby (``standby = "warm"``) runs a third task, outside the fence
cycle: the tailer of standby.py, which keeps the rows of every pair this node
could take current, so that ``Host.take`` folds only the last records.

A clean stop saves the images first (the daemon), then deletes this node's
owner keys and revokes the lease, so a standby takes the pairs at once and
from the clean image, without waiting out the lease.

Planned moves (z/OS's SETXCF REBUILD; docs/group.md, "Planned moves"). Any
node asked to move a pair writes ``moves/<PAIR>`` naming the target; the
owner, seeing it, waits for the target's warm standby to report itself
current and watching, then stops serving the pair, waits until all of its
records are durable and acknowledged, and deletes its owner key (with
``handed/<PAIR>``, in one transaction); the target, which watches that one key
while a move to it is pending (an etcd watch: it learns of the delete at once),
takes the pair as in a takeover (seal, the last records, serve) and deletes
the move key. A node
that joins asks by such moves for the pairs whose home it is (ownership.py).
A node never writes a pair again in a series that was cut for it: taking back
a pair it handed over in this incarnation, it first rolls to a new series
(the old one counts to its end for every other pair it owns).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import structlog
import trio

from logstream.series import list_series

from ..config import GroupConfig
from ..recovery.sealed import End, seal
from .etcd import Etcd, EtcdError, EtcdUnavailable
from .lease import LeaseClock, now
from .ownership import Handed, Owner, Seal, View, home, key, may_own, to_call_home, to_take
from .standby import Tailer

log = structlog.get_logger()

__all__ = ["Deposed", "GroupNode", "Host", "Takeover"]

REJOIN_DELAY = 0.5  # seconds between attempts to reach etcd after a fence
# seconds between attempts to start a new series on a disk that refused one: an
# attempt that got as far as a segment's header leaves an empty series behind
DISK_RETRY = 2.0
# A planned move waits this long at most for the target's warm standby to report
# itself current (a cold target is not waited for: it rebuilds at the handover)
WARM_WAIT = 30.0
WARM_RECORDS = 20_000  # records behind the owner a target may be and count as current
# seconds a move's target watches the owner key at a time before reading it again
# (a watch is told of the delete at once; reading again guards against a lost stream)
HANDOVER_WATCH = 2.0


def _move_value(to: str) -> str:
    """The value of ``moves/<PAIR>``: the node asked to own the pair."""
    return json.dumps({"to": to})


@dataclass
class Takeover:
    """One pair taken over: its epoch, its seal, and how long each phase took."""

    structure: str
    epoch: int
    cut: dict[str, int]
    timestamp: int
    phases: dict[str, float] = field(default_factory=dict)  # seconds: detect, seal, load, ...
    # whether the node still owns the pair at this epoch: a fence during the rebuild
    # (its lease ran out meanwhile) deposed it, and then it must not serve the pair
    current: Callable[[], bool] = lambda: True
    planned: bool = False  # handed over by a planned move (the old owner is alive)


class Deposed(Exception):
    """The node lost the pair while taking it over: the takeover is given up."""


class RejoinFailed(Exception):
    """After a fence, the node could not start its new series (its disk is full, say):
    it stays fenced, owning nothing, and tries again; nothing stored is touched."""

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        self.reason = errno.errorcode.get(error.errno or 0, "EIO")  # ENOSPC, EROFS, ...
        super().__init__(f"{path}: cannot start a new log series: {error.strerror or error}")


class Host(Protocol):
    """What the node needs of the daemon it belongs to."""

    @property
    def writer(self) -> str: ...

    @property
    def log_dir(self) -> Path: ...

    async def take(self, takeover: Takeover) -> None:
        """Rebuild the pair from its seal and serve it, if ``takeover.current()`` still
        holds after the last await (else raise Deposed); raise to give it up again."""

    def lose(self, why: str) -> None:
        """Stop acknowledging and drop every pair (fenced)."""

    def rejoin(self) -> str:
        """After a fence, continue as a new incarnation: its writer id. Raises
        RejoinFailed if its series cannot be started."""

    async def recovered(self, name: str) -> None:
        """Until no operator's recovery of pair ``name`` runs here."""

    async def release(self, name: str, to: str) -> None:
        """A planned move: stop serving pair ``name`` (its clients are told it is moving
        to ``to``) and return once every record of it is durable."""

    async def roll(self) -> tuple[str, int]:
        """Continue in a new series while serving: the old writer and its last LSN."""

    def end(self) -> tuple[str, int, int]:
        """This node's series now: its writer, durable LSN and newest timestamp."""


class GroupNode:
    def __init__(self, group: GroupConfig, pairs: Mapping[str, tuple[str, ...] | None],
                 host: Host, etcd: Etcd | None = None) -> None:
        self.group = group
        self.pairs = dict(pairs)
        self.host = host
        self.etcd = etcd or Etcd(group.etcd)
        self.lease = LeaseClock()
        self.view = View()
        self.view_at = float("-inf")  # when the view was read (CLOCK_BOOTTIME)
        self.seen = trio.Event()  # set once the group's keys were read
        self.owned: dict[str, int] = {}  # pair -> epoch
        self.taking: set[str] = set()
        self.takeovers = 0
        self.fenced_since: float | None = None
        self.etcd_error: str | None = None  # why etcd did not answer last, if it did not
        self.disk_error: RejoinFailed | None = None  # why the last rejoin failed, if it did
        self.poll = min(0.5, group.lease / 10)
        self.tailer: Tailer | None = None  # a warm standby's (standby.py), set by the host
        self.handing: set[str] = set()  # pairs being handed over by a planned move
        self.released: set[str] = set()  # pairs handed over whose owner key is deleted
        # epochs whose owner key this node deleted itself (a move, a failed takeover): a
        # view read before the delete still shows them, and they are not orphans
        self.let_go: set[int] = set()
        self.receiving: set[str] = set()  # pairs a planned move brings here
        self.retired: dict[str, int] = {}  # this node's earlier series -> their last LSN
        # pair -> the series this node rolled away from while owning it (its owner key's
        # ``rolled``: their standbys read them to those ends)
        self.rolled: dict[str, dict[str, int]] = {}
        self.moves = 0
        self.leaving = False  # handing everything off before a stop: take nothing more
        self.free_since: dict[str, float] = {}  # pairs without an owner key, since when
        self.backoff: dict[str, float] = {}  # pairs this node failed to take: not until

    # -- what the daemon asks ------------------------------------------------

    def valid(self) -> bool:
        """Whether this node may acknowledge now: checked after every fsync."""
        return self.fenced_since is None and self.lease.valid(now())

    def owner(self, name: str) -> Owner | None:
        """The owner of pair ``name`` as last seen, None if it has none."""
        return self.view.owners.get(name)

    def moved(self, name: str, to: str) -> Owner | None:
        """The owner of pair ``name`` once a planned move to ``to`` is over: ``to`` owns it
        and has deleted the move's key, which it does once it serves the pair. Its owner
        key alone says only that it won the pair: its takeover may still be under way."""
        o = self.view.owners.get(name)
        return o if o is not None and o.node == to and self.view.moves.get(name) != to else None

    def cuts(self, name: str) -> dict[str, int]:
        """The sealed writers' cuts of pair ``name``; this node's own series is never cut."""
        cut = {**self.retired, **self.view.cuts(name)}
        cut.pop(self.host.writer, None)
        return cut

    def live_series(self) -> set[str] | None:
        """The series the live nodes write now: this node's and every joined node's;
        None until the group's keys were first read, when every other series would
        look dead (a start's trim retired series a slot named short of their cuts)."""
        if not self.seen.is_set():
            return None
        return {self.host.writer, *(n.writer for n in self.view.nodes.values())}

    def describe(self) -> list[dict[str, Any]]:
        """``display owners``: each pair's owner, epoch, lease left and standbys."""
        at = now()
        rows = []
        for name in sorted(self.pairs):
            o = self.view.owners.get(name)
            mine = o is not None and o.node == self.group.node
            rows.append({
                "structure": name, "owner": o.node if o else None,
                "epoch": o.epoch if o else None,
                "lease_left": round(self.lease.left(at), 3) if mine else None,
                "standbys": [{"node": n, "behind_records": None if lag is None else lag.records,
                              "behind_seconds": None if lag is None else lag.seconds}
                             for n in sorted(self.view.nodes)
                             if o is None or n != o.node
                             for lag in [self.view.lag.get(name, {}).get(n)]],
            })
        return rows

    # -- running ---------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Join, then keep the lease and watch the group; after a fence, join again.
        Started before etcd answers: meanwhile the node owns nothing."""
        task_status.started()
        async with trio.open_nursery() as outer:
            if self.tailer is not None:  # tails through fences: it owns nothing
                outer.start_soon(self.tailer.run)
            await self._membership()

    async def _membership(self) -> None:
        while True:
            try:
                await self._join()
            except EtcdError as err:
                if self.etcd_error is None:
                    log.warning("etcd_unreachable", node=self.group.node, error=str(err),
                                action="owning nothing; trying again")
                self.etcd_error = str(err)
                await trio.sleep(REJOIN_DELAY)
                continue
            except RejoinFailed as err:
                if self.disk_error is None or str(self.disk_error) != str(err):
                    log.error("rejoin_failed", node=self.group.node, disk=str(err.path),
                              reason=err.reason, error=str(err),
                              action="owning nothing, acknowledging nothing, keeping what "
                                     "is stored; trying again")
                self.disk_error = err
                await self._revoke()
                await trio.sleep(DISK_RETRY)
                continue
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._keepalive, nursery.cancel_scope)
                nursery.start_soon(self._watch, nursery)
            # fenced: the lease is gone or out of date; everything owned was dropped

    async def _join(self) -> None:
        """A new lease and this node's key; after a fence, a new series first."""
        sent = now()
        lease, ttl = await self.etcd.grant(self.group.lease)
        self.lease.granted(lease, ttl, sent)
        self.etcd_error = None  # it answered: what stops the node now is said below
        if self.fenced_since is not None:  # a new series, at once: no await in between
            writer = self.host.rejoin()  # raises RejoinFailed
            log.info("node_rejoined", node=self.group.node, writer=writer,
                     fenced_seconds=round(now() - self.fenced_since, 3))
            self.fenced_since = self.disk_error = None
        await self.etcd.put(key(self.group.name, "nodes", self.group.node), json.dumps({
            "advertise": self.group.advertise, "writer": self.host.writer,
            "standby": self.group.standby}), lease=lease)
        self.etcd_error = None
        log.info("node_joined", node=self.group.node, group=self.group.name,
                 writer=self.host.writer, lease=self.group.lease)

    async def _keepalive(self, scope: trio.CancelScope) -> None:
        while True:
            at = now()
            if not self.lease.valid(at):
                self._fence("its etcd lease ran out: " + (self.etcd_error or "not renewed"))
                scope.cancel()
                return
            await trio.sleep(max(0.0, min(self.lease.renew_at(), self.lease.valid_until) - at))
            sent = now()
            with trio.move_on_after(max(0.01, self.lease.valid_until - sent)):
                try:
                    ttl = await self.etcd.keepalive(self.lease.lease)
                except EtcdError as err:
                    self.etcd_error = str(err)
                    await trio.sleep(min(self.poll, max(0.0, self.lease.valid_until - now())))
                    continue
                self.etcd_error = None
                self.lease.renewed(ttl, sent)

    async def _watch(self, nursery: trio.Nursery) -> None:
        scope = nursery.cancel_scope
        prefix = key(self.group.name) + "/"
        joined = now()
        while True:
            try:
                kvs, revision = await self.etcd.get_prefix(prefix)
            except EtcdError as err:
                self.etcd_error = str(err)
                await trio.sleep(self.poll)
                continue
            self.view, self.view_at = View.read(self.group.name, kvs, revision), now()
            self.seen.set()
            self.free_since = {name: self.free_since.get(name, self.view_at)
                               for name in self.pairs if name not in self.view.owners}
            for name, epoch in list(self.owned.items()):
                o = self.view.owners.get(name)
                if epoch > revision:  # won after this read began: not in it yet
                    continue
                if o is None or o.node != self.group.node or o.epoch != epoch:
                    self._fence(f"its owner key of {name} (epoch {epoch}) is gone")
                    scope.cancel()
                    return
            if self.lease.valid(now()) and not self.leaving:
                for name in self.orphans():
                    await self._own(name, self.view.owners[name].epoch, self.view_at,
                                    how="orphan")
                for name in to_take(self.group.node, self.pairs, self.view, self._stale()):
                    if self.backoff.get(name, 0.0) > now():
                        continue
                    if name not in self.taking:
                        await self._try(name)
            if self.lease.valid(now()):
                await self._moves(nursery)
                if not self.leaving and now() - joined < max(2.0, self.group.lease):
                    await self._call_home()  # the first views after a join
            await trio.sleep(self.poll)

    # -- planned moves ------------------------------------------------------------

    async def ask_move(self, name: str, to: str) -> int:
        """Ask the group to move pair ``name`` to node ``to`` (any node may be asked):
        the etcd revision of the request. Raises ValueError saying why it cannot go
        there, EtcdError."""
        view, prefer = self.view, self.pairs.get(name)
        if name not in self.pairs:
            raise ValueError(f"{name} is not a structure pair of this group "
                             f"(an overflow structure moves with its primary)")
        if to not in view.nodes:
            raise ValueError(f"node {to} is not live in group {self.group.name} "
                             f"(live: {', '.join(sorted(view.nodes)) or 'none'})")
        if not may_own(prefer, to):
            raise ValueError(f"node {to} is not in the preference list of {name} "
                             f"({', '.join(prefer or ())})")
        revision = await self.etcd.put(key(self.group.name, "moves", name), _move_value(to))
        log.info("move_requested", structure=name, to=to, by=self.group.node)
        return revision

    async def hand_off(self, wait: float) -> None:
        """At a stop by SIGTERM: move each pair this node owns to the node that would own
        it without this one, if one is live, and wait for the moves (``wait`` seconds at
        most); the clean stop then gives up whatever did not move."""
        self.leaving = True
        live = set(self.view.nodes) - {self.group.node}
        asked, revision = [], 0
        for name in sorted(self.owned):
            target = home(name, self.pairs[name], live)
            if target is None:
                continue
            try:
                revision = await self.ask_move(name, target)
            except (ValueError, EtcdError) as err:
                log.warning("hand_off_failed", structure=name, to=target, error=str(err),
                            action="given up at the clean stop instead")
                continue
            self.view.moves[name] = target
            asked.append(name)
        with trio.move_on_after(wait):
            while True:  # the moves end in this node's own tasks (_hand_over), or are
                # dropped (_moves: a target that left meanwhile), and then are not waited for
                if not any(name in self.handing or (name in self.owned and (
                        name in self.view.moves or self.view.revision < revision))
                           for name in asked):
                    return
                await trio.sleep(self.poll / 5)

    async def _call_home(self) -> None:
        """Ask for the pairs whose home this node is, from the nodes that own them."""
        for name in to_call_home(self.group.node, self.pairs, self.view):
            try:
                await self.ask_move(name, self.group.node)
            except (ValueError, EtcdError) as err:
                log.warning("move_home_failed", structure=name, error=str(err))
                continue
            self.view.moves[name] = self.group.node

    async def _moves(self, nursery: trio.Nursery) -> None:
        """Act on the planned moves the view shows: hand over what this node owns,
        receive what comes here, drop requests that cannot be carried out."""
        me = self.group.node
        for name, target in list(self.view.moves.items()):
            if name not in self.pairs:
                continue
            if name in self.owned and name not in self.taking:
                if target == me:  # done (or asked of the owner itself)
                    await self._forget_move(name, target, "done")
                elif target not in self.view.nodes or not may_own(self.pairs[name], target):
                    await self._forget_move(name, target, f"node {target} cannot own it")
                elif name not in self.handing:
                    self.handing.add(name)
                    nursery.start_soon(self._hand_over, name, self.owned[name], target)
            elif target == me and name not in self.receiving:
                self.receiving.add(name)
                nursery.start_soon(self._receive, name)

    async def _forget_move(self, name: str, to: str, why: str) -> None:
        """Delete the request to move ``name`` to ``to``, unless a new one replaced it."""
        try:
            if not await self.etcd.delete_if_value(key(self.group.name, "moves", name),
                                                   _move_value(to)):
                return
        except EtcdError as err:
            self.etcd_error = str(err)
            return
        if self.view.moves.get(name) == to:
            self.view.moves.pop(name, None)
        log.info("move_ended", structure=name, to=to, why=why)

    async def _hand_over(self, name: str, epoch: int, target: str) -> None:
        """The owner's side of a planned move of ``name`` to ``target``."""
        try:
            started = now()
            await self._await_warm(name, target)
            await self.host.recovered(name)  # it writes the pair's checkpoints: here first
            node = self.view.nodes.get(target)
            if self.owned.get(name) != epoch or self.view.moves.get(name) != target \
                    or node is None:
                return  # the move was called off, or the pair lost meanwhile
            warm = now()
            await self.host.release(name, node.advertise)
            self.owned.pop(name, None)
            self.let_go.add(epoch)  # from now: a view read meanwhile still shows the key
            try:  # one transaction: the pair is free once the target can find its end
                await self.etcd.delete_if(key(self.group.name, "owners", name), epoch, put={
                    key(self.group.name, "handed", name):
                        Handed(epoch, *self.host.end()).encode()})
            except EtcdError as err:  # it cannot be served here nor taken there
                self.etcd_error = str(err)
                self._fence(f"the move of {name} could not release its owner key: {err}")
                return
            self.moves += 1
            self.released.add(name)
            log.info("owner_lost", structure=name, epoch=epoch, why=f"moved to {target}")
            log.info("structure_released", structure=name, epoch=epoch, to=target,
                     warm_seconds=round(warm - started, 3),
                     drain_seconds=round(now() - warm, 3))
        finally:
            self.handing.discard(name)

    async def _await_warm(self, name: str, target: str) -> None:
        """Until ``target``'s warm standby of ``name`` reports itself current (a cold
        one at once), at most WARM_WAIT seconds."""
        deadline = now() + WARM_WAIT
        # and it read this node's series as far as it was when the move began: a report
        # from before a long pass (a burst of batches to fold) does not count. A series
        # this node rolled to meanwhile (taking back a pair it had handed over) began
        # after the move: any report on it counts (its LSNs start again at 1, and a
        # move once waited all of WARM_WAIT for the new series to reach the old one's)
        writer, since = self.host.end()[:2]
        while now() < deadline:
            node = self.view.nodes.get(target)
            if node is None or node.standby != "warm" or self.view.moves.get(name) != target:
                return
            if self.host.writer != writer:
                writer, since = self.host.writer, 0
            lag = self.view.lag.get(name, {}).get(target)
            # measured against this owner's series (one published while the target stood
            # by for an earlier owner says nothing of this one), and the target knows of
            # the move: it watches the owner key, so the pair is free for no longer
            if lag is not None and lag.writer == writer and lag.receiving \
                    and lag.records <= WARM_RECORDS and lag.read >= since:
                return
            await trio.sleep(self.poll)
        log.warning("move_target_not_warm", structure=name, to=target, waited=WARM_WAIT,
                    action="handing over anyway; the target rebuilds what it lacks")

    async def _receive(self, name: str) -> None:
        """The target's side: take ``name`` the moment its owner lets it go. The owner
        key is read, then watched (etcd tells of its delete at once) HANDOVER_WATCH
        seconds at a time; a watch that cannot be made costs a poll's wait instead."""
        owner_key = key(self.group.name, "owners", name)
        if self.tailer is not None:  # the owner waits for this to hand the pair over
            await self.tailer.publish(name, at_once=True)
        try:
            while self.view.moves.get(name) == self.group.node and name not in self.owned:
                if not self.lease.valid(now()):
                    return
                try:
                    kv = await self.etcd.get(owner_key)
                    gone = kv is None
                    if kv is not None:
                        with trio.move_on_after(HANDOVER_WATCH) as watched:
                            gone = await self.etcd.deleted(owner_key, kv.mod_revision)
                except EtcdError as err:
                    self.etcd_error = str(err)
                    await trio.sleep(self.poll)
                    continue
                if not gone:  # read it again: the move may have been called off
                    if not watched.cancelled_caught:  # the stream ended early: not in a loop
                        await trio.sleep(self.poll)
                    continue
                self._freed(name)
                if name not in self.taking:
                    await self._try(name)
            if name in self.owned:
                await self._forget_move(name, self.group.node, "done")
        finally:
            self.receiving.discard(name)

    def _stale(self) -> set[str]:
        """The pairs free for longer than a lease: their home, live, did not take them
        (its takeover failed, its disk full say), so any node that may own them does."""
        return {name for name, since in self.free_since.items()
                if self.view_at - since > self.group.lease}

    def _bound(self) -> int:
        """The lease this incarnation's keys are bound to. Raises EtcdUnavailable if it
        has none now (fenced meanwhile, by an earlier pair's takeover say): a key put
        with no lease would never expire, and its pair would stay owned by no one."""
        if not self.lease.lease or not self.lease.valid(now()):
            raise EtcdUnavailable("this node's lease ran out")
        return self.lease.lease

    async def _while_leased(self, write: Callable[[], Awaitable[object]]) -> None:
        """An idempotent etcd write, tried again for as long as this incarnation's lease
        lasts: one answer slower than the call timeout (a loaded machine, etcd busy) is
        not etcd lost, and fencing for it would give every pair up. Raises
        EtcdUnavailable once the lease has run out; the keep-alive fences then anyway."""
        while True:
            try:
                await write()
                return
            except EtcdUnavailable as err:
                if not self.lease.valid(now() + self.poll):
                    raise
                log.warning("etcd_write_retried", node=self.group.node, error=str(err),
                            lease_left=round(self.lease.left(now()), 3))
                await trio.sleep(self.poll / 5)  # a refusal comes back at once: not a spin

    def _freed(self, name: str) -> None:
        """The owner key of ``name`` is gone: the view, read before, says so from now on
        (this node's refusals then say the pair is moving here, not where it was)."""
        self.view.owners.pop(name, None)

    async def _try(self, name: str) -> None:
        """Try to become the owner of the free pair ``name``; take it over if so."""
        detected = now()
        value = json.dumps({"node": self.group.node, "advertise": self.group.advertise,
                            "writer": self.host.writer})
        # while the create is answered, the key may already be in a view: not an orphan
        self.taking.add(name)
        try:
            won, kv = await self.etcd.create(key(self.group.name, "owners", name), value,
                                             self._bound())
        except EtcdError as err:  # if etcd made the key all the same, orphans() finds it
            self.etcd_error = str(err)
            return
        finally:
            self.taking.discard(name)
        if won and kv is not None:
            await self._own(name, kv.create_revision, detected, how="created")

    def orphans(self) -> list[str]:
        """Pairs whose owner key is this incarnation's (so bound to its lease) though
        the node does not know it owns them: a create etcd applied but whose reply
        timed out (a loaded machine). Left alone, the key would keep the pair
        ownerless for as long as the node lives; the node takes them over instead."""
        return [name for name, o in sorted(self.view.owners.items())
                if o.node == self.group.node and o.lease == self.lease.lease
                and o.epoch not in self.let_go
                and name in self.pairs and name not in self.owned and name not in self.taking]

    async def _own(self, name: str, epoch: int, detected: float, how: str) -> None:
        """The pair ``name`` is this node's at ``epoch`` (its owner key ``how``: created
        now, or an orphan found bound to this node's lease): take it over, or give it
        up."""
        self.owned[name] = epoch
        self.rolled[name] = {}
        self.released.discard(name)
        self.taking.add(name)
        log.info("owner_acquired", structure=name, node=self.group.node, epoch=epoch, how=how)
        try:
            await self._takeover(name, epoch, detected)
        except EtcdUnavailable as err:
            self._fence(f"the takeover of {name} could not record its seal: {err}")
        except Exception as err:  # the pair could not be rebuilt here: give it up again
            log.exception("takeover_failed", structure=name, epoch=epoch,
                          error=f"{type(err).__name__}: {err}",
                          action=f"ownership given up; another node may take it, this one "
                                 f"tries again in {2 * self.group.lease} s")
            self.owned.pop(name, None)
            self.backoff[name] = now() + 2 * self.group.lease
            with trio.move_on_after(self.etcd.timeout):
                try:
                    if await self.etcd.delete_if(key(self.group.name, "owners", name), epoch):
                        self.let_go.add(epoch)
                except EtcdError:
                    pass  # still ours: orphans() finds it, and it is tried again
        finally:
            self.taking.discard(name)

    async def _takeover(self, name: str, epoch: int, detected: float) -> None:
        started = now()
        # the seals as they are now: a planned move may follow the last one within a poll
        try:
            kvs, revision = await self.etcd.get_prefix(key(self.group.name) + "/")
        except EtcdError as err:  # nothing done yet: give the pair up, not the node
            raise Deposed(f"the group's keys could not be read: {err}") from err
        self.view, self.view_at = View.read(self.group.name, kvs, revision), now()
        o = self.view.owners.get(name)
        if o is None or o.node != self.group.node or o.epoch != epoch:  # given up meanwhile
            raise Deposed(f"the owner key of {name} (epoch {epoch}) is no longer this node's")
        if self.host.writer in self.view.cuts(name):  # handed over earlier in this series
            await self._roll()
        seals = self.view.seals.get(name, [])
        before = self.view.cuts(name)
        previous = seals[-1].writer if seals else None
        writers = [w for w in list_series(self.host.log_dir) if w != self.host.writer
                   and (w == previous or w not in before)]
        handed = self.view.handed.get(name)
        known = {}  # a planned move's owner said where its series ends: no scan of it
        if handed is not None and seals and handed.epoch == seals[-1].epoch:
            known = {handed.writer: End(handed.lsn, handed.timestamp)}
        ends = known | await trio.to_thread.run_sync(
            seal, self.host.log_dir, [w for w in writers if w not in known])
        # every sealed writer at its highest cut (View.cuts): this seal alone says all
        # the earlier ones did, which are then deleted (a group with churn would keep
        # thousands, each read back at every poll)
        cut = {**before, **{w: max(e.lsn, before.get(w, 0)) for w, e in ends.items()}}
        cut.pop(self.host.writer, None)  # this node's own series is never cut for its pair
        timestamp = max([e.timestamp for e in ends.values()]
                        + [s.timestamp for s in seals], default=0)
        recorded = Seal(name, epoch, self.host.writer, cut, timestamp)
        await self._while_leased(lambda: self.etcd.put(key(self.group.name, "seals", name, epoch),
                                                        recorded.encode()))
        # in the view at once: a checkpoint of the pair before the next read of etcd
        # must cover the series just sealed at their cuts (Checkpoints.covered)
        self.view.seals[name] = [recorded]
        if seals:  # best effort: the next takeover deletes what is left
            with trio.move_on_after(self.etcd.timeout):
                try:
                    await self.etcd.delete_keys([key(self.group.name, "seals", name, s.epoch)
                                                 for s in seals if s.epoch != epoch])
                except EtcdError:
                    pass
        sealed = now()
        takeover = Takeover(name, epoch, cut, timestamp,
                            {"detect": round(started - detected, 3),
                             "seal": round(sealed - started, 3)},
                            lambda: self.owned.get(name) == epoch and self.valid(),
                            planned=self.view.moves.get(name) == self.group.node)
        log.info("structure_sealed", structure=name, epoch=epoch, cut=cut, timestamp=timestamp)
        await self.host.take(takeover)
        self.takeovers += 1
        log.info("takeover_done", structure=name, epoch=epoch, node=self.group.node,
                 phases=takeover.phases, seconds=round(now() - detected, 3))

    async def _roll(self) -> None:
        """A new series for this node, its keys saying so: the tailers of the pairs it
        owns follow the new one, after the old one to its end (standby.py)."""
        old, end = await self.host.roll()
        self.retired[old] = end
        writer = self.host.writer
        log.info("series_rolled", node=self.group.node, old=old, last_lsn=end, writer=writer)
        # both writes are idempotent (a put; a put on the owner key's own creation)
        await self._while_leased(partial(
            self.etcd.put, key(self.group.name, "nodes", self.group.node), json.dumps({
                "advertise": self.group.advertise, "writer": writer,
                "standby": self.group.standby}), lease=self._bound()))
        for pair, epoch in list(self.owned.items()):
            rolled = self.rolled.setdefault(pair, {})
            rolled[old] = end
            await self._while_leased(partial(
                self.etcd.put_if, key(self.group.name, "owners", pair), json.dumps({
                    "node": self.group.node, "advertise": self.group.advertise,
                    "writer": writer, "rolled": rolled}), epoch, self._bound()))

    def fence(self, why: str) -> None:
        """Stop acknowledging and give everything up (idempotent); the keep-alive then
        rejoins as a new incarnation."""
        self._fence(why)

    def _fence(self, why: str) -> None:
        if self.fenced_since is not None:
            return
        self.fenced_since = now()
        owned, self.owned = self.owned, {}
        self.released.clear()
        self.let_go.clear()  # keys of the old lease: never this node's orphans again
        self.lease.lost()
        log.error("fenced", node=self.group.node, why=why, structures=sorted(owned),
                  action="no more acknowledgements; the pairs go to other nodes; "
                         "rejoining as a new incarnation once etcd answers")
        self.host.lose(why)

    async def _revoke(self) -> None:
        """Give back a lease this node will not use (it expires anyway)."""
        with trio.move_on_after(self.etcd.timeout):
            try:
                await self.etcd.revoke(self.lease.lease)
            except EtcdError:
                pass
        self.lease.lost()

    async def leave(self) -> None:
        """At a clean stop, after the images are saved: give the pairs up at once."""
        with trio.move_on_after(2 * self.etcd.timeout):
            try:
                for name, epoch in list(self.owned.items()):
                    await self.etcd.delete_if(key(self.group.name, "owners", name), epoch)
                    log.info("owner_lost", structure=name, epoch=epoch, why="clean stop")
                if self.lease.lease:
                    await self.etcd.revoke(self.lease.lease)
            except EtcdError as err:
                log.warning("group_leave_incomplete", error=str(err),
                            action="the pairs go to other nodes once the lease runs out")
        self.owned.clear()

