"""A FUSE file system that loses what was not fsynced, on command: LazyFS for cqsd's tests.

Why it exists. "Nothing acknowledged is lost" (docs/datadir.md) rests on the
daemon fsyncing before it acknowledges. Killing the daemon does not test that:
the kernel keeps the dead process's writes and flushes them anyway. A power
cut does not keep them, and this file system plays one, as LazyFS does for
Jepsen: run it over a backing directory, let the daemon work in the mount,
then `drop` everything written since each file's last fsync.

What it models, and what not:
- File data and size: a file's writes, truncations and extensions stay in this
  process (a cache of 4 KiB pages and the file's size) until an fsync or
  fdatasync of that file writes them to the backing file and fsyncs it. Reads
  see the cached state. `drop` forgets every cache: each file then reads as it
  was at its last fsync (the kernel's caches of the mount are invalidated too).
  Closing a file does not sync it; neither does sync(2) (FUSE gets no request).
  Times are the backing file's: a cached write changes no mtime until its fsync.
  `drop` with `keep` lets each file's first unsynced pages reach the disk first:
  a cut in the middle of writeback, which tears a record that spans pages.
- The namespace: create, mkdir, mknod, rename, unlink and rmdir go to the
  backing directory at once and survive a drop, as if every directory were
  fsynced at once; so a missing directory fsync is not caught here.
- Locks: not implemented here, so the kernel keeps flock and fcntl locks for
  the mount; they exclude between processes on this host.
- A full disk, on command (`full`): what would need new space on the backing
  file system fails with ENOSPC (creating a file or directory, a write or a
  truncation past a file's backing size); a write inside space the file already
  has (a preallocated log segment) goes on, as on a real full disk. Two mounts
  of one backing directory are two nodes sharing a data directory, one of them
  full.
- Unix sockets, on command (`sockets off`): a socket's mknod fails with ENOSYS,
  as on a FUSE file system without a mknod handler.
- A stalled write, on command (`stall`): a write to a file whose name ends with
  the given suffix waits, without an answer, until `stall off`; the writer
  hangs inside its pwrite as a process paused in the middle of it does, and
  its write lands when it is let go (a deposed owner's late write).
- fallocate: pyfuse3 has no handler, so fallocate(2) fails with EOPNOTSUPP and
  glibc's posix_fallocate falls back to writing a byte per block (through the
  cache). Hard links, symlinks and xattrs are not supported.

Run: ``python -m tests.faults.lazyfs BACKING MOUNTPOINT`` mounts, prints
``ready`` and serves until stdin closes, ``stop`` or SIGTERM; a ``drop [KEEP]``
line on stdin is answered ``dropped FILES BYTES`` (KEEP: see `LazyFS.drop`),
``full on`` / ``full off``, ``sockets on`` / ``sockets off`` and ``stall SUFFIX`` /
``stall off`` with the same line.
Tests use the `LazyFS` class below.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

PAGE = 4096
REPO = Path(__file__).resolve().parents[2]


class Unsynced:
    """One file's state since its last fsync: its size and the pages written since.

    Backing bytes at or past `floor` (the lowest size a truncation gave the file
    meanwhile) read as zeros, as they would after that truncation.
    """

    def __init__(self, size: int) -> None:
        self.size = self.floor = size
        self.pages: dict[int, bytearray] = {}

    def read(self, fd: int, off: int, size: int) -> bytes:
        end = min(off + size, self.size)
        if end <= off:
            return b""
        buf = bytearray(end - off)
        if (below := min(end, self.floor)) > off:
            got = os.pread(fd, below - off, off)
            buf[: len(got)] = got
        for n in range(off // PAGE, (end - 1) // PAGE + 1):
            if (page := self.pages.get(n)) is not None:
                lo, hi = max(off, n * PAGE), min(end, (n + 1) * PAGE)
                buf[lo - off : hi - off] = page[lo - n * PAGE : hi - n * PAGE]
        return bytes(buf)

    def write(self, fd: int, off: int, data: bytes) -> None:
        end = off + len(data)
        for n in range(off // PAGE, (end - 1) // PAGE + 1):
            page = self.pages.get(n)
            if page is None:  # as the file reads now, zeros past its end
                page = self.pages[n] = bytearray(self.read(fd, n * PAGE, PAGE).ljust(PAGE, b"\0"))
            lo, hi = max(off, n * PAGE), min(end, (n + 1) * PAGE)
            page[lo - n * PAGE : hi - n * PAGE] = data[lo - off : hi - off]
        self.size = max(self.size, end)

    def truncate(self, size: int) -> None:
        self.size, self.floor = size, min(self.floor, size)
        for n in [n for n in self.pages if n * PAGE >= size]:
            del self.pages[n]
        if (page := self.pages.get(size // PAGE)) is not None:
            page[size % PAGE :] = bytes(PAGE - size % PAGE)

    def sync(self, fd: int, datasync: bool) -> None:
        """Write this state to the backing file `fd` and fsync it."""
        if self.floor < os.fstat(fd).st_size:
            os.ftruncate(fd, self.floor)
        self._write(fd, len(self.pages))
        if os.fstat(fd).st_size != self.size:
            os.ftruncate(fd, self.size)
        (os.fdatasync if datasync else os.fsync)(fd)

    def _write(self, fd: int, pages: int) -> None:
        """Write the first `pages` pages, in file order, to the backing file `fd`."""
        for n, page in sorted(self.pages.items())[:pages]:
            if n * PAGE < self.size:
                os.pwrite(fd, page[: min(PAGE, self.size - n * PAGE)], n * PAGE)

    def tear(self, fd: int, keep: int) -> None:
        """The first `keep` pages reached the disk before the cut: a torn write."""
        self._write(fd, keep)


def _operations():
    """The pyfuse3.Operations subclass, built here so tests import this module without pyfuse3."""
    import pyfuse3
    from pyfuse3 import FUSEError

    def failing(err: OSError) -> FUSEError:
        return FUSEError(err.errno or errno.EIO)

    class LazyOperations(pyfuse3.Operations):
        """Inodes are the backing inodes, each held by an fd (O_PATH for non-directories)."""

        supports_dot_lookup = False

        def __init__(self, backing: str) -> None:
            super().__init__()
            root = os.open(backing, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self.root_ino = os.fstat(root).st_ino
            self.nodes: dict[int, list[int]] = {pyfuse3.ROOT_INODE: [root, 1]}  # ino: fd, lookups
            self.opened: dict[int, list[int]] = {}  # ino: [read-write fd, opens]
            self.unsynced: dict[int, Unsynced] = {}
            self.full = False  # a full disk: nothing that needs new space is written
            self.sockets = True  # off: no Unix sockets, as a FUSE file system without mknod
            self.stall: str | None = None  # writes to files of this suffix wait (``stall``)
            self.stalled: list[str] = []  # the files whose writes are waiting now
            self.unstalled = None  # a trio.Event set when the stall ends

        # -- inodes ------------------------------------------------------------------

        def _ino(self, st: os.stat_result) -> int:
            return pyfuse3.ROOT_INODE if st.st_ino == self.root_ino else st.st_ino

        def _fd(self, ino: int) -> int:
            try:
                return self.nodes[ino][0]
            except KeyError:
                raise FUSEError(errno.ENOENT) from None

        def _entry(self, st: os.stat_result) -> pyfuse3.EntryAttributes:
            entry = pyfuse3.EntryAttributes()
            for name in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size",
                         "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
                setattr(entry, name, getattr(st, name))
            entry.st_ino = self._ino(st)
            if (state := self.unsynced.get(entry.st_ino)) is not None:
                entry.st_size = state.size
            entry.st_blksize = PAGE
            entry.st_blocks = (entry.st_size + 511) // 512
            entry.entry_timeout = entry.attr_timeout = 0  # sizes change under the kernel
            return entry

        def _remember(self, parent: int, name: str) -> pyfuse3.EntryAttributes:
            """The entry for `name` in `parent`, counted as one more kernel lookup."""
            try:
                st = os.stat(name, dir_fd=self._fd(parent), follow_symlinks=False)
                ino = self._ino(st)
                if ino in self.nodes:
                    self.nodes[ino][1] += 1
                else:
                    flags = os.O_RDONLY | os.O_DIRECTORY if stat.S_ISDIR(st.st_mode) else os.O_PATH
                    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 dir_fd=self._fd(parent))
                    self.nodes[ino] = [fd, 1]
            except OSError as err:
                raise failing(err) from None
            return self._entry(st)

        async def lookup(self, parent_inode, name, ctx):
            return self._remember(parent_inode, os.fsdecode(name))

        async def forget(self, inode_list):
            for ino, count in inode_list:
                node = self.nodes.get(ino)
                if node is None or ino == pyfuse3.ROOT_INODE:
                    continue
                node[1] -= count
                if node[1] <= 0 and ino not in self.unsynced:  # else kept for a drop's tear
                    os.close(self.nodes.pop(ino)[0])

        async def getattr(self, inode, ctx=None):
            try:
                return self._entry(os.stat(self._fd(inode)))
            except OSError as err:
                raise failing(err) from None

        def _proc(self, ino: int) -> str:
            return f"/proc/self/fd/{self._fd(ino)}"

        def _space(self, ino: int, end: int) -> None:
            """ENOSPC if the disk is full and ``end`` is past the file's backing size."""
            if self.full and end > os.stat(self._fd(ino)).st_size:
                raise FUSEError(errno.ENOSPC)

        async def setattr(self, inode, attr, fields, fh, ctx):
            try:
                if fields.update_size:
                    self._space(inode, attr.st_size)
                    self._state(inode).truncate(attr.st_size)
                if fields.update_mode:
                    os.chmod(self._proc(inode), attr.st_mode & 0o7777)
                if fields.update_uid or fields.update_gid:
                    os.chown(self._proc(inode), attr.st_uid if fields.update_uid else -1,
                             attr.st_gid if fields.update_gid else -1)
                if fields.update_atime and fields.update_mtime:
                    os.utime(self._proc(inode), ns=(attr.st_atime_ns, attr.st_mtime_ns))
            except OSError as err:
                raise failing(err) from None
            return await self.getattr(inode, ctx)

        # -- the namespace: applied to the backing directory at once -------------------

        async def mknod(self, parent_inode, name, mode, rdev, ctx):
            if self.full:
                raise FUSEError(errno.ENOSPC)
            if not self.sockets and stat.S_ISSOCK(mode):
                raise FUSEError(errno.ENOSYS)
            try:
                os.mknod(os.fsdecode(name), mode & ~ctx.umask, rdev,
                         dir_fd=self._fd(parent_inode))
            except OSError as err:
                raise failing(err) from None
            return self._remember(parent_inode, os.fsdecode(name))

        async def mkdir(self, parent_inode, name, mode, ctx):
            if self.full:
                raise FUSEError(errno.ENOSPC)
            try:
                os.mkdir(os.fsdecode(name), mode & ~ctx.umask, dir_fd=self._fd(parent_inode))
            except OSError as err:
                raise failing(err) from None
            return self._remember(parent_inode, os.fsdecode(name))

        def _gone(self, dirfd: int, name: str) -> None:
            """`name` is about to lose its last link: forget its cache unless it is open."""
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                if st.st_nlink <= 1 and self._ino(st) not in self.opened:
                    self.unsynced.pop(self._ino(st), None)

        async def unlink(self, parent_inode, name, ctx):
            dirfd, name = self._fd(parent_inode), os.fsdecode(name)
            self._gone(dirfd, name)
            try:
                os.unlink(name, dir_fd=dirfd)
            except OSError as err:
                raise failing(err) from None

        async def rmdir(self, parent_inode, name, ctx):
            try:
                os.rmdir(os.fsdecode(name), dir_fd=self._fd(parent_inode))
            except OSError as err:
                raise failing(err) from None

        async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags,
                         ctx):
            old, new = self._fd(parent_inode_old), self._fd(parent_inode_new)
            name_old, name_new = os.fsdecode(name_old), os.fsdecode(name_new)
            if flags & pyfuse3.RENAME_EXCHANGE:
                raise FUSEError(errno.EINVAL)
            with contextlib.suppress(FileNotFoundError):
                os.stat(name_new, dir_fd=new, follow_symlinks=False)
                if flags & pyfuse3.RENAME_NOREPLACE:
                    raise FUSEError(errno.EEXIST)
                self._gone(new, name_new)
            try:
                os.rename(name_old, name_new, src_dir_fd=old, dst_dir_fd=new)
            except OSError as err:
                raise failing(err) from None

        # -- file data: cached until fsync -----------------------------------------------

        def _state(self, ino: int) -> Unsynced:
            if ino not in self.unsynced:
                self.unsynced[ino] = Unsynced(os.stat(self._fd(ino)).st_size)
            return self.unsynced[ino]

        def _open(self, ino: int, flags: int) -> pyfuse3.FileInfo:
            if ino in self.opened:
                self.opened[ino][1] += 1
            else:  # read-write whatever the caller asked: an fsync must be able to write
                fd = os.open(self._proc(ino), os.O_RDWR | os.O_CLOEXEC)
                self.opened[ino] = [fd, 1]
            if flags & os.O_TRUNC:
                self._state(ino).truncate(0)
            # no kernel page cache kept across opens: another mount of the same backing
            # directory (another node) may have changed the file meanwhile
            return pyfuse3.FileInfo(fh=ino, keep_cache=False)

        async def open(self, inode, flags, ctx):
            try:
                return self._open(inode, flags)
            except OSError as err:
                raise failing(err) from None

        async def create(self, parent_inode, name, mode, flags, ctx):
            name = os.fsdecode(name)
            if self.full:
                raise FUSEError(errno.ENOSPC)
            try:
                excl = flags & os.O_EXCL
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | excl | os.O_CLOEXEC,
                                 mode & ~ctx.umask, dir_fd=self._fd(parent_inode)))
                entry = self._remember(parent_inode, name)
                return self._open(entry.st_ino, flags), self._entry(os.stat(self._fd(entry.st_ino)))
            except OSError as err:
                raise failing(err) from None

        async def read(self, fh, off, size):
            fd = self.opened[fh][0]
            if (state := self.unsynced.get(fh)) is None:
                return os.pread(fd, size, off)
            return state.read(fd, off, size)

        async def write(self, fh, off, buf):
            if self.stall is not None and os.readlink(self._proc(fh)).endswith(self.stall):
                name = os.path.basename(os.readlink(self._proc(fh)))
                self.stalled.append(name)
                await self.unstalled.wait()
                self.stalled.remove(name)
            self._space(fh, off + len(buf))
            self._state(fh).write(self.opened[fh][0], off, buf)
            return len(buf)

        async def fsync(self, fh, datasync):
            try:
                fd = self.opened[fh][0]
                if (state := self.unsynced.get(fh)) is not None:
                    state.sync(fd, datasync)
                    del self.unsynced[fh]
                else:
                    (os.fdatasync if datasync else os.fsync)(fd)
            except OSError as err:
                raise failing(err) from None

        async def release(self, fh):
            handle = self.opened[fh]
            handle[1] -= 1
            if handle[1] == 0:
                del self.opened[fh]
                if os.fstat(handle[0]).st_nlink == 0:
                    self.unsynced.pop(fh, None)  # deleted while open: now gone
                os.close(handle[0])

        # -- directories ---------------------------------------------------------------

        async def opendir(self, inode, ctx):
            return inode

        async def readdir(self, fh, start_id, token):
            dirfd = self._fd(fh)
            names = sorted(os.listdir(dirfd))  # the position is an index: good enough here
            for index in range(start_id, len(names)):
                try:
                    st = os.stat(names[index], dir_fd=dirfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not pyfuse3.readdir_reply(token, os.fsencode(names[index]), self._entry(st),
                                             index + 1):
                    break
                self._remember(fh, names[index])

        async def fsyncdir(self, fh, datasync):
            os.fsync(self._fd(fh))

        async def statfs(self, ctx):
            st, out = os.statvfs(self._fd(pyfuse3.ROOT_INODE)), pyfuse3.StatvfsData()
            for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                         "f_ffree", "f_favail", "f_namemax"):
                setattr(out, name, getattr(st, name))
            return out

        # -- the fault ---------------------------------------------------------------------

        def drop(self, keep: int = 0) -> tuple[list[int], int]:
            """Forget every file's unsynced state but its first `keep` pages, which reach
            the backing file: (inodes that had some, bytes of pages lost)."""
            inodes, lost = list(self.unsynced), 0
            for ino, state in self.unsynced.items():
                if keep:
                    fd = os.open(self._proc(ino), os.O_WRONLY | os.O_CLOEXEC)
                    try:
                        state.tear(fd, keep)
                    finally:
                        os.close(fd)
                lost += max(0, len(state.pages) - keep) * PAGE
            self.unsynced.clear()
            for ino in [ino for ino, node in self.nodes.items() if node[1] <= 0]:
                os.close(self.nodes.pop(ino)[0])  # forgotten by the kernel, kept for the tear
            return inodes, lost

    return LazyOperations


async def _serve(ops) -> None:
    """The FUSE loop beside the command loop on stdin; ends on EOF, `stop` or SIGTERM."""
    import pyfuse3
    import trio

    async def commands() -> None:
        stdin = trio.lowlevel.FdStream(os.dup(0))
        pending = b""
        while (chunk := await stdin.receive_some()) != b"":
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip() == b"stop":
                    return
                if line.split()[:1] == [b"stall"]:
                    suffix = line.split()[1].decode()
                    if suffix == "off":
                        ops.stall = None
                        if ops.unstalled is not None:
                            ops.unstalled.set()
                    else:
                        ops.stall, ops.unstalled = suffix, trio.Event()
                    print(f"stall {suffix}", flush=True)
                if line.split()[:1] == [b"stalled"]:
                    print("stalled " + " ".join(ops.stalled), flush=True)
                if line.split()[:1] == [b"full"]:
                    ops.full = line.split()[1:] == [b"on"]
                    print("full " + ("on" if ops.full else "off"), flush=True)
                if line.split()[:1] == [b"sockets"]:
                    ops.sockets = line.split()[1:] == [b"on"]
                    print("sockets " + ("on" if ops.sockets else "off"), flush=True)
                if line.split()[:1] == [b"drop"]:
                    inodes, lost = ops.drop(int(line.split()[1]) if len(line.split()) > 1 else 0)
                    for ino in inodes:  # the kernel must forget its pages of them too
                        with contextlib.suppress(OSError):
                            await trio.to_thread.run_sync(pyfuse3.invalidate_inode, ino)
                    print(f"dropped {len(inodes)} {lost}", flush=True)

    async def signals() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for _ in received:
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pyfuse3.main)

        async def first_to_end(fn) -> None:
            await fn()
            pyfuse3.terminate()
            nursery.cancel_scope.cancel()

        nursery.start_soon(first_to_end, commands)
        nursery.start_soon(first_to_end, signals)
        print("ready", flush=True)


def main(argv: list[str]) -> int:
    import pyfuse3
    import trio

    backing, mountpoint = argv
    ops = _operations()(backing)
    pyfuse3.init(ops, mountpoint, {"fsname=lazyfs", "subtype=lazyfs"})
    try:
        trio.run(_serve, ops)
    finally:
        pyfuse3.close(unmount=True)
    return 0


class LazyFS:
    """A lazyfs process for a test: `start`, `drop` (the power cut), `stop`; a context manager."""

    def __init__(self, backing: str | os.PathLike[str], mountpoint: str | os.PathLike[str]):
        self.backing, self.mountpoint = Path(backing), Path(mountpoint)
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 20.0) -> LazyFS:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.lazyfs", str(self.backing), str(self.mountpoint)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
        if self._reply(timeout) != "ready" or not os.path.ismount(self.mountpoint):
            self.stop()
            raise RuntimeError(f"lazyfs did not mount {self.mountpoint}")
        return self

    def _reply(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().strip() if ready else ""

    def drop(self, keep: int = 0, timeout: float = 20.0) -> tuple[int, int]:
        """Lose every write not fsynced, as a power cut: (files that had some, bytes lost).

        With `keep`, each file's first `keep` unsynced pages (in file order) reach the
        disk first: a cut in the middle of writeback, which tears a record across pages.
        """
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(f"drop {keep}\n")
        self.proc.stdin.flush()
        reply = self._reply(timeout).split()
        if len(reply) != 3 or reply[0] != "dropped":
            raise RuntimeError(f"lazyfs answered {reply!r} to drop")
        return int(reply[1]), int(reply[2])

    def full(self, on: bool, timeout: float = 20.0) -> None:
        """Make the disk full (``on``: ENOSPC for whatever needs new space) or not."""
        self._switch("full", on, timeout)

    def sockets(self, on: bool, timeout: float = 20.0) -> None:
        """Allow Unix sockets (``on``), or refuse them with ENOSYS, as a FUSE file
        system without a mknod handler does."""
        self._switch("sockets", on, timeout)

    def _switch(self, command: str, on: bool, timeout: float) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        line = f"{command} {'on' if on else 'off'}"
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if self._reply(timeout) != line:
            raise RuntimeError(f"lazyfs did not answer {line!r}")

    def stall(self, suffix: str | None, timeout: float = 20.0) -> None:
        """Hold every write to a file whose name ends with ``suffix`` (its writer hangs
        in the write), or with None let the held writes land and stop holding."""
        assert self.proc is not None and self.proc.stdin is not None
        word = suffix or "off"
        self.proc.stdin.write(f"stall {word}\n")
        self.proc.stdin.flush()
        if self._reply(timeout) != f"stall {word}":
            raise RuntimeError("lazyfs did not answer the stall command")

    def stalled(self, timeout: float = 20.0) -> list[str]:
        """The names of the files whose writes are held now."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("stalled\n")
        self.proc.stdin.flush()
        return self._reply(timeout).split()[1:]

    def stop(self, timeout: float = 20.0) -> None:
        """Unmount and end the process (killed, and the mount detached, if it hangs)."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # EOF: the server unmounts and exits
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        deadline = time.monotonic() + timeout
        while os.path.ismount(self.mountpoint) and time.monotonic() < deadline:
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def __enter__(self) -> LazyFS:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
