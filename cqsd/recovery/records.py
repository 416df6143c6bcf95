"""How large a log record may get, and splitting one that would be too large.

Design note. The logstream refuses a record body over 16 MiB (``MAX_BODY``,
docs/logstream.md), and a record is the daemon's unit of atomicity: a commit,
or an overflow move's ``O`` with its ``I``, is one record or nothing. So the
limit is kept where the record's size is decided, not where it is written:

- a request whose recoverable payloads could not fit one record is refused
  before the engine applies it (``server/limits.py``, with ``RECORD_BUDGET``
  and ``EFFECT_BOUND`` from here);
- overflow moves are batched by bytes (``engine/pair.py`` ``MOVE_BYTES``);
- what is left can only grow by count: an operator's dequeue, a peer recovery
  or a cold start of a client with a million locks logs a million small
  effects. Each of those effects stands alone (a delete, a lock, a return, a
  move to the cold queue), so such a record is split into several (``split``)
  and the reply waits for the last one. A crash between them leaves part of
  the operation done, which is what the operation means anyway.

A record that holds payloads or move pairs and is still too large is a bug
upstream: ``split`` raises RecordTooLarge and the journal stops the daemon.
"""

from logstream.record import MAX_BODY

from ..engine.structure import MOVED_IN, MOVED_OUT, PUT

# Room for the record's own map keys, structure names and msgpack headers.
RECORD_HEADROOM = 64 * 1024
RECORD_BUDGET = MAX_BODY - RECORD_HEADROOM
# The most one effect packs to apart from its payload: a kind, an entry id,
# a queue type, a 15-byte name, a home (type and name), a client name, a time
# and a count, each with its msgpack header, is under 80 bytes.
EFFECT_BOUND = 96
_PAYLOAD = {PUT: 4, MOVED_IN: 4}  # effect kind -> index of its payload
_LINKED = {PUT, MOVED_IN, MOVED_OUT}  # effects that must stay in their record


class RecordTooLarge(Exception):
    """A record that cannot be written whole and must not be split."""


def bound(record: dict) -> int:
    """An upper bound of the record's packed size."""
    total = 0
    for effects in _effect_lists(record):
        total += EFFECT_BOUND * len(effects)
        for effect in effects:
            at = _PAYLOAD.get(effect[0])
            if at is not None:
                total += len(effect[at])
    return total


def split(record: dict, budget: int = RECORD_BUDGET) -> list[dict]:
    """``record`` as one or more records that each fit ``budget``; raises
    RecordTooLarge for a record too large whose effects must stay together."""
    if bound(record) <= budget:
        return [record]
    if any(e[0] in _LINKED for effects in _effect_lists(record) for e in effects):
        raise RecordTooLarge(f"a record of {bound(record)} bytes for structure {record['s']} "
                             f"holds payloads or overflow moves over the {budget}-byte budget")
    step = max(1, budget // EFFECT_BOUND)
    parts = []
    for name, effects in [(record["s"], record["e"]), *record.get("x", {}).items()]:
        parts += [{"s": name, "e": effects[i:i + step]} for i in range(0, len(effects), step)]
    return parts


def _effect_lists(record: dict) -> list[list]:
    return [record["e"], *record.get("x", {}).values()]
