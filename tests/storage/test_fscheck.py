"""cqsd fscheck: a directory that qualifies passes, and each fault it looks for is caught."""

import errno
import os
import subprocess
import sys

import pytest

from cqsd.__main__ import main
from cqsd.storage import fscheck
from tests.faults.lazyfs import LazyFS


def run_single(tmp_path, capsys, *extra):
    """`cqsd fscheck --single` in this process (the partner is a fork of it): code, lines."""
    code = main(["fscheck", "--single", "--wait", "20", "--records", "200", *extra, str(tmp_path)])
    return code, capsys.readouterr().out.splitlines()


def verdicts(lines):
    return {line.split(":")[0] for line in lines if not line.startswith("fscheck ")}


def test_a_local_directory_passes_every_check_and_is_left_clean(tmp_path, capsys):
    """On the test machine's own disk every check passes and the rendezvous is removed."""
    code, lines = run_single(tmp_path, capsys)
    assert code == 0, lines
    assert verdicts(lines) >= {"PASS flock", "PASS fcntl-lock", "PASS fsync", "PASS fsync-seen",
                               "PASS records-append", "PASS records-read", "PASS unix-socket"}
    assert not any(line.startswith("FAIL") for line in lines)
    assert os.listdir(tmp_path) == []


def test_two_processes_started_separately_meet_and_both_pass(tmp_path):
    """Two `cqsd fscheck DIR` processes, as on two nodes, find each other through DIR."""
    cmd = [sys.executable, "-m", "cqsd", "fscheck", "--wait", "30", "--records", "500",
           str(tmp_path)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    second = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    outs = [p.communicate(timeout=60)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs
    for out in outs:
        assert "PASS records-read: the other node's 500 records read whole and in order" in out
        assert "FAIL" not in out
    assert os.listdir(tmp_path) == []


def test_locks_that_do_not_exclude_fail_the_lock_check(tmp_path, capsys, monkeypatch):
    """A flock that grants everything (as on NFSv3 without NLM, emulated here) is a FAIL, exit 1."""
    monkeypatch.setattr(fscheck, "_flock", lambda fd: None)  # the fork inherits it
    code, lines = run_single(tmp_path, capsys)
    assert code == 1
    assert ("FAIL flock: the lock held by the other node was granted (no exclusion)"
            in "\n".join(lines))
    assert "PASS fcntl-lock" in verdicts(lines)  # the other lock is still checked on its own


def test_records_out_of_order_fail_the_read_check(tmp_path, capsys, monkeypatch):
    """A record that is not the next one (stale or reordered data) is caught by the reader."""
    real = fscheck.encode_record
    monkeypatch.setattr(fscheck, "encode_record", lambda seq: real(seq + (seq == 50)))
    code, lines = run_single(tmp_path, capsys)
    assert code == 1
    assert "FAIL records-read: after 49 good records: record 51 found where 50 was due" in lines


def test_fallocate_not_supported_is_a_warning_not_a_failure(tmp_path, capsys, monkeypatch):
    """EOPNOTSUPP from fallocate(2) warns (the daemon must cope) and the exit stays 0."""
    monkeypatch.setattr(fscheck, "_fallocate", lambda fd, offset, length: errno.EOPNOTSUPP)
    code, lines = run_single(tmp_path, capsys)
    assert code == 0
    assert any(line.startswith("WARN fallocate: not supported (EOPNOTSUPP)") for line in lines)


def test_a_fuse_file_system_without_fallocate_warns_and_still_passes(tmp_path):
    """On lazyfs (FUSE, no fallocate handler) the warning is real, and says glibc's fallback
    fails on a write-only fd, as the log's preallocation of a reopened segment does."""
    with LazyFS(tmp_path / "backing", tmp_path / "mnt") as fs:
        done = subprocess.run([sys.executable, "-m", "cqsd", "fscheck", "--single", "--records",
                               "200", str(fs.mountpoint)], capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 0, done.stdout
    assert ("WARN fallocate: not supported (EOPNOTSUPP): the daemon must cope; and"
            " posix_fallocate on a write-only fd fails: Bad file descriptor") in done.stdout
    assert "PASS records-read" in done.stdout and "FAIL" not in done.stdout


def test_no_partner_within_wait_fails_and_leaves_nothing(tmp_path, capsys):
    """Alone, the first arrival gives up after --wait and removes its rendezvous."""
    code = main(["fscheck", "--wait", "0.2", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL partner: the other party did not reach step 0 within 0.2 s" in out
    assert os.listdir(tmp_path) == []


def test_a_rendezvous_left_by_a_killed_run_is_named(tmp_path, capsys):
    """A leftover .cqsd-fscheck is reported with the path to remove, not waited on forever."""
    (tmp_path / fscheck.RENDEZVOUS).mkdir()
    (tmp_path / fscheck.RENDEZVOUS / "run").write_text("0123\nhost pid 1\n")
    (tmp_path / fscheck.RENDEZVOUS / "a.step").write_text("          7\n")
    (tmp_path / fscheck.RENDEZVOUS / "b.step").write_text("          7\n")
    assert main(["fscheck", "--wait", "5", str(tmp_path)]) == 1
    assert "was left by an earlier fscheck: remove it" in capsys.readouterr().out


def test_bad_usage_exits_2(tmp_path, capsys):
    """A missing DIR, a non-positive --wait or no DIR at all is bad usage."""
    assert main(["fscheck", str(tmp_path / "missing")]) == 2
    assert main(["fscheck", "--wait", "0", str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as exited:
        main(["fscheck"])
    assert exited.value.code == 2


def test_a_record_is_decoded_only_when_whole_and_its_crc_matches():
    """Partial, zeroed and damaged bytes are reasons to wait, never a record."""
    rec = fscheck.encode_record(7)
    assert fscheck.decode_record(rec, 0) == (7, len(rec))
    assert fscheck.decode_record(rec[:-1], 0) == "incomplete payload"
    assert fscheck.decode_record(bytes(len(rec)), 0) == "zeros (not written yet)"
    damaged = rec[:-1] + bytes([rec[-1] ^ 1])
    assert fscheck.decode_record(damaged, 0) == "bad CRC"
