"""The system checkpoint file: what it keeps reads back the same, and a damaged one
is named, kept aside and not used."""

import pytest
import trio

from cqsd.server.registrations import Damaged, Registrations, decode, encode

KEPT = {"IMSA": {("MSGQ01", 1, "TRANX"), ("MSGQ01", 4, "LTERMZ")}, "IMSB": set()}


def test_what_is_encoded_decodes_the_same():
    """Every client, with or without interests, comes back as it was."""
    assert decode(encode(KEPT)) == KEPT


@pytest.mark.parametrize("damage", [lambda b: b[:-1], lambda b: b[:5] + b"x" + b[6:],
                                    lambda b: b""])
def test_damage_is_named(damage):
    """A file cut short, a changed byte or an empty file is Damaged, never a guess."""
    with pytest.raises(Damaged):
        decode(damage(encode(KEPT)))


async def test_a_change_is_durable_when_its_wait_ends_and_a_damaged_file_is_moved_aside(
        tmp_path):
    """durable() returns once the file holds the change; a start on a damaged file
    keeps it as .broken and begins with no registrations."""
    path = tmp_path / "clients.ckpt"
    kept = Registrations(path)
    async with trio.open_nursery() as nursery:
        kept.clients.update(KEPT)
        kept.changed(lambda name, task: nursery.start_soon(task))
        await kept.durable()
        assert not kept.pending()
        again = Registrations(path)
        again.load()
        assert again.clients == KEPT
    path.write_bytes(b"not a checkpoint")
    damaged = Registrations(path)
    damaged.load()
    assert damaged.clients == {} and (tmp_path / "clients.ckpt.broken").exists()
