"""Restart processing of one data set (smds/restart.py): what its STATUS lets the
daemon find and do when it opens it: make a NEW one, refuse a missing ACTIVE one,
use a map saved at a clean close, rebuild one from the entries naming it."""

import pytest

from cqsd.config import loads
from cqsd.server.smds.restart import restart
from cqsd.smds import BufferPool
from cqsd.smds.states import Status

CONFIG = """
[[structure]]
name = "S"
size = "16MiB"
offload = "smds"
dssize = "1MiB"
dsblock = "8KiB"
"""
KEY = ("S", "APP1")


@pytest.fixture
def sc():
    return loads(CONFIG).structure("S")


def pool(sc):
    return BufferPool(4, sc.dsblock)


def test_a_new_data_set_is_made(tmp_path, sc):
    """NEW and missing: the file is formatted, its map empty, nothing scanned."""
    dataset, how, lost = restart(tmp_path, KEY, Status.NEW, {}, sc, pool(sc), list)
    try:
        assert (how, lost) == ("created", []) and dataset.space is not None
        assert dataset.space.usage().used_percent == 0
    finally:
        dataset.abandon()


def test_a_missing_active_data_set_is_not_made_anew(tmp_path, sc):
    """ACTIVE means the daemon wrote to it: a missing file is an error, not a format."""
    with pytest.raises(FileNotFoundError):
        restart(tmp_path, KEY, Status.ACTIVE, {}, sc, pool(sc), list)


def test_a_clean_close_leaves_a_map_the_next_open_uses(tmp_path, sc):
    """A map saved at close, named by its timestamp in the repository's row, is
    loaded without asking for the entries."""
    dataset, _, _ = restart(tmp_path, KEY, Status.NEW, {}, sc, pool(sc), list)
    record = {"created": dataset.header.created, "map_time": dataset.close()}
    dataset.abandon()

    def owned():
        raise AssertionError("a saved map needs no scan of the structure")

    again, how, lost = restart(tmp_path, KEY, Status.ACTIVE, record, sc, pool(sc), owned)
    try:
        assert (how, lost) == ("saved map", [])
    finally:
        again.abandon()


def test_without_a_current_map_it_is_rebuilt_from_the_entries(tmp_path, sc):
    """After a crash (no saved map named) the map is rebuilt from the entries that
    name the data set: none here, so an empty map."""
    dataset, _, _ = restart(tmp_path, KEY, Status.NEW, {}, sc, pool(sc), list)
    record = {"created": dataset.header.created, "map_time": None}
    dataset.abandon()
    again, how, lost = restart(tmp_path, KEY, Status.ACTIVE, record, sc, pool(sc), list)
    try:
        assert (how, lost) == ("rebuilt", []) and again.space is not None
    finally:
        again.abandon()
