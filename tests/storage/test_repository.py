"""The SQLite repository: backups recorded and listed, WAL mode, a versioned schema."""

import sqlite3

import pytest

from cqsd.storage import repository


def record(path, structure, finished, status="ok", **kw):
    return repository.record_backup(
        path, structure=structure, slot="SRDS1", lsn_from={"cqsd": 1}, lsn_to={"cqsd": 9},
        started=finished - 1, finished=finished, rows=3, records=8, status=status, **kw)


def test_backups_are_listed_newest_first_per_structure_or_all(tmp_path):
    """backups() decodes the LSN ranges and orders by finish time, newest first."""
    db = tmp_path / "repository.db"
    record(db, "A", 10.0)
    record(db, "B", 11.0)
    record(db, "A", 12.0, status="failed", error="FoldError: structure A: ...")
    assert [(b["structure"], b["finished"]) for b in repository.backups(db)] == [
        ("A", 12.0), ("B", 11.0), ("A", 10.0)]
    newest = repository.backups(db, "A")[0]
    assert newest["lsn_to"] == {"cqsd": 9} and newest["status"] == "failed"
    assert newest["error"].startswith("FoldError")


def test_no_repository_yet_means_no_backups(tmp_path):
    """Listing does not create the file."""
    assert repository.backups(tmp_path / "repository.db") == []
    assert not (tmp_path / "repository.db").exists()


def test_it_runs_in_wal_mode_with_the_current_schema_version(tmp_path):
    """WAL lets the daemon read while a job writes; user_version tracks the schema."""
    db = tmp_path / "repository.db"
    record(db, "A", 1.0)
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA user_version").fetchone()[0] == len(repository.MIGRATIONS)


def test_a_repository_newer_than_this_code_is_refused(tmp_path):
    """A later cqsd's schema is not written to by an older one."""
    db = tmp_path / "repository.db"
    raw = sqlite3.connect(db)
    raw.execute(f"PRAGMA user_version={len(repository.MIGRATIONS) + 1}")
    raw.close()
    with pytest.raises(repository.RepositoryError, match="newer than this cqsd knows"):
        repository.backups(db)


def test_a_data_sets_states_are_kept_and_updated_field_by_field(tmp_path):
    """update_smds creates a row (created 0 until the data set is formatted) and then
    changes only the fields it is given."""
    db = tmp_path / "repository.db"
    repository.update_smds(db, "S", "A", status="NEW")
    assert repository.smds_dataset(db, "S", "A") == {
        "structure": "S", "owner": "A", "created": 0, "map_time": None, "status": "NEW",
        "access": "ENABLED", "stopped": 0, "rcvtime": None, "failtime": None,
        "dsexpand": None, "dsbufs": None}
    repository.record_smds(db, "S", "A", 123, None)
    repository.update_smds(db, "S", "A", status="ACTIVE", rcvtime=5, stopped=1)
    row = repository.smds_dataset(db, "S", "A")
    assert (row["created"], row["status"], row["rcvtime"], row["stopped"]) == (123, "ACTIVE", 5, 1)
    assert [r["owner"] for r in repository.smds_datasets(db)] == ["A"]
    with pytest.raises(ValueError, match="not smds columns"):
        repository.update_smds(db, "S", "A", bogus=1)


def test_structure_definitions_are_kept_and_updated(tmp_path):
    """A structure's SIZE, INITSIZE, current size and failed flag are one row each,
    replaced whole or in part, and read back together."""
    db = tmp_path / "repository.db"
    assert repository.structures(db) == {}
    repository.record_structure(db, "MSGQ01", size=64, initsize=32, current_size=32,
                                changed_by="config")
    repository.record_structure(db, "EMHQ01", size=16, initsize=16, current_size=16,
                                changed_by="config")
    repository.record_current_size(db, "MSGQ01", 48, "operator")
    repository.record_failed(db, "EMHQ01", True)
    rows = repository.structures(db)
    assert {k: rows["MSGQ01"][k] for k in ("size", "initsize", "current_size", "changed_by",
                                           "failed")} == (
        {"size": 64, "initsize": 32, "current_size": 48, "changed_by": "operator",
         "failed": False})
    assert rows["EMHQ01"]["failed"] is True and rows["MSGQ01"]["changed"] > 0


def test_a_version_2_repository_is_migrated_in_place(tmp_path):
    """A version-2 repository (backups and data sets) keeps its rows: its data sets get
    the states they had (migration 3), and the structures table is added (4)."""
    db = tmp_path / "repository.db"
    raw = sqlite3.connect(db)
    for step in repository.MIGRATIONS[:2]:
        for statement in step:
            raw.execute(statement)
    raw.execute("INSERT INTO smds VALUES ('S', 'A', 7, 9)")
    raw.execute("PRAGMA user_version=2")
    raw.commit()
    raw.close()
    row = repository.smds_dataset(db, "S", "A")
    assert (row["status"], row["access"], row["stopped"], row["map_time"]) == (
        "ACTIVE", "ENABLED", 0, 9)
    assert repository.structures(db) == {}
