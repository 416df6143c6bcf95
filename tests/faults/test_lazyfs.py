"""lazyfs: what was fsynced survives a drop, what was not is gone, and the logstream copes."""

import errno
import fcntl
import os

import pytest

import logstream
from logstream.repair import cut_tail
from tests.faults.lazyfs import PAGE, LazyFS


@pytest.fixture
def lazy(tmp_path):
    with LazyFS(tmp_path / "backing", tmp_path / "mnt") as fs:
        yield fs


def write(path, data, *, fsync, mode="wb"):
    with open(path, mode) as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def test_data_written_and_fsynced_survives_a_drop(lazy):
    """fsync writes the file's pages through; a drop then has nothing of it to lose."""
    write(lazy.mountpoint / "f", b"kept" * 3000, fsync=True)
    assert lazy.drop() == (0, 0)
    assert (lazy.mountpoint / "f").read_bytes() == b"kept" * 3000


def test_data_written_but_not_fsynced_is_gone_after_a_drop(lazy):
    """An append, an overwrite and a truncation, none fsynced, are all undone by a drop."""
    write(lazy.mountpoint / "f", b"a" * 10000, fsync=True)
    write(lazy.mountpoint / "f", b"b" * 5000, fsync=False, mode="ab")
    with open(lazy.mountpoint / "f", "r+b") as f:
        f.write(b"c" * 100)
    write(lazy.mountpoint / "g", b"new", fsync=False)
    files, lost = lazy.drop()
    assert files == 2 and lost >= 3 * PAGE
    assert (lazy.mountpoint / "f").read_bytes() == b"a" * 10000
    # the namespace is applied at once (the module docstring): the file stays, empty
    assert (lazy.mountpoint / "g").read_bytes() == b""


def test_a_truncation_not_fsynced_is_undone_and_one_fsynced_is_kept(lazy):
    """ftruncate is cached like a write: lost on a drop unless fsynced."""
    path = lazy.mountpoint / "f"
    write(path, bytes(range(256)) * 40, fsync=True)
    os.truncate(path, 10)
    assert path.stat().st_size == 10
    lazy.drop()
    assert path.read_bytes() == bytes(range(256)) * 40
    with open(path, "r+b") as f:
        f.truncate(10)
        f.seek(20)
        f.write(b"x")
        f.flush()
        os.fdatasync(f.fileno())
    lazy.drop()
    assert path.read_bytes() == bytes(range(10)) + bytes(10) + b"x"  # zeros in the hole


def test_reads_see_unsynced_writes_before_the_drop(lazy):
    """Until the cut, every reader sees the writes, and the size, the kernel would show."""
    path = lazy.mountpoint / "f"
    write(path, b"x" * 100, fsync=True)
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), b"y" * 8000, 50)
    assert path.read_bytes() == b"x" * 50 + b"y" * 8000 and path.stat().st_size == 8050
    assert (lazy.backing / "f").read_bytes() == b"x" * 100  # the disk has not seen them
    lazy.drop()
    assert path.stat().st_size == 100 and path.read_bytes() == b"x" * 100


def test_a_reader_that_kept_the_file_open_sees_the_disk_after_the_drop(lazy):
    """An overwrite changes neither size nor mtime, so only the drop's invalidation
    keeps the kernel from serving the lost bytes from its page cache."""
    path = lazy.mountpoint / "f"
    write(path, b"x" * 8192, fsync=True)
    reader = os.open(path, os.O_RDONLY)
    try:
        with open(path, "r+b") as f:
            os.pwrite(f.fileno(), b"y" * 100, 50)
        assert os.pread(reader, 200, 0) == b"x" * 50 + b"y" * 100 + b"x" * 50
        lazy.drop()
        assert os.pread(reader, 200, 0) == b"x" * 200
    finally:
        os.close(reader)


def test_flock_excludes_between_open_files_of_the_mount(lazy):
    """The kernel keeps flock locks for the mount: a second open file is refused."""
    one = os.open(lazy.mountpoint / "lock", os.O_RDWR | os.O_CREAT)
    two = os.open(lazy.mountpoint / "lock", os.O_RDWR)
    try:
        fcntl.flock(one, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(two, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(one)
        os.close(two)


def test_rename_unlink_mkdir_and_listdir_pass_through(lazy):
    """The daemon's directory operations work in the mount and land in the backing directory."""
    (lazy.mountpoint / "d").mkdir()
    write(lazy.mountpoint / "d" / "t.tmp", b"1", fsync=True)
    os.rename(lazy.mountpoint / "d" / "t.tmp", lazy.mountpoint / "d" / "t")
    write(lazy.mountpoint / "d" / "u", b"2", fsync=False)
    os.unlink(lazy.mountpoint / "d" / "u")
    assert os.listdir(lazy.mountpoint / "d") == ["t"] == os.listdir(lazy.backing / "d")
    assert lazy.drop() == (0, 0)  # the unlinked file's unsynced pages went with it


def append_records(directory, n_synced, n_unsynced):
    writer = logstream.Writer.open(directory, "node1", segment_size=256 * 1024)
    for i in range(n_synced):
        writer.append({"i": i, "pad": "p" * 5000})
    writer.flush()
    for i in range(n_synced, n_synced + n_unsynced):
        writer.append({"i": i, "pad": "p" * 5000})
    return writer


def test_logstream_reads_exactly_the_fsynced_records_after_a_drop(lazy):
    """3 records flushed, 2 not, then the cut: readers and the reopened writer see 3."""
    directory = lazy.mountpoint / "logstream"
    writer = append_records(directory, 3, 2)
    assert [r.body["i"] for r in logstream.read(directory)] == [0, 1, 2, 3, 4]
    lazy.drop()
    writer._close_files()  # the process died with the power: nothing more of it runs (no seal)
    assert [r.body["i"] for r in logstream.read(directory)] == [0, 1, 2]
    with logstream.Writer.open(directory, "node1", segment_size=256 * 1024) as again:
        assert again.repair is None  # a zero tail is a clean end
        assert again.append({"i": 3}) == 4


def test_logstream_repairs_a_tail_torn_by_the_cut(lazy):
    """The first unsynced page reaches the disk, the rest not: a torn record, not corruption;
    the writer reopened after the repair goes on from the last whole record."""
    directory = lazy.mountpoint / "logstream"
    writer = append_records(directory, 3, 2)
    files, _ = lazy.drop(keep=1)
    writer._close_files()
    assert files == 1
    assert [r.body["i"] for r in logstream.read(directory)] == [0, 1, 2]
    with pytest.raises(logstream.TornTail) as torn:
        logstream.Writer.open(directory, "node1", segment_size=256 * 1024, repair=False)
    repair = cut_tail(torn.value)
    assert repair.copy.exists() and repair.copy.stat().st_size > 0
    assert [r.body["i"] for r in logstream.read(directory)] == [0, 1, 2]
    with logstream.Writer.open(directory, "node1", segment_size=256 * 1024) as again:
        assert again.repair is None and again.append({"i": 3}) == 4


def test_a_full_disk_refuses_new_space_and_keeps_what_the_file_has(lazy):
    """Full: a new file, a growing write or truncation get ENOSPC; a write inside the
    file's size (a preallocated segment) goes on and is fsynced; space back, all works."""
    path = lazy.mountpoint / "f"
    write(path, bytes(8192), fsync=True)
    lazy.full(True)
    with pytest.raises(OSError) as err:
        write(lazy.mountpoint / "g", b"x", fsync=False)
    assert err.value.errno == errno.ENOSPC
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), b"inside", 100)
        with pytest.raises(OSError) as grow:
            os.pwrite(f.fileno(), b"past", 8192)
        assert grow.value.errno == errno.ENOSPC
        with pytest.raises(OSError) as longer:
            os.ftruncate(f.fileno(), 10000)
        assert longer.value.errno == errno.ENOSPC
        os.fsync(f.fileno())
    lazy.drop()
    assert path.read_bytes()[100:106] == b"inside" and path.stat().st_size == 8192
    lazy.full(False)
    write(lazy.mountpoint / "g", b"x", fsync=True)
    assert (lazy.mountpoint / "g").read_bytes() == b"x"


def test_two_mounts_of_one_backing_directory_are_two_nodes(tmp_path):
    """Each mount keeps its own unsynced writes: the other sees a file's fsynced state,
    and a drop of one mount loses its writes only; a full mount does not fill the other."""
    with LazyFS(tmp_path / "backing", tmp_path / "one") as one, \
            LazyFS(tmp_path / "backing", tmp_path / "two") as two:
        write(one.mountpoint / "f", b"synced", fsync=True)
        write(one.mountpoint / "f", b"+not", fsync=False, mode="ab")
        assert (one.mountpoint / "f").read_bytes() == b"synced+not"
        assert (two.mountpoint / "f").read_bytes() == b"synced"
        write(two.mountpoint / "g", b"two's", fsync=False)
        one.full(True)
        write(two.mountpoint / "h", b"room", fsync=True)
        one.drop()
        assert (two.mountpoint / "g").read_bytes() == b"two's"
        assert (one.mountpoint / "f").read_bytes() == b"synced"
