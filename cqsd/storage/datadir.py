"""The data directory, and the lock that keeps a second daemon out of it."""

import fcntl
import os
from pathlib import Path

from ..errors import DaemonError


class DataDirError(DaemonError):
    """The data directory cannot be used; the message says why and which path."""


class DataDir:
    """``data_dir`` and its layout (docs/datadir.md): ``cqsd.lock``, ``images/``
    (clean-shutdown images and crash-recovery bases), ``logstream/``, ``srds/``
    (checkpoint slots) and ``repository.db``."""

    def __init__(self, root: str, node: str | None = None) -> None:
        self.root = Path(root)
        # one daemon per data directory; in a group, one per node (docs/group.md)
        self.lock = self.root / ("cqsd.lock" if node is None else f"cqsd.{node}.lock")
        self.images = self.root / "images"
        self.logstream = self.root / "logstream"
        self.srds = self.root / "srds"
        self.repository = self.root / "repository.db"
        # the system checkpoint (cqsd/server/registrations.py): this daemon's clients
        self.registrations = self.root / ("clients.ckpt" if node is None
                                          else f"clients.{node}.ckpt")
        self._lock_fd: int | None = None

    def open(self) -> None:
        """Create the layout if missing and take the lock, or raise DataDirError."""
        try:
            self.images.mkdir(parents=True, exist_ok=True)
            self.logstream.mkdir(exist_ok=True)
            for d in (self.root, self.images, self.logstream):
                os.listdir(d)  # unreadable is refused now, not half-way through a restart
            # held read-only: a daemon holding no file of the directory open for writing
            # does not keep it from being remounted read-only (a checkpoint then fails
            # cleanly; the log, on its own mount, goes on)
            fd = os.open(self.lock, os.O_RDONLY | os.O_CREAT, 0o600)
        except OSError as err:
            raise DataDirError(f"data directory {self.root}: {err.strerror}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise DataDirError(
                f"data directory {self.root} is in use by a live daemon (pid {holder}, "
                f"{self.lock.name})"
            ) from None
        try:
            with open(self.lock, "w") as f:
                f.write(str(os.getpid()))
        except OSError as err:
            os.close(fd)
            raise DataDirError(f"data directory {self.root}: {err.strerror}") from err
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
