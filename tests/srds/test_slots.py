"""Slots and the manifest without Spark: validity, fallback, the swap, purge, the lock."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cqsd.srds import manifest, slotfiles, slots

S = "MSGQ01"


def row(eid, where="ready", owner=None, home=None, count=0, datamap=None, lease=None,
        not_before=None):
    return [eid, 1, "Q", b"m%d" % eid, True, eid * 10, count, where, owner, home, datamap,
            lease, not_before]


def stage(srds, rows, name="part-00000.parquet"):
    """Write rows as a job would, into a fresh staging directory."""
    directory = srds / S
    directory.mkdir(parents=True, exist_ok=True)
    staged = slots.staging_dir(directory, "test")
    staged.mkdir()
    pq.write_table(slotfiles.table_of(rows), staged / name)
    (staged / "_SUCCESS").write_bytes(b"")
    return directory, staged


def checkpoint(srds, rows, lsn, last_id=0):
    """What a checkpoint job does after Spark has written its files."""
    with slots.locked(srds, S) as directory:
        slots.clear_leftovers(directory)
        base = next(iter(slots.valid_slots(srds, S)), None)
        directory, staged = stage(srds, rows)
        return slots.install(directory, staged, slots.other(base.name if base else None),
                             lsn, last_id, 1.0)


def test_no_manifest_means_no_slot(tmp_path):
    """A structure never checkpointed has no valid slot, and nothing is created."""
    assert slots.valid_slots(tmp_path, S) == []
    assert not (tmp_path / S).exists()


def test_install_swaps_slots_and_read_rows_gives_image_rows(tmp_path):
    """Slots alternate; the newest comes first; rows come back in image format and id
    order, homes as [qtype, name]; Spark's extra files are not kept."""
    checkpoint(tmp_path, [row(2), row(1)], {"cqsd": 5}, 2)
    rows = [row(3, "locked", "IMS1", count=2), row(4, "ready", home=[1, "Q"])]
    second = checkpoint(tmp_path, rows, {"cqsd": 9}, 4)
    found = slots.valid_slots(tmp_path, S)
    assert [s.name for s in found] == ["SRDS2", "SRDS1"]
    assert found[0] == second and found[0].lsn == {"cqsd": 9} and found[0].last_id == 4
    assert slots.read_rows(found[0]) == {3: rows[0], 4: rows[1]}
    assert list(slots.read_rows(found[1])) == [1, 2]
    assert sorted(p.name for p in (tmp_path / S / "SRDS2").iterdir()) == ["part-00000.parquet"]


def test_a_damaged_file_skips_its_slot_with_a_warning_naming_it(tmp_path, capsys):
    """A changed byte (same size) fails the CRC; a missing file, or a changed size,
    is named too; the older slot is then the newest valid one."""
    checkpoint(tmp_path, [row(1)], {"cqsd": 1})
    newest = checkpoint(tmp_path, [row(1), row(2)], {"cqsd": 2})
    path = newest.paths[0]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    capsys.readouterr()
    assert [s.name for s in slots.valid_slots(tmp_path, S)] == ["SRDS1"]
    warning = capsys.readouterr().out
    assert "srds_slot_skipped" in warning and str(path) in warning and "CRC32C" in warning
    path.write_bytes(bytes(data[:-1]))
    assert "bytes, the manifest says" in slots.listed(tmp_path, S)[0][2]
    path.unlink()
    assert slots.listed(tmp_path, S)[0][2].endswith("missing")


def test_a_tampered_manifest_entry_fails_its_checksum(tmp_path):
    """Changing an LSN in the manifest by hand makes that slot unusable."""
    checkpoint(tmp_path, [row(1)], {"cqsd": 1})
    path = tmp_path / S / manifest.NAME
    m = json.loads(path.read_text())
    m["slots"]["SRDS1"]["lsn"]["cqsd"] = 0
    path.write_text(json.dumps(m))
    assert slots.valid_slots(tmp_path, S) == []
    assert "fails its checksum" in slots.listed(tmp_path, S)[0][2]


def test_a_manifest_of_another_structure_or_not_json_is_refused(tmp_path):
    """The manifest itself is either trusted or refused by name."""
    (tmp_path / S).mkdir()
    (tmp_path / S / manifest.NAME).write_text(json.dumps(manifest.empty("OTHER")))
    with pytest.raises(manifest.ManifestError, match="structure OTHER, not MSGQ01"):
        slots.valid_slots(tmp_path, S)
    (tmp_path / S / manifest.NAME).write_text("{")
    with pytest.raises(manifest.ManifestError, match="not JSON"):
        slots.valid_slots(tmp_path, S)


def test_a_crash_before_the_manifest_swap_leaves_the_old_slot_current(tmp_path, monkeypatch):
    """If the job dies after moving its files into place but before the swap, the
    manifest still names the old slot, which is whole; the next job clears up."""
    checkpoint(tmp_path, [row(1)], {"cqsd": 1})
    checkpoint(tmp_path, [row(1), row(2)], {"cqsd": 2})

    def crash(*args):
        raise SystemExit("killed")

    monkeypatch.setattr(manifest, "store", crash)
    with pytest.raises(SystemExit):
        checkpoint(tmp_path, [row(9)], {"cqsd": 3})
    monkeypatch.undo()
    found = slots.valid_slots(tmp_path, S)
    assert [(s.name, s.lsn) for s in found] == [("SRDS2", {"cqsd": 2})]
    assert (tmp_path / S / ".old-SRDS1").exists()
    checkpoint(tmp_path, [row(9)], {"cqsd": 3})
    assert [s.name for s in slots.valid_slots(tmp_path, S)] == ["SRDS1", "SRDS2"]
    assert sorted(p.name for p in (tmp_path / S).iterdir()) == [
        ".lock", "SRDS1", "SRDS2", "manifest.json"]


def test_purge_leaves_one_empty_slot_at_the_given_position(tmp_path):
    """purge: an empty slot at ``lsn`` is current, the other slot is gone from disk
    and manifest, and last_id is kept."""
    checkpoint(tmp_path, [row(1)], {"cqsd": 1})
    checkpoint(tmp_path, [row(1), row(2)], {"cqsd": 2})
    purged = slots.purge(tmp_path, S, {"cqsd": 7}, 99)
    assert slots.valid_slots(tmp_path, S) == [purged]
    assert (purged.name, purged.rows, purged.lsn, purged.last_id) == ("SRDS1", 0, {"cqsd": 7}, 99)
    assert slots.read_rows(purged) == {}
    assert not (tmp_path / S / "SRDS2").exists()
    assert set(json.loads((tmp_path / S / manifest.NAME).read_text())["slots"]) == {"SRDS1"}


def test_an_empty_checkpoint_becomes_current_and_keeps_the_other_slot(tmp_path):
    """empty_checkpoint: an empty slot at ``lsn`` is current, as a job's would be, and
    the slot it did not replace is still there to fall back on."""
    before = checkpoint(tmp_path, [row(1)], {"cqsd": 1}, 1)
    empty = slots.empty_checkpoint(tmp_path, S, {"cqsd": 7}, 99)
    assert slots.valid_slots(tmp_path, S) == [empty, before]
    assert (empty.name, empty.rows, empty.last_id) == ("SRDS2", 0, 99)
    assert not [p for p in (tmp_path / S).iterdir() if p.name.startswith(".staging")]


def test_newest_recorded_reads_the_manifest_only(tmp_path):
    """The position and time of the current slot, or of the other one when the
    current entry fails its checksum; None before the first checkpoint."""
    assert slots.newest_recorded(tmp_path, S) is None
    checkpoint(tmp_path, [row(1)], {"cqsd": 5})
    checkpoint(tmp_path, [row(2)], {"cqsd": 9})
    (tmp_path / S / "SRDS2" / "part-00000.parquet").write_bytes(b"damaged: not read")
    assert slots.newest_recorded(tmp_path, S) == ({"cqsd": 9}, 1.0)
    path = tmp_path / S / manifest.NAME
    m = json.loads(path.read_text())
    m["slots"]["SRDS2"]["rows"] += 1
    path.write_text(json.dumps(m))
    assert slots.newest_recorded(tmp_path, S) == ({"cqsd": 5}, 1.0)


def test_a_purge_is_refused_while_another_process_holds_the_lock(tmp_path):
    """A checkpoint running elsewhere would install older content after the purge."""
    holder = subprocess.Popen(
        [sys.executable, "-c", ("import sys, time; from cqsd.srds import slots\n"
                                f"with slots.locked({str(tmp_path)!r}, {S!r}):\n"
                                "    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(slots.SlotsBusy, match=f"pid {holder.pid}"):
            slots.purge(tmp_path, S, {"cqsd": 1}, 0)
    finally:
        holder.kill()
        holder.wait()


def test_structure_names_are_checked_before_they_become_paths(tmp_path):
    """Only the configuration's structure names are accepted (never ../x)."""
    for bad in ["../etc", "msgq", "", "A" * 17, "A/B"]:
        with pytest.raises(ValueError, match="structure name"):
            slots.valid_slots(tmp_path, bad)


def test_the_structure_name_rule_is_the_configuration_s():
    """slots repeats the rule of cqsd/config.py (which it must not import)."""
    from cqsd import config

    assert slots.STRUCTURE_NAME.pattern == config._STRUCTURE_NAME_RE.pattern


def test_slot_files_of_another_schema_are_refused(tmp_path):
    """A Parquet file that is not in the slot schema is not read as one."""
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"id": [1]}), path)
    with pytest.raises(slots.SlotError, match="not an SRDS slot file"):
        list(slotfiles.iter_rows([path]))


def test_an_offloaded_row_keeps_its_payload_and_its_map_unless_asked_not_to(tmp_path):
    """A checkpoint holds an offloaded message's bytes and its data map; a restart
    reads it with the map alone (the bytes are in the data set)."""
    datamap = ["IMS1", 2, 99, [64, 1]]
    slot = checkpoint(tmp_path, [row(1), row(2, datamap=datamap)], {"cqsd": 3}, 2)
    assert slots.read_rows(slot) == {1: row(1), 2: row(2, datamap=datamap)}
    without = slots.read_rows(slot, offloaded_data=False)
    assert without == {1: row(1), 2: [*row(2, datamap=datamap)[:3], b"", *row(2)[4:10], datamap,
                                      None, None]}


def test_a_slot_file_written_before_data_maps_is_read_with_no_maps(tmp_path):
    """Slot files of the format before SMDS (a string column ``ref`` where ``map`` is
    now) still load: every row has a nil map."""
    path = tmp_path / "old.parquet"
    pq.write_table(before_maps(slotfiles.table_of([row(1), row(2)])), path)
    assert list(slotfiles.iter_rows([path])) == [row(1), row(2)]


def test_a_lease_and_a_delay_round_trip_and_older_slots_have_neither(tmp_path):
    """A leased lock's [lease, deadline] and a delayed put's not_before are columns of
    their own; slot files written before them load with none."""
    rows = [row(1, "locked", "IMS1", count=1, lease=[30 * 10**9, 7 * 10**18]),
            row(2, not_before=8 * 10**18)]
    path = tmp_path / "new.parquet"
    pq.write_table(slotfiles.table_of(rows), path)
    assert list(slotfiles.iter_rows([path])) == rows
    pq.write_table(before_leases(slotfiles.table_of(rows)), path)
    assert list(slotfiles.iter_rows([path])) == [[*r[:11], None, None] for r in rows]


def before_leases(table: pa.Table) -> pa.Table:
    """A slot table as cqsd wrote it before leases and delayed puts."""
    return table.drop_columns(["lease", "deadline", "not_before"])


def before_maps(table: pa.Table) -> pa.Table:
    """A slot table as cqsd wrote it before SMDS: ``ref``, a null string, for ``map``."""
    table = before_leases(table)
    return table.set_column(table.schema.get_field_index("map"), "ref",
                            pa.nulls(table.num_rows, pa.string()))
