"""Pages, ranges, and how a payload is cut into message blocks (docs/smds.md).

A message occupies one or more ranges, each a run of pages inside one logical
block, and each range begins with a 64-byte block prefix. The allocation rule
(every range but the last filled, the last just big enough) is what both the
space map follows when it hands ranges out and the data map checks when it is
decoded, so the arithmetic lives here, once.
"""

from __future__ import annotations

from typing import NamedTuple

PAGE = 4096  # MQ's 4 KiB control interval (seed 001, "DSBLOCK")
PREFIX = 64  # bytes of block prefix at the start of every range (header.py lays them out)


class Range(NamedTuple):
    """``pages`` consecutive pages from data-set page ``page``, inside one block."""

    page: int
    pages: int


class Piece(NamedTuple):
    """Where one message block's payload comes from: ``nbytes`` of the payload
    from ``offset``, stored after the prefix of ``range``."""

    range: Range
    offset: int
    nbytes: int


def room(count: int) -> int:
    """Payload bytes a range of ``count`` pages carries after its prefix."""
    return count * PAGE - PREFIX


def pages_for(nbytes: int) -> int:
    """Pages a message block of ``nbytes`` of payload needs (at least one: the prefix)."""
    return (PREFIX + nbytes + PAGE - 1) // PAGE


def pieces(length: int, ranges: tuple[Range, ...] | list[Range]) -> list[Piece]:
    """Cut a payload of ``length`` bytes over ``ranges`` by the allocation rule.

    Raises ValueError when the ranges do not follow it: no range, a count below
    one, a range before the last not filled, or a last range with other than
    the pages its share needs (no empty last range unless it is the only one).
    """
    if not ranges:
        raise ValueError("no range")
    out = []
    offset = 0
    for i, r in enumerate(ranges):
        if r.pages < 1 or r.page < 0:
            raise ValueError(f"range {i} {tuple(r)} is empty or negative")
        last = i == len(ranges) - 1
        nbytes = length - offset if last else room(r.pages)
        if not last and offset + nbytes >= length:
            raise ValueError(f"range {i} {tuple(r)} is not the last but the payload ends in it")
        if last and (pages_for(nbytes) != r.pages or (nbytes == 0 and i > 0)):
            raise ValueError(f"the last range {tuple(r)} does not fit its {nbytes} bytes")
        out.append(Piece(r, offset, nbytes))
        offset += nbytes
    return out
