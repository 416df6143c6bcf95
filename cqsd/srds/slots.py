"""SRDS slots: reading, checking, installing and purging a structure's checkpoints.

Design note. A structure has two slot directories, ``SRDS1`` and ``SRDS2``, as
IMS CQS has two structure recovery data sets. A checkpoint writes into a
staging directory and then replaces the slot it did *not* start from, so the
slot it started from stays whole and current until the manifest swap
(``manifest.store``) commits the new one. A job killed at any point therefore
leaves the previous checkpoint current and readable; what it leaves behind (a
staging directory, a replaced slot the manifest does not describe) is ignored,
and removed by the next job that holds the structure's lock.

A slot is valid only if every file its manifest entry lists is there with the
size and CRC32C recorded. A damaged newest slot is skipped with a warning
naming the file, and the older one is used, with its longer log tail.

This module never imports pyspark: the daemon uses it to read a checkpoint for
a short tail and to purge one, and must never start a JVM. Nor does it import
pyarrow, which ``slotfiles`` (the files' schema and rows) needs: the daemon asks
for the manifest at every start, and reads or writes a slot's files only to
restart from one or to purge. pyarrow's import was ~0.27 CPU-s of a daemon's
~0.57 s start.
"""

import contextlib
import fcntl
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog
from crc32c import crc32c

from logstream.durable import fsync_dir, make_dirs

from ..errors import DaemonError
from . import manifest

log = structlog.get_logger()

SLOT_NAMES = ("SRDS1", "SRDS2")
# The rule of cqsd/config.py: an MVS coupling-facility structure name. It is
# also a directory name here, so nothing else may get through.
STRUCTURE_NAME = re.compile(r"[A-Z0-9@#$_]{1,16}")
STAGING_PREFIX = ".staging-"  # a job's output before it becomes a slot or an image
RETIRED_PREFIX = ".old-"  # a slot being replaced, until the manifest no longer names it
LOCK_NAME = ".lock"
CHUNK = 1 << 20  # bytes per read while checksumming a slot file


class SlotError(DaemonError):
    """A slot or its manifest cannot be used; the message names the file and why."""


class SlotsBusy(SlotError):
    """Another job holds the structure's SRDS lock."""


@dataclass(frozen=True)
class Slot:
    """One valid checkpoint as its manifest entry describes it."""

    structure: str
    name: str  # SRDS1 or SRDS2
    directory: Path  # the structure's directory, which holds both slots
    lsn: dict[str, int]  # per writer, the last log record the checkpoint includes
    time: float  # when its cut was taken, epoch seconds
    rows: int
    last_id: int  # the highest entry id ever put up to the cut
    files: dict[str, tuple[int, int]]  # path relative to ``directory``: (size, crc32c)

    @property
    def paths(self) -> list[Path]:
        return [self.directory / name for name in sorted(self.files)]


def check_structure_name(name: str) -> str:
    """Return ``name`` if it is a structure name; raise ValueError naming it if not."""
    if not isinstance(name, str) or not STRUCTURE_NAME.fullmatch(name):
        raise ValueError(
            f"structure name {name!r} is not 1-16 characters of A-Z, 0-9, @, #, $ and _"
        )
    return name


def structure_dir(srds_dir: Path, structure: str) -> Path:
    return Path(srds_dir) / check_structure_name(structure)


def other(name: str | None) -> str:
    """The slot a checkpoint starting from slot ``name`` (or from nothing) writes."""
    return SLOT_NAMES[1] if name == SLOT_NAMES[0] else SLOT_NAMES[0]


# -- reading --------------------------------------------------------------------


def listed(srds_dir: Path, structure: str) -> list[tuple[str, Slot | None, str | None]]:
    """Every slot the manifest lists, current first: (name, slot, problem).

    ``problem`` is None for a valid slot, else why it cannot be used (and
    ``slot`` is None if its entry itself is damaged). Raises ManifestError.
    """
    return list(_listed(srds_dir, structure))


def valid_slots(srds_dir: Path, structure: str) -> list[Slot]:
    """The usable checkpoints of ``structure``, newest first (empty if none).

    A damaged slot is left out with a ``srds_slot_skipped`` warning naming what
    is wrong. Raises ManifestError if the manifest itself cannot be read.
    """
    return list(_valid(srds_dir, structure))


def newest_valid(srds_dir: Path, structure: str) -> Slot | None:
    """``valid_slots(...)[0]`` without checking the files of the slots after it: a
    recovery uses only the newest."""
    return next(_valid(srds_dir, structure), None)


def _listed(srds_dir: Path, structure: str) -> Iterator[tuple[str, Slot | None, str | None]]:
    directory = structure_dir(srds_dir, structure)
    m = manifest.load(directory, structure)
    for name in sorted(m["slots"], key=lambda n: (n != m["current"], n)):
        yield (name, *_check(directory, structure, name, m["slots"][name]))


def _valid(srds_dir: Path, structure: str) -> Iterator[Slot]:
    for name, slot, problem in _listed(srds_dir, structure):
        if problem is not None:
            log.warning("srds_slot_skipped", structure=structure, slot=name, problem=problem)
            continue
        assert slot is not None, "_check makes the slot of an entry it finds no problem with"
        yield slot


def purges(srds_dir: Path, structure: str) -> int:
    """How many times ``structure``'s checkpoints were purged (RECOVER --purge, a
    structure delete): each leaves a checkpoint that is not the fold of the log up to
    its position, so a warm standby that folded that log must load again (docs/group.md,
    "Planned moves"). Reads the manifest alone. Raises ManifestError."""
    return _purges_in(manifest.load(structure_dir(srds_dir, structure), structure))


def _purges_in(m: dict) -> int:
    count = m.get("purges", 0)
    return count if type(count) is int else 0


def recorded_positions(srds_dir: Path, structure: str) -> list[dict[str, int]]:
    """The log positions of the slots the manifest lists with a sound entry, without
    reading their files: enough to decide what log is still needed (a damaged slot
    only makes recovery fall back to the other, older one). Raises ManifestError."""
    return [dict(entry["lsn"]) for entry in _sound_entries(srds_dir, structure)]


def newest_recorded(srds_dir: Path, structure: str) -> tuple[dict[str, int], float] | None:
    """The log position and time of the newest checkpoint the manifest lists with a
    sound entry (None if there is none), without reading its files: what the
    daemon's checkpoint triggers count from at start. Raises ManifestError."""
    entry = next(iter(_sound_entries(srds_dir, structure)), None)
    return None if entry is None else (dict(entry["lsn"]), float(entry["time"]))


def _sound_entries(srds_dir: Path, structure: str) -> list[dict]:
    """The manifest's slot entries that pass their checksum, current first."""
    m = manifest.load(structure_dir(srds_dir, structure), structure)
    names = sorted(m["slots"], key=lambda n: n != m["current"])
    return [entry for entry in (m["slots"][n] for n in names)
            if isinstance(entry, dict) and entry.get("checksum") == manifest.checksum(entry)]


def _check(directory: Path, structure: str, name: str, entry) -> tuple[Slot | None, str | None]:
    """The slot of a manifest entry and, if it cannot be used, why not."""
    where = directory / manifest.NAME
    if name not in SLOT_NAMES or not isinstance(entry, dict):
        return None, f"{where}: entry {name!r} is not a slot"
    if entry.get("checksum") != manifest.checksum(entry):
        return None, f"{where}: the entry of {name} fails its checksum"
    try:
        slot = Slot(structure, name, directory, dict(entry["lsn"]), float(entry["time"]),
                    int(entry["rows"]), int(entry["last_id"]),
                    {f: (int(size), int(crc)) for f, (size, crc) in entry["files"].items()})
    except (KeyError, TypeError, ValueError, AttributeError):
        return None, f"{where}: the entry of {name} is malformed"
    for relative, (size, crc) in sorted(slot.files.items()):
        problem = _file_problem(directory, name, relative, size, crc)
        if problem is not None:
            return slot, problem
    return slot, None


def _file_problem(directory: Path, name: str, relative: str, size: int, crc: int) -> str | None:
    path = directory / relative
    if Path(relative).parts[:1] != (name,) or ".." in Path(relative).parts:
        return f"{path}: listed for slot {name} but outside its directory"
    try:
        actual = path.stat().st_size
        if actual != size:
            return f"{path}: {actual} bytes, the manifest says {size}"
        if _crc_of(path) != crc:
            return f"{path}: fails its CRC32C check"
    except FileNotFoundError:
        return f"{path}: missing"
    except OSError as err:
        return f"{path}: cannot be read ({err.strerror})"
    return None


def _crc_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            crc = crc32c(block, crc)
    return crc


def read_rows(slot: Slot, *, offloaded_data: bool = True) -> dict[int, list]:
    """The slot's messages as image rows (docs/recovery.md), in entry-id order
    (``offloaded_data`` as for ``iter_rows``).

    Raises SlotError naming the file if a file is not a slot file.
    """
    from . import slotfiles  # pyarrow: only when a slot is read (the module note)

    return {row[0]: row for row in slotfiles.iter_rows(slot.paths,
                                                       offloaded_data=offloaded_data)}


# -- writing --------------------------------------------------------------------


@contextlib.contextmanager
def locked(srds_dir: Path, structure: str, *, exclusive: bool = True) -> Iterator[Path]:
    """Hold the structure's SRDS lock; yields its directory.

    Checkpoints and purges hold it exclusively (one writer of slots at a
    time); recovery shares it, so a checkpoint cannot replace the older slot
    while a recovery reads it. Raises SlotsBusy without waiting.
    """
    directory = structure_dir(srds_dir, structure)
    make_dirs(directory)
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise SlotsBusy(f"structure {structure}: another SRDS job (pid {holder}) is "
                            f"working on {directory}; retry when it ends") from None
        if exclusive:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield directory
    finally:
        os.close(fd)


def clear_leftovers(directory: Path) -> None:
    """Remove what killed jobs left in a structure's directory; call holding the lock
    exclusively. Slot directories the manifest does not list go too."""
    structure = directory.name
    listed_names = set(manifest.load(directory, structure)["slots"])
    for entry in os.scandir(directory):
        name = entry.name
        if (name.startswith((STAGING_PREFIX, RETIRED_PREFIX))
                or (name in SLOT_NAMES and name not in listed_names)):
            shutil.rmtree(entry.path, ignore_errors=True)
        elif name == manifest.NAME + ".tmp":
            os.unlink(entry.path)


def staging_dir(directory: Path, job: str) -> Path:
    """A fresh path (not created) for a job's output beside the slots."""
    return directory / f"{STAGING_PREFIX}{job}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def install(directory: Path, staged: Path, target: str, lsn: dict[str, int], last_id: int,
            taken: float, *, keep_other: bool = True) -> Slot:
    """Make the Parquet files in ``staged`` slot ``target`` and swap the manifest to it.

    The caller holds the lock exclusively and never passes the slot it read
    from as ``target``. Files other than ``*.parquet`` (Spark's ``_SUCCESS``
    and ``.crc`` files) are dropped; the rest are fsynced and checksummed.
    ``keep_other=False`` also drops the other slot, from the manifest first: a purge,
    which the manifest counts (``purges``), since the new slot is then not what the log
    up to its position folds to.
    """
    structure = directory.name
    files = _seal(staged, target)
    from . import slotfiles

    rows = sum(slotfiles.rows_in(staged / Path(f).name) for f in files)
    slot_dir, retired = directory / target, directory / f"{RETIRED_PREFIX}{target}"
    if slot_dir.exists():
        os.rename(slot_dir, retired)
    os.rename(staged, slot_dir)
    fsync_dir(directory)
    entry = {"lsn": dict(lsn), "time": taken, "rows": rows, "last_id": last_id,
             "files": {f: list(v) for f, v in files.items()}}
    entry["checksum"] = manifest.checksum(entry)
    m = manifest.load(directory, structure)
    m["slots"] = {**(m["slots"] if keep_other else {}), target: entry}
    m["current"] = target
    if not keep_other:
        m["purges"] = _purges_in(m) + 1
    manifest.store(directory, m)  # the commit point
    shutil.rmtree(retired, ignore_errors=True)
    if not keep_other:
        shutil.rmtree(directory / other(target), ignore_errors=True)
    fsync_dir(directory)
    return Slot(structure, target, directory, dict(lsn), taken, rows, last_id, files)


def _seal(staged: Path, target: str) -> dict[str, tuple[int, int]]:
    """fsync the Parquet files of ``staged`` and the directory; their manifest entries."""
    files = {}
    for entry in sorted(os.scandir(staged), key=lambda e: e.name):
        if not entry.name.endswith(".parquet"):
            os.unlink(entry.path)
            continue
        fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        files[f"{target}/{entry.name}"] = (entry.stat().st_size, _crc_of(Path(entry.path)))
    if not files:
        raise SlotError(f"{staged}: the job wrote no Parquet file")
    fsync_dir(staged)
    return files


def purge(srds_dir: Path, structure: str, lsn: dict[str, int], last_id: int) -> Slot:
    """Make an empty checkpoint at log position ``lsn`` current and delete the other.

    This is RECOVER --purge and structure delete: nothing older than ``lsn``
    can be recovered afterwards. ``last_id`` is kept so ids continue above it.
    Raises SlotsBusy if a checkpoint job is running (it would install older
    content after the purge).
    """
    return _install_empty(srds_dir, structure, lsn, last_id, keep_other=False)


def empty_checkpoint(srds_dir: Path, structure: str, lsn: dict[str, int], last_id: int) -> Slot:
    """The checkpoint of a structure that holds no message at log position ``lsn``:
    an empty slot there, made current as a job's would be (the other slot stays).
    It is exact, and needs no Spark job. Raises SlotsBusy if a job is running."""
    return _install_empty(srds_dir, structure, lsn, last_id, keep_other=True)


def _install_empty(srds_dir: Path, structure: str, lsn: dict[str, int], last_id: int, *,
                   keep_other: bool) -> Slot:
    from . import slotfiles

    with locked(srds_dir, structure) as directory:
        clear_leftovers(directory)
        target = other(manifest.load(directory, structure)["current"])
        staged = staging_dir(directory, "empty")
        try:
            staged.mkdir()
            slotfiles.write_empty(staged / "part-00000.parquet")
            return install(directory, staged, target, lsn, last_id, time.time(),
                           keep_other=keep_other)
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # gone already, unless it failed
