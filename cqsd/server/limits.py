"""Every size limit a request can hit, checked before the engine applies anything,
and the log record's own.

Design note. The frame limit is the decoder's (a request frame over
``max_message`` plus ``FRAME_HEADROOM`` never reaches a handler);
``max_message`` is the operator's. The logstream refuses a record body over
16 MiB (``MAX_BODY``, docs/logstream.md), and a record is the daemon's unit
of atomicity: a commit, or an overflow move's ``O`` with its ``I``, is one
record or nothing. So that limit is kept where a record's size is decided,
not where it is written:

- a request whose recoverable payloads could not fit one record is refused
  before the engine applies it (``Limits``), naming the limit so the caller
  can act: put the message non-recoverable, or split the unit of work;
- an offloaded put's blocks, which need not share its entry's record, go in
  records of their own before it (``split``; docs/smds.md, "The record limit"),
  so a recoverable offloaded message may be up to ``max_message``;
- overflow moves are batched by bytes (``engine/pair.py`` ``MOVE_BYTES``);
- what is left can only grow by count: an operator's dequeue, or a peer
  recovery or cold start of a client with a million locks, logs a million
  small effects. Each of those stands alone (a delete, a lock, a return, a
  move to the cold queue), so such a record is split into several
  (``split``) and the reply waits for the last. A crash between them leaves
  part of the operation done, which is what a crash during it means anyway.

A record that holds payloads or move pairs and is still too large is a bug
upstream: ``split`` raises RecordTooLarge and the daemon stops. The
structure's space, staging segments included, is the engine's to check
(STRUCTURE_FULL), as is a commit's op count (``protocol/requests.py``).
"""

from cqsproto import FRAME_HEADROOM, MAX_FRAME_LIMIT, max_frame_for
from logstream.record import MAX_BODY

from ..engine import CQSError, Put, Reason
from ..records import (
    B_DATA,
    BLOCK,
    E_DATA,
    EFFECTS,
    KEY,
    M_MAP,
    MAPPED,
    MOVED_IN,
    MOVED_OUT,
    OTHERS,
    PUT,
    STRUCTURE,
    effect_lists,
)

# Room for the record's own map keys, structure names and msgpack headers.
RECORD_HEADROOM = 64 * 1024
RECORD_BUDGET = MAX_BODY - RECORD_HEADROOM
# The most one effect packs to apart from its payload: a kind, an entry id,
# a queue type, a 15-byte name, a home (type and name), a client name, a time
# and a count, each with its msgpack header, is under 80 bytes.
EFFECT_BOUND = 96
# An offloaded put's B effect beyond its data (kind, id, page, a bin header), and
# each range's share of its M effect's map (a page and a count).
BLOCK_BOUND, RANGE_BOUND = 48, 20
# A record's idempotency key (records.KEY): a 16-character client name, an incarnation
# of up to 32 (cqsproto.requests.MAX_INCARNATION), a sequence and headers; and an id.
KEY_BOUND, ID_BOUND = 80, 9
_LINKED = (PUT, MOVED_IN, MOVED_OUT, BLOCK, MAPPED)  # effects that must stay in their record
# A reply's share of its frame beyond the payloads: ids, names, times per message.
REPLY_HEADROOM = 2 * FRAME_HEADROOM


class Limits:
    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.max_frame = max_frame_for(max_message)
        # Replies carry up to ``reply_bytes`` of payload plus one more message
        # (read and browse stop once past it), and their per-message fields.
        self.reply_bytes = max_message
        self.max_reply = min(2 * max_message + REPLY_HEADROOM, MAX_FRAME_LIMIT)
        # one put's record, with room for its idempotency key and the id it names
        self.recoverable = RECORD_BUDGET - EFFECT_BOUND - KEY_BOUND - ID_BOUND

    def check_message(self, data: bytes, recoverable: bool) -> None:
        """Raises MESSAGE_TOO_LARGE past max_message, or past one log record if
        ``recoverable``."""
        self.check_size(len(data))
        if recoverable:
            self.check_record(len(data))

    def check_size(self, nbytes: int) -> None:
        """Raises MESSAGE_TOO_LARGE past max_message (what every put checks first:
        whether a recoverable one must also fit a record depends on its offload)."""
        if nbytes > self.max_message:
            raise CQSError(Reason.MESSAGE_TOO_LARGE,
                           f"message of {nbytes} bytes exceeds max_message {self.max_message}")

    def check_record(self, nbytes: int) -> None:
        """Raises MESSAGE_TOO_LARGE if a recoverable payload of ``nbytes`` kept in the
        structure could not be logged in one record."""
        if nbytes > self.recoverable:
            raise CQSError(Reason.MESSAGE_TOO_LARGE,
                           f"recoverable message of {nbytes} bytes exceeds {self.recoverable}, "
                           "the most one log record holds; put it non-recoverable or smaller, "
                           "or to a structure with offload = \"smds\"")

    def check_commit(self, batch: list, extra: int = 0) -> None:
        """Raises MESSAGE_TOO_LARGE if a commit's log record could not hold it
        (``extra``: what logging its offloaded puts adds, ``offload_bound``), its
        idempotency key and an id per operation included."""
        logged = (EFFECT_BOUND + ID_BOUND) * len(batch) + KEY_BOUND + extra
        for op in batch:
            if type(op) is Put:
                self.check_message(op.data, op.recoverable)
                if op.recoverable:
                    logged += len(op.data)
                    if op.not_before is not None:  # and its N effect
                        logged += EFFECT_BOUND
        if logged > RECORD_BUDGET:
            raise CQSError(Reason.MESSAGE_TOO_LARGE,
                           f"commit of {len(batch)} operations would log {logged} bytes; one "
                           f"commit is one log record of at most {RECORD_BUDGET}: split the unit "
                           "of work")


def offload_bound(ranges: int) -> int:
    """What logging an offloaded put of ``ranges`` ranges in a commit's record adds
    beyond its payload: a B effect per range and the M effect."""
    return ranges * (BLOCK_BOUND + RANGE_BOUND) + EFFECT_BOUND


class RecordTooLarge(Exception):
    """A record that cannot be written whole and must not be split."""


def bound(record: dict) -> int:
    """An upper bound of the record's packed size (once per record, so the common
    record of one effect and no overflow half costs no list building)."""
    others = record.get(OTHERS)
    total = _bound(record[EFFECTS])
    if others:
        total += sum(_bound(effects) for effects in others.values())
    key = record.get(KEY)
    if key is not None:  # client, incarnation and sequence, then an id per put
        total += KEY_BOUND + ID_BOUND * len(key[3])
    return total


def _bound(effects: list) -> int:
    total = EFFECT_BOUND * len(effects)
    for effect in effects:
        kind = effect[0]
        if kind == PUT or kind == MOVED_IN:
            total += len(effect[E_DATA])
        elif kind == BLOCK:
            total += len(effect[B_DATA]) + BLOCK_BOUND - EFFECT_BOUND
        elif kind == MAPPED:
            total += RANGE_BOUND * len(effect[M_MAP][3]) // 2
    return total


def split(record: dict, budget: int = RECORD_BUDGET) -> list[dict]:
    """``record`` as one or more records that each fit ``budget``; raises
    RecordTooLarge for a record too large whose effects must stay together."""
    size = bound(record)
    if size <= budget:
        return [record]
    if any(e[0] == BLOCK for _, effects in effect_lists(record) for e in effects):
        return _blocks_first(record, budget)
    if any(e[0] in _LINKED for _, effects in effect_lists(record) for e in effects):
        raise RecordTooLarge(f"a record of {size} bytes for structure {record[STRUCTURE]} "
                             f"holds payloads or overflow moves over the {budget}-byte budget")
    step = max(1, budget // EFFECT_BOUND)
    parts = [{STRUCTURE: name, EFFECTS: effects[i:i + step]}
             for name, effects in effect_lists(record) for i in range(0, len(effects), step)]
    if KEY in record:  # a commit of many deletes: its key with the last of its effects
        parts[-1][KEY] = record[KEY]
    return parts


def _blocks_first(record: dict, budget: int) -> list[dict]:
    """An offloaded put's ``B`` effects in records of their own, each within
    ``budget``, before the record of everything else (docs/smds.md, "Log
    records"): a recoverable message may then be larger than a record. The
    journal writes them all after the blocks' fsync and acknowledges the last,
    so a crash between them leaves ``B`` records that no ``M`` follows, which
    both folds drop (and restart's space map, rebuilt from the entries, frees)."""
    parts: list[dict] = []
    rest: dict = {STRUCTURE: record[STRUCTURE]}
    if KEY in record:
        rest[KEY] = record[KEY]
    for name, effects in effect_lists(record):
        kept: list = []
        chunk: list = []
        size = 0
        for effect in effects:
            if effect[0] != BLOCK:
                kept.append(effect)
                continue
            cost = len(effect[B_DATA]) + BLOCK_BOUND
            if chunk and size + cost > budget:
                parts.append({STRUCTURE: name, EFFECTS: chunk})
                chunk, size = [], 0
            chunk.append(effect)
            size += cost
        if chunk:
            parts.append({STRUCTURE: name, EFFECTS: chunk})
        if name == record[STRUCTURE]:
            rest[EFFECTS] = kept
        elif kept:
            rest.setdefault(OTHERS, {})[name] = kept
    return parts + split(rest, budget)
