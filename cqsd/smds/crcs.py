"""The CRC-32Cs of a payload and of each of its message blocks, in one pass.

A put needs both, and a read from the disk checks both: each block's prefix
carries the CRC of its slice, and the data map the CRC of the whole payload
(docs/smds.md). Computed apart, they read the payload twice (~50 us a MiB
each). CRC-32C is linear, so the whole one follows from the blocks':
``crc(A + B) = Z(len B)(crc(A)) ^ crc(B)``, where ``Z(n)``, the effect of ``n``
zero bytes on a CRC, is a 32 x 32 bit matrix over GF(2). Every block between
the first and the last fills its logical block, so it has one length a data set
(``dsblock`` less the prefix) and its matrix is built once (33 CRCs of that many
zeros, ~0.4 ms for 256 KiB) and then applied as four table look-ups. The last
block's length varies with the message, so it is instead read a second time,
continuing the CRC of what came before it: at most one block more, rather than
the whole payload. A read's check is as strong as before: every block's data
must match its prefix's CRC, so the CRC joined from those is the payload's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from crc32c import crc32c

from .pages import Piece

Tables = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@functools.lru_cache(maxsize=8)
def _zeros(nbytes: int) -> Tables:
    """``Z(nbytes)`` as four tables, one a byte of the CRC it is applied to: the
    XOR of the matrix's columns for the bits of that byte."""
    zeros = bytes(nbytes)
    base = crc32c(zeros)
    columns = [crc32c(zeros, 1 << bit) ^ base for bit in range(32)]
    tables = []
    for byte in range(4):
        table = [0] * 256
        for value in range(1, 256):
            low = value & -value  # the lowest bit set: the rest was filled before
            table[value] = table[value ^ low] ^ columns[8 * byte + low.bit_length() - 1]
        tables.append(tuple(table))
    return tables[0], tables[1], tables[2], tables[3]


def shifted(crc: int, nbytes: int) -> int:
    """``crc`` as it would be after ``nbytes`` more zero bytes, less what those
    zeros alone give: so ``shifted(crc32c(a), len(b)) ^ crc32c(b) == crc32c(a + b)``."""
    t0, t1, t2, t3 = _zeros(nbytes)
    return t0[crc & 0xFF] ^ t1[crc >> 8 & 0xFF] ^ t2[crc >> 16 & 0xFF] ^ t3[crc >> 24]


def payload_crcs(payload: memoryview, pieces: Sequence[Piece]) -> tuple[list[int], int]:
    """The CRC-32C of each piece's slice of ``payload``, and of the whole payload."""
    blocks = [(data, crc32c(data)) for data in (payload[offset:offset + nbytes]
                                                for _, offset, nbytes in pieces)]
    return [crc for _, crc in blocks], joined(blocks)


def joined(blocks: Sequence[tuple[bytes | memoryview, int]]) -> int:
    """The CRC-32C of the blocks' data end to end, from each block's (data, CRC):
    the blocks between the first and the last by their CRCs alone, the last read
    again (the module note)."""
    whole = 0
    last = len(blocks) - 1
    for i, (data, crc) in enumerate(blocks):
        if i == 0:
            whole = crc
        elif i < last:
            whole = shifted(whole, len(data)) ^ crc
        else:
            whole = crc32c(data, whole)
    return whole
