"""Data set files: create, open, positioned writes and checked reads, expansion, clean
close, and every kind of damage named — on real files with real fsyncs."""

import errno
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cqsd.smds import (
    BadPrefix,
    BufferPool,
    DataMap,
    DownLevel,
    ExpandFailed,
    ForeignHeader,
    IncompleteRecovery,
    ReadFailed,
    Recreated,
    ShortDataSet,
    TornHeader,
    Unformatted,
    WriteFailed,
)
from cqsd.smds.dataset import RUN_PARTS, START_WRITEBACK, DataSet, path_of
from cqsd.smds.header import read_header
from cqsd.smds.pages import PAGE

DSBLOCK = 2 * PAGE  # small blocks: a few KiB of payload crosses several of them
DSSIZE = 16 * DSBLOCK
Q = ("L", "Q1")


def create(tmp_path, *, pool=None, dssize=DSSIZE, owner="C1"):
    return DataSet.create(tmp_path, "S1", owner, dsblock=DSBLOCK, dssize=dssize, pool=pool)


def put(ds, entry_id, payload, queue=Q, synced=False):
    """Allocate, map and write ``payload`` as a put does; returns its data map."""
    dm = DataMap.of(ds.owner, payload, ds.space.allocate(queue, len(payload)))
    ds.write_message(dm, entry_id, payload, synced)
    return dm


def headers(tmp_path, owner="C1"):
    with open(path_of(tmp_path, "S1", owner), "rb") as f:
        return f.read(2 * PAGE)


def test_a_new_data_set_is_preallocated_with_one_header_and_open(tmp_path):
    """create() rounds dssize up to whole blocks, writes copy A (sequence 1, OPEN) and
    leaves no temporary file."""
    tmp = tmp_path
    ds = DataSet.create(tmp, "S1", "C1", dsblock=DSBLOCK, dssize=DSSIZE + 1)
    path = path_of(tmp, "S1", "C1")
    assert path == tmp / "smds" / "S1" / "C1.smds"
    assert os.path.getsize(path) == ds.size == DSSIZE + DSBLOCK
    assert os.stat(path).st_blocks * 512 >= ds.size  # the space is really had
    h = read_header(headers(tmp))
    assert (h.sequence, h.is_open, h.structure, h.owner, h.map_page) == (1, True, "S1", "C1", 0)
    assert headers(tmp)[PAGE:] == bytes(PAGE)
    assert ds.space.usage().used_pages == 0
    assert os.listdir(path.parent) == ["C1.smds"]
    ds.abandon()


def test_create_refuses_to_format_over_an_existing_data_set(tmp_path):
    """An existing file is formatted over only with replace=True."""
    create(tmp_path).abandon()
    with pytest.raises(FileExistsError):
        create(tmp_path)
    ds = DataSet.create(tmp_path, "S1", "C1", dsblock=DSBLOCK, dssize=DSSIZE, replace=True)
    assert read_header(headers(tmp_path)).created == ds.header.created
    ds.abandon()


def test_a_clean_close_saves_the_space_map_and_a_matching_open_reuses_it(tmp_path):
    """close() returns the timestamp; open() with it gets the same map back and the
    message reads back; the header is OPEN again and the file cut to its extent."""
    ds = create(tmp_path)
    payload = os.urandom(3 * PAGE)
    dm = put(ds, 7, payload)
    before = ds.space.usage()
    stamp = ds.close()
    h = read_header(headers(tmp_path))
    assert (h.is_open, h.map_time, h.map_page, h.sequence) == (False, stamp, DSSIZE // PAGE, 2)
    assert os.path.getsize(ds.path) > DSSIZE

    again = DataSet.open(tmp_path, "S1", "C1", map_time=stamp, created=h.created)
    assert again.rebuild_reason is None
    assert again.space.usage() == before
    assert again.read(dm, 7) == payload
    assert read_header(headers(tmp_path)).is_open
    assert read_header(headers(tmp_path)).map_page == 0
    assert os.path.getsize(again.path) == DSSIZE
    again.close()


@pytest.mark.parametrize(("repository", "damage", "reason"), [
    ("other", None, "timestamp"),
    (None, None, "timestamp"),
    ("same", "body", "body-crc"),
    ("same", "magic", "magic"),
])
def test_a_saved_map_that_cannot_be_trusted_asks_for_a_rebuild(tmp_path, repository, damage,
                                                               reason):
    """Another timestamp than the repository's, or a damaged checkpoint, gives no map and a
    reason; the data set opens all the same."""
    ds = create(tmp_path)
    put(ds, 1, b"x" * 5000)
    stamp = ds.close()
    if damage:
        at = DSSIZE + (64 if damage == "body" else 0)  # the first block entry, or the magic
        with open(ds.path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
    map_time = {"other": stamp + 1, None: None, "same": stamp}[repository]
    again = DataSet.open(tmp_path, "S1", "C1", map_time=map_time)
    assert (again.space, again.rebuild_reason) == (None, reason)
    with pytest.raises(ValueError, match="rebuild"):
        again.close()
    again.abandon()


def test_a_data_set_not_closed_cleanly_asks_for_a_rebuild(tmp_path):
    """After a crash (no close) the header names no saved map, whatever the repository holds."""
    ds = create(tmp_path)
    stamp = ds.close()
    opened = DataSet.open(tmp_path, "S1", "C1", map_time=stamp)
    opened.abandon()  # the crash
    again = DataSet.open(tmp_path, "S1", "C1", map_time=stamp)
    assert (again.space, again.rebuild_reason) == (None, "no-map")
    again.abandon()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(st.binary(max_size=3 * DSBLOCK), min_size=1, max_size=6),
       pooled=st.booleans(), synced=st.booleans())
def test_payloads_read_back_byte_for_byte(tmp_path_factory, payloads, pooled, synced):
    """Random payloads from 0 bytes to several blocks, on a few queues, read back exactly,
    twice (the second time from the pool), and again after a close and open."""
    tmp = tmp_path_factory.mktemp("ds")
    pool = BufferPool(4, DSBLOCK) if pooled else None
    ds = create(tmp, pool=pool, dssize=64 * DSBLOCK)
    maps = [(i, put(ds, i, p, queue=("L", f"Q{i % 2}"), synced=synced), p)
            for i, p in enumerate(payloads, 1)]
    for _ in range(2):
        for entry_id, dm, payload in maps:
            assert ds.read(dm, entry_id) == payload
    stamp = ds.close()
    again = DataSet.open(tmp, "S1", "C1", map_time=stamp)
    for entry_id, dm, payload in maps:
        assert again.read(dm, entry_id) == payload
    again.abandon()


def test_a_write_an_fdatasync_will_follow_starts_the_disk_on_exactly_its_blocks(
        tmp_path, monkeypatch):
    """A synced write hints each run of blocks it wrote, and no other bytes; an
    unsynced one hints nothing; a hint the kernel refuses fails nothing."""
    ds = create(tmp_path)
    hints = []
    real = os.posix_fadvise

    def watched(fd, offset, length, advice):
        hints.append((fd, offset, length, advice))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", watched)
    put(ds, 1, b"a" * (3 * DSBLOCK))  # no fdatasync follows: nothing started
    assert hints == []
    first = put(ds, 2, b"b" * 100, synced=True)
    put(ds, 3, b"c" * 100, queue=("L", "Q2"))  # between them, not hinted
    payload = os.urandom(2 * DSBLOCK)
    dm = put(ds, 4, payload, synced=True)
    assert len(hints) >= 2
    hinted = {(offset, offset + length) for fd, offset, length, _ in hints if fd == ds.fd}
    assert {advice for *_, advice in hints} == {START_WRITEBACK}
    for m, data in ((first, b"b" * 100), (dm, payload)):
        blocks = [(p, p + len(prefix) + len(d)) for p, prefix, d in m.blocks(4, data)]
        assert all(any(a <= start and end <= b for a, b in hinted) for start, end in blocks)
    covered = sum(b - a for a, b in hinted)
    assert covered == sum(len(prefix) + len(d) for m, data in ((first, b"b" * 100), (dm, payload))
                          for _, prefix, d in m.blocks(4, data))

    def refused(fd, offset, length, advice):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(os, "posix_fadvise", refused)
    again = put(ds, 5, b"d" * 5000, synced=True)
    ds.sync()
    assert ds.read(dm, 4) == payload and ds.read(again, 5) == b"d" * 5000
    ds.abandon()


def test_the_pool_serves_a_second_read_and_a_rewrite_is_not_served_stale(tmp_path):
    """A read of blocks no longer held as written misses, and a repeated read is all
    hits; after the pages are freed and written with another message, a read sees
    the new one."""
    pool = BufferPool(8, DSBLOCK)
    ds = create(tmp_path, pool=pool)
    first = put(ds, 1, b"a" * 5000)
    pool.invalidate("C1", first.ranges)
    assert ds.read(first, 1) == b"a" * 5000
    assert (pool.statistics().misses, pool.statistics().hits) == (len(first.ranges), 0)
    assert ds.read(first, 1) == b"a" * 5000
    assert (pool.statistics().misses, pool.statistics().hits) == (len(first.ranges),) * 2
    ds.space.free(first.ranges, None)
    second = put(ds, 2, b"b" * 5000)
    assert second.ranges == first.ranges
    assert ds.read(second, 2) == b"b" * 5000
    with pytest.raises(BadPrefix) as error:
        ds.read(first, 1)
    assert error.value.reason == "wrong-entry"
    ds.abandon()


def test_a_read_with_every_buffer_in_use_still_succeeds_and_counts_a_wait(tmp_path):
    """A read that finds no free buffer reads into its own memory."""
    pool = BufferPool(1, DSBLOCK)
    ds = create(tmp_path, pool=pool)
    dm = put(ds, 1, b"z" * 10000)  # two ranges, one buffer
    pool.invalidate("C1", dm.ranges)
    assert ds.read(dm, 1) == b"z" * 10000
    assert pool.statistics().waits == 1 and pool.statistics().lowest_free == 0
    ds.abandon()


@pytest.mark.parametrize(("entry_id", "flip", "reason"), [
    (2, None, "wrong-entry"),
    (1, 64 + 10, "bad-crc"),
    (1, 5, "torn"),
])
def test_a_block_that_is_not_the_one_the_map_names_is_refused_by_name(tmp_path, entry_id,
                                                                       flip, reason):
    """Another entry's block, a flipped data byte or a flipped prefix byte is BadPrefix,
    and the bad bytes are not kept in the pool."""
    pool = BufferPool(4, DSBLOCK)
    ds = create(tmp_path, pool=pool)
    dm = put(ds, 1, os.urandom(1000))
    pool.invalidate("C1", dm.ranges)  # gone from the pool, as after a restart
    if flip is not None:
        at = dm.ranges[0].page * PAGE + flip
        os.pwrite(ds.fd, bytes([os.pread(ds.fd, 1, at)[0] ^ 1]), at)
    with pytest.raises(BadPrefix) as error:
        ds.read(dm, entry_id)
    assert error.value.reason == reason
    assert pool.statistics().cached == 0
    ds.abandon()


def test_pages_never_written_read_as_unwritten(tmp_path):
    """A map pointing at pages no put wrote finds zeros: BadPrefix unwritten."""
    ds = create(tmp_path)
    dm = DataMap.of("C1", b"hello", ds.space.allocate(Q, 5))
    with pytest.raises(BadPrefix) as error:
        ds.read(dm, 1)
    assert error.value.reason == "unwritten"
    ds.abandon()


def test_a_data_set_shorter_than_its_extent_is_a_smaller_copy_or_named(tmp_path):
    """A file cut below the size its header records is taken at the whole blocks it
    holds, its space map to be rebuilt (a smaller copy, seed 000); below two blocks,
    or cut inside the header pages, it is ShortDataSet; an empty file is Unformatted."""
    ds = create(tmp_path)
    stamp = ds.close()
    os.truncate(ds.path, DSSIZE - DSBLOCK - 100)
    smaller = DataSet.open(tmp_path, "S1", "C1", map_time=stamp)
    assert (smaller.size, smaller.space, smaller.rebuild_reason) == (
        DSSIZE - 2 * DSBLOCK, None, "smaller-copy")
    assert os.path.getsize(ds.path) == DSSIZE - 2 * DSBLOCK
    assert read_header(headers(tmp_path)).size == DSSIZE - 2 * DSBLOCK
    smaller.abandon()
    os.truncate(ds.path, DSBLOCK + 100)
    with pytest.raises(ShortDataSet):
        DataSet.open(tmp_path, "S1", "C1", map_time=None)
    os.truncate(ds.path, 100)
    with pytest.raises(ShortDataSet):
        DataSet.open(tmp_path, "S1", "C1", map_time=None)
    os.truncate(ds.path, 0)
    with pytest.raises(Unformatted):
        DataSet.open(tmp_path, "S1", "C1", map_time=None)


def test_another_structures_or_owners_data_set_is_foreign(tmp_path):
    """A file holding another data set's header is ForeignHeader, with nothing written."""
    create(tmp_path).close()
    other = path_of(tmp_path, "S1", "C2")
    original = path_of(tmp_path, "S1", "C1").read_bytes()
    other.write_bytes(original)
    with pytest.raises(ForeignHeader) as error:
        DataSet.open(tmp_path, "S1", "C2", map_time=None)
    assert error.value.reason == "wrong-owner"
    (tmp_path / "smds" / "S2").mkdir()
    path_of(tmp_path, "S2", "C1").write_bytes(original)
    with pytest.raises(ForeignHeader) as error:
        DataSet.open(tmp_path, "S2", "C1", map_time=None)
    assert error.value.reason == "wrong-structure"
    assert path_of(tmp_path, "S2", "C1").read_bytes() == original


def test_a_data_set_formatted_again_is_recreated(tmp_path):
    """A valid header with another creation time than the repository's is Recreated."""
    created = create(tmp_path).header.created
    DataSet.create(tmp_path, "S1", "C1", dsblock=DSBLOCK, dssize=DSSIZE, replace=True).close()
    with pytest.raises(Recreated):
        DataSet.open(tmp_path, "S1", "C1", map_time=None, created=created)


def test_a_torn_header_copy_leaves_the_previous_header_in_force(tmp_path):
    """The close's header (copy B) torn: the open falls back on copy A, which names no
    saved map, so a rebuild is asked for; both copies torn is TornHeader."""
    ds = create(tmp_path)
    stamp = ds.close()
    with open(ds.path, "r+b") as f:
        f.seek(PAGE + 40)
        f.write(b"\xff")
    again = DataSet.open(tmp_path, "S1", "C1", map_time=stamp)
    assert (again.space, again.rebuild_reason) == (None, "no-map")
    assert again.header.sequence == 2  # the torn copy B was written over
    again.abandon()
    with open(ds.path, "r+b") as f:
        for page in (0, 1):
            f.seek(page * PAGE + 40)
            f.write(b"\xff")
    with pytest.raises(TornHeader):
        DataSet.open(tmp_path, "S1", "C1", map_time=None)


def test_expansion_grows_by_a_fifth_up_to_dsmax_and_then_fails_by_name(tmp_path):
    """Each expand() adds 20% in whole blocks (header, file and map together) until
    dsmax; then ExpandFailed at-dsmax, with nothing changed."""
    ds = create(tmp_path, dssize=10 * DSBLOCK)
    dsmax = 15 * DSBLOCK
    assert ds.expand(dsmax) == 12 * DSBLOCK
    assert ds.expand(dsmax) == 15 * DSBLOCK  # 20% would be 15 blocks and a bit: capped
    assert os.path.getsize(ds.path) == ds.size == ds.space.size == 15 * DSBLOCK
    assert read_header(headers(tmp_path)).size == 15 * DSBLOCK
    with pytest.raises(ExpandFailed) as error:
        ds.expand(dsmax)
    assert (error.value.reason, error.value.size, error.value.dsmax) == ("at-dsmax", ds.size,
                                                                         dsmax)
    stamp = ds.close()
    again = DataSet.open(tmp_path, "S1", "C1", map_time=stamp)
    assert again.size == again.space.size == 15 * DSBLOCK
    again.abandon()


def test_extend_makes_the_growth_durable_and_grew_makes_it_current(tmp_path, monkeypatch):
    """extend (a worker thread's part) leaves size and map as they were although the
    file and the header on disk hold the new extent; grew makes both current. A
    file abandoned during an extend is closed when the extend returns, not under it."""
    ds = create(tmp_path)
    header = ds.extend(20 * DSBLOCK, 32 * DSBLOCK)
    assert ds.size == ds.space.size == DSSIZE
    assert os.path.getsize(ds.path) == read_header(headers(tmp_path)).size == 20 * DSBLOCK
    ds.grew(header)
    assert ds.size == ds.space.size == 20 * DSBLOCK
    fd, closed = ds.fd, []
    real = os.posix_fallocate

    def abandoned_meanwhile(*args):
        ds.abandon()
        closed.append(_is_open(fd))
        real(*args)

    monkeypatch.setattr(os, "posix_fallocate", abandoned_meanwhile)
    ds.extend(24 * DSBLOCK, 32 * DSBLOCK)
    assert closed == [True] and not _is_open(fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_an_expansion_the_disk_refuses_is_named_and_changes_nothing(tmp_path, monkeypatch):
    """posix_fallocate failing with ENOSPC is ExpandFailed('ENOSPC'); size, header, map
    and file length stay, and the data set goes on being written."""
    ds = create(tmp_path)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(ExpandFailed) as error:
        ds.expand(2 * DSSIZE)
    assert error.value.reason == "ENOSPC"
    assert ds.size == ds.space.size == os.path.getsize(ds.path) == DSSIZE
    assert read_header(headers(tmp_path)).size == DSSIZE
    dm = put(ds, 1, b"still fine")
    ds.sync()
    assert ds.read(dm, 1) == b"still fine"
    ds.abandon()


def test_a_failed_sync_is_sticky_and_leaves_the_data_set_to_be_rebuilt(tmp_path, monkeypatch):
    """fdatasync failing once makes every later write, sync and close raise the same
    WriteFailed; the header on disk stays OPEN, so the next open rebuilds."""
    ds = create(tmp_path)
    stamp_before = ds.header.sequence

    def broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(WriteFailed) as error:
        ds.sync()
    assert (error.value.reason, error.value.errno) == ("sync", errno.EIO)
    monkeypatch.undo()
    for act in (ds.sync, ds.close, lambda: put(ds, 1, b"x"), lambda: ds.expand(2 * DSSIZE)):
        with pytest.raises(WriteFailed) as again:
            act()
        assert again.value is error.value
    ds.abandon()
    assert read_header(headers(tmp_path)).sequence == stamp_before
    reopened = DataSet.open(tmp_path, "S1", "C1", map_time=None)
    assert reopened.rebuild_reason == "no-map"
    reopened.abandon()


def test_the_down_level_check_reads_the_newest_first_block_raw(tmp_path):
    """read_raw gives the bytes check_newest needs: the newest message's block passes; a
    copy of the data set taken before that message was written is DownLevel."""
    ds = create(tmp_path)
    older = ds.path.read_bytes()
    dm = put(ds, 9, b"newest")
    dm.check_newest(9, ds.read_raw(*dm.read_sizes()[0]))
    ds.abandon()
    ds.path.write_bytes(older)  # restored from a backup taken before the put
    again = DataSet.open(tmp_path, "S1", "C1", map_time=None)
    with pytest.raises(DownLevel):
        dm.check_newest(9, again.read_raw(*dm.read_sizes()[0]))
    again.abandon()


def test_a_read_the_disk_refuses_is_named_and_keeps_nothing_in_the_pool(tmp_path, monkeypatch):
    """preadv failing with EIO is ReadFailed; the buffer it was reading into goes back empty."""
    pool = BufferPool(2, DSBLOCK)
    ds = create(tmp_path, pool=pool)
    dm = put(ds, 1, b"data")
    pool.invalidate("C1", dm.ranges)

    def eio(fd, buffers, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "preadv", eio)
    with pytest.raises(ReadFailed) as error:
        ds.read(dm, 1)
    assert (error.value.reason, error.value.errno) == ("read", errno.EIO)
    stats = pool.statistics()
    assert (stats.in_use, stats.cached) == (0, 0)
    monkeypatch.undo()
    assert ds.read(dm, 1) == b"data"
    ds.abandon()


def test_partial_recovery_is_marked_in_the_header_and_refused_outside_recovery(tmp_path):
    """mark_recovery sets PARTIAL_RECOVERY; an open refuses it unless recovering, and
    clearing it makes the data set open normally again."""
    ds = create(tmp_path)
    ds.mark_recovery(True)
    ds.abandon()
    with pytest.raises(IncompleteRecovery):
        DataSet.open(tmp_path, "S1", "C1", map_time=None)
    again = DataSet.open(tmp_path, "S1", "C1", map_time=None, recovering=True)
    again.grow_to(DSSIZE + 1)
    assert again.size == DSSIZE + DSBLOCK  # what it needs, in whole blocks
    again.mark_recovery(False)
    again.abandon()
    DataSet.open(tmp_path, "S1", "C1", map_time=None).abandon()


def test_a_message_read_back_soon_after_its_write_is_served_from_the_pool(tmp_path):
    """Seed 000: a buffer keeps a block after a write, so the read that follows is all
    hits and is the payload itself, not a copy (no I/O, no checks, since its bytes
    never left memory); a block corrupted on disk meanwhile is seen once the pool
    has let it go."""
    pool = BufferPool(8, DSBLOCK)
    ds = create(tmp_path, pool=pool)
    payload = os.urandom(3 * DSBLOCK)
    dm = put(ds, 1, payload)
    assert pool.statistics().cached == len(dm.ranges)
    assert ds.read(dm, 1) is payload
    assert (pool.statistics().hits, pool.statistics().misses) == (len(dm.ranges), 0)
    at = dm.ranges[1].page * PAGE + 100
    os.pwrite(ds.fd, bytes([os.pread(ds.fd, 1, at)[0] ^ 1]), at)
    assert ds.read(dm, 1) == payload
    pool.invalidate("C1", dm.ranges[1:2])
    with pytest.raises(BadPrefix) as error:
        ds.read(dm, 1)
    assert error.value.reason == "bad-crc"
    ds.abandon()


def test_a_payload_that_can_change_is_written_but_not_held(tmp_path):
    """Only a bytes payload is held by reference: a bytearray written and then changed
    reads back as it was written, from the disk."""
    pool = BufferPool(8, DSBLOCK)
    ds = create(tmp_path, pool=pool)
    payload = bytearray(b"x" * 10000)
    dm = put(ds, 1, payload)
    payload[:5] = b"yyyyy"
    assert pool.statistics().cached == 0
    assert ds.read(dm, 1) == b"x" * 10000
    ds.abandon()


def test_another_incarnations_data_set_is_read_and_never_written(tmp_path):
    """In a group a new owner opens an earlier incarnation's data set read-only: its
    messages read back, not a byte of the file changes, and a write is refused."""
    ds = DataSet.create(tmp_path, "S1", "C1", dsblock=DSBLOCK, dssize=DSSIZE, writer="NODE1-1")
    path = path_of(tmp_path, "S1", "C1", "NODE1-1")
    assert path.name == "C1.NODE1-1.smds" and ds.name == "C1.NODE1-1"
    dm = DataMap.of("C1", b"inherited" * 500, ds.space.allocate(Q, 4500), "NODE1-1")
    ds.write_message(dm, 7, b"inherited" * 500)
    ds.sync()
    ds.abandon()  # as a crashed owner leaves it: OPEN set, no saved map
    before = path.read_bytes()
    heir = DataSet.inherit(tmp_path, "S1", "C1", "NODE1-1")
    assert (heir.inherited, heir.space, heir.rebuild_reason) == (True, None, "inherited")
    assert heir.read(dm, 7) == b"inherited" * 500
    with pytest.raises(ValueError, match="never written"):
        heir.write_message(dm, 8, b"inherited" * 500)
    heir.abandon()
    assert path.read_bytes() == before


def test_blocks_that_follow_each_other_go_in_one_positioned_write_of_bounded_buffers(
        tmp_path, monkeypatch):
    """A message whose blocks follow each other on disk is written with one pwritev, a
    long one in writes of at most RUN_PARTS buffers (the kernel's IOV_MAX refuses
    more); both read back byte for byte from the disk after a close and open."""
    writes: list[int] = []
    real = os.pwritev

    def counted(fd, buffers, offset):
        writes.append(len(buffers))
        return real(fd, buffers, offset)

    ds = create(tmp_path, dssize=400 * DSBLOCK)
    monkeypatch.setattr(os, "pwritev", counted)
    short = os.urandom(4 * DSBLOCK)
    dm_short = put(ds, 1, short)
    assert len(dm_short.ranges) == 5 and writes == [10]
    long = os.urandom(300 * (DSBLOCK - 64))
    dm_long = put(ds, 2, long)
    assert writes[1:] == [RUN_PARTS, 2 * len(dm_long.ranges) - RUN_PARTS]
    monkeypatch.undo()
    stamp = ds.close()
    again = DataSet.open(tmp_path, "S1", "C1", map_time=stamp)
    assert again.read(dm_short, 1) == short and again.read(dm_long, 2) == long
    again.abandon()
