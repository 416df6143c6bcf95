"""The repository: what cqsd knows about its own structures and backups, in SQLite.

IBM MQ keeps the name of each structure backup, its log range and its time in
a shared Db2 repository (seeds 002, 003), with the CFSTRUCT definitions; ours
is ``<data_dir>/repository.db``: backups, data sets, and each structure's
SIZE, INITSIZE and current size (docs/datadir.md), which outlive the config file
that first set them.
The daemon and the SRDS jobs open it at the same time, so it runs in WAL mode
with a busy timeout, and every write is one short transaction.

The schema is versioned with ``PRAGMA user_version``: ``MIGRATIONS[n]`` takes
a database from version n to n + 1, so later tables (SMDS data sets, structure
definitions) are added by appending to it. A database newer than this code is
refused rather than written to.
"""

import json
import sqlite3
import time
from pathlib import Path

from ..errors import DaemonError

BUSY_TIMEOUT = 30.0  # seconds a writer waits for another; a job's commit takes milliseconds

MIGRATIONS: list[list[str]] = [
    [  # 1: the backups table
        """CREATE TABLE backups (
            id INTEGER PRIMARY KEY,
            structure TEXT NOT NULL,
            slot TEXT,                  -- SRDS1 or SRDS2, NULL if it failed before choosing
            lsn_from TEXT NOT NULL,     -- JSON {writer: last LSN of the slot it started from}
            lsn_to TEXT NOT NULL,       -- JSON {writer: last LSN included}
            started REAL NOT NULL,      -- epoch seconds
            finished REAL NOT NULL,
            rows INTEGER,
            records INTEGER,
            status TEXT NOT NULL,       -- ok or failed
            error TEXT                  -- why it failed
        )""",
        "CREATE INDEX backups_by_structure ON backups (structure, finished)",
    ],
    [  # 2: the shared message data sets
        """CREATE TABLE smds (
            structure TEXT NOT NULL,
            owner TEXT NOT NULL,
            created INTEGER NOT NULL,   -- the data set's identity (its header's created, ns)
            map_time INTEGER,           -- timestamp of the space map saved at a clean close
            PRIMARY KEY (structure, owner)
        )""",
    ],
    [  # 3: their states and overrides (seed 000: the SMDS object and its connection flag)
        "ALTER TABLE smds ADD COLUMN status TEXT NOT NULL DEFAULT 'ACTIVE'",
        "ALTER TABLE smds ADD COLUMN access TEXT NOT NULL DEFAULT 'ENABLED'",
        "ALTER TABLE smds ADD COLUMN stopped INTEGER NOT NULL DEFAULT 0",  # stop-smdsconn
        "ALTER TABLE smds ADD COLUMN rcvtime INTEGER",  # ns: recovery logging began (ACTIVE)
        "ALTER TABLE smds ADD COLUMN failtime INTEGER",  # ns: it went FAILED
        "ALTER TABLE smds ADD COLUMN dsexpand TEXT",  # alter-smds override: YES, NO; NULL default
        "ALTER TABLE smds ADD COLUMN dsbufs INTEGER",  # alter-smds override; NULL default
    ],
    [  # 4: structure definitions, seeded from the config, then changed by operators
        """CREATE TABLE structures (
            name TEXT PRIMARY KEY,
            size INTEGER NOT NULL,          -- SIZE, bytes
            initsize INTEGER NOT NULL,      -- INITSIZE, bytes
            current_size INTEGER NOT NULL,  -- as the last alter (operator or growth) left it
            changed_by TEXT NOT NULL,       -- config, operator, rebuild, or why it grew
            changed REAL NOT NULL,          -- epoch seconds
            failed INTEGER NOT NULL DEFAULT 0  -- failed by an operator until recovered
        )""",
    ],
]
# What update_smds may set; ``created`` is 0 until the data set is formatted.
SMDS_FIELDS = ("created", "map_time", "status", "access", "stopped", "rcvtime", "failtime",
               "dsexpand", "dsbufs")


class RepositoryError(DaemonError):
    """The repository cannot be used; the message names the file and why."""


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating or upgrading) the repository; raises RepositoryError."""
    try:
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT * 1000)}")
        _migrate(path, db)
    except sqlite3.Error as err:
        raise RepositoryError(f"{path}: {err}") from err
    db.row_factory = sqlite3.Row
    return db


def _migrate(path: Path, db: sqlite3.Connection) -> None:
    db.execute("BEGIN IMMEDIATE")  # two processes opening a new file migrate one at a time
    try:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > len(MIGRATIONS):
            raise RepositoryError(f"{path}: schema version {version} is newer than this cqsd "
                                  f"knows ({len(MIGRATIONS)})")
        for step in MIGRATIONS[version:]:
            for statement in step:
                db.execute(statement)
        db.execute(f"PRAGMA user_version={len(MIGRATIONS)}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def record_backup(path: Path, *, structure: str, slot: str | None, lsn_from: dict[str, int],
                  lsn_to: dict[str, int], started: float, finished: float, rows: int | None,
                  records: int | None, status: str, error: str | None = None) -> int:
    """Record one checkpoint job, done or failed; returns its id."""
    return _write(
        path,
        "INSERT INTO backups (structure, slot, lsn_from, lsn_to, started, finished, rows,"
        " records, status, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (structure, slot, json.dumps(lsn_from, sort_keys=True),
         json.dumps(lsn_to, sort_keys=True), started, finished, rows, records, status, error),
    )


def backups(path: Path, structure: str | None = None) -> list[dict]:
    """Recorded checkpoint jobs, newest first, of one structure or all."""
    query = "SELECT * FROM backups"
    args: tuple = ()
    if structure is not None:
        query, args = query + " WHERE structure = ?", (structure,)
    rows = _read(path, query + " ORDER BY finished DESC, id DESC", args)
    return [{**dict(r), "lsn_from": json.loads(r["lsn_from"]), "lsn_to": json.loads(r["lsn_to"])}
            for r in rows]


def record_smds(path: Path, structure: str, owner: str, created: int,
                map_time: int | None) -> None:
    """Remember a data set's identity and the timestamp of its saved space map
    (None while it is open: a map saved before is no longer current)."""
    update_smds(path, structure, owner, created=created, map_time=map_time)


def update_smds(path: Path, structure: str, owner: str, **fields: object) -> None:
    """Set ``fields`` (of SMDS_FIELDS) of a data set's row, creating it if need be."""
    unknown = set(fields) - set(SMDS_FIELDS)
    if unknown:
        raise ValueError(f"not smds columns: {sorted(unknown)}")
    names = ["created", *[f for f in fields if f != "created"]]
    values = [fields.get("created", 0), *[fields[f] for f in names[1:]]]
    updates = ", ".join(f"{f} = excluded.{f}" for f in fields) or "created = created"
    _write(path, f"INSERT INTO smds (structure, owner, {', '.join(names)})"
                 f" VALUES (?, ?, {', '.join('?' * len(names))})"
                 f" ON CONFLICT (structure, owner) DO UPDATE SET {updates}",
           (structure, owner, *values))


def forget_smds(path: Path, structure: str, owner: str) -> None:
    """Drop a data set's row: its file was deleted (in a group, an inherited data set
    whose last message is gone; docs/smds.md)."""
    _write(path, "DELETE FROM smds WHERE structure = ? AND owner = ?", (structure, owner))


def smds_datasets(path: Path) -> list[dict]:
    """Every data set the repository knows, with its states and overrides."""
    return [dict(r) for r in _read(path, "SELECT * FROM smds ORDER BY structure, owner")]


def smds_dataset(path: Path, structure: str, owner: str) -> dict | None:
    """What the repository holds of a data set (its row of smds_datasets), or None."""
    rows = _read(path, "SELECT * FROM smds WHERE structure = ? AND owner = ?",
                 (structure, owner))
    return dict(rows[0]) if rows else None


def structures(path: Path) -> dict[str, dict]:
    """What the repository holds of each structure, by name: {size, initsize,
    current_size, changed_by, changed, failed}."""
    rows = _read(path, "SELECT * FROM structures")
    return {r["name"]: {**dict(r), "failed": bool(r["failed"])} for r in rows}


def record_structure(path: Path, name: str, *, size: int, initsize: int, current_size: int,
                     changed_by: str) -> None:
    """Set a structure's definition and current size (its failed flag stays)."""
    _write(path, "INSERT INTO structures (name, size, initsize, current_size, changed_by,"
                 " changed) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
                 " size = excluded.size, initsize = excluded.initsize,"
                 " current_size = excluded.current_size, changed_by = excluded.changed_by,"
                 " changed = excluded.changed",
           (name, size, initsize, current_size, changed_by, time.time()))


def record_current_size(path: Path, name: str, current_size: int, changed_by: str) -> None:
    """A structure's current size after an alter (the operator's, or a growth)."""
    _write(path, "UPDATE structures SET current_size = ?, changed_by = ?, changed = ?"
                 " WHERE name = ?", (current_size, changed_by, time.time(), name))


def record_failed(path: Path, name: str, failed: bool) -> None:
    """Whether an operator failed the structure (cleared when it is recovered)."""
    _write(path, "UPDATE structures SET failed = ? WHERE name = ?", (int(failed), name))


def _write(path: Path, statement: str, args: tuple) -> int:
    """Run one statement that changes the repository; the row id it inserted."""
    db = connect(path)
    try:
        return db.execute(statement, args).lastrowid or 0
    except sqlite3.Error as err:
        raise RepositoryError(f"{path}: {err}") from err
    finally:
        db.close()


def _read(path: Path, query: str, args: tuple = ()) -> list[sqlite3.Row]:
    """The rows of one query; none from a repository not created yet (reading
    does not create it)."""
    if not Path(path).exists():
        return []
    db = connect(path)
    try:
        return db.execute(query, args).fetchall()
    except sqlite3.Error as err:
        raise RepositoryError(f"{path}: {err}") from err
    finally:
        db.close()
