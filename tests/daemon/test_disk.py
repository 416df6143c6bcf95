"""The disk: a full log disk, a full SRDS disk, a data directory that cannot be
written at start or becomes read-only during a checkpoint, a file system without
Unix sockets (lazyfs, tests/faults). Each gives a named
error event (and at start a one-line message and a non-zero exit), loses
nothing acknowledged, and is recovered from once the disk is usable again.

The filesystems are tmpfs mounts and read-only remounts in a mount namespace of
the test's own (``namespace`` fixture): root ignores permission bits, not a
read-only mount.
"""

import json
import os
import subprocess
import sys
import threading

import pytest

import cqsclient
from cqsclient.errors import CQSError

from .test_checkpoints import JOBS, ONE, contents


def payloads(n: int, size: int = 1000) -> list[bytes]:
    """Incompressible messages: their checkpoint takes as much disk as they do."""
    return [b"%06d" % i + os.urandom(size) for i in range(n)]


def put_all(d, datas: list[bytes]) -> list[int]:
    with cqsclient.connect(d.address, client="PUTTER") as c:
        s = c.structure("MSGQ01")
        return [eid for i in range(0, len(datas), 100)
                for eid in s.put_batch("Q", datas[i:i + 100])]


def still_serving(d) -> None:
    with cqsclient.connect(d.address, client="PROBE") as c:
        s = c.structure("MSGQ01")
        eid = s.put("PROBE", b"still here")
        assert s.read("PROBE").entry_id == eid
        s.delete(eid)


def checkpoints_again(d, acked: list[int]) -> None:
    """A checkpoint now holds every acknowledged message and trims the log, and a
    crash restart from it has them all."""
    with cqsclient.connect(d.address, client="OPER") as c:
        assert c.checkpoint("MSGQ01")["rows"] == len(acked)
    d.wait_for("log_trimmed")  # logged before the reply, but its line may trail it
    d.kill()
    d.restart()
    assert [eid for eid, _, _ in contents(d.address)] == acked


def listing(namespace, path) -> str:
    """Every file under ``path`` with its size and modification time, as the daemon's
    namespace sees it."""
    return namespace.run("find", str(path), "-printf", "%P %s %T@\n")


def test_full_log_disk_gives_clean_errors_and_recovers_when_space_is_back(make_daemon,
                                                                          namespace):
    """Filling the disk refuses acknowledgements; once space is back, every ack is there."""
    d = make_daemon('log_segment = "64KiB"', prefix=namespace.prefix)
    disk = namespace.small_disk(d.dir / "disk", "6m")
    d.use_data_dir(disk / "data")
    d.start()
    namespace.fill(disk / "ballast", 1)
    acked, refused = [], None
    c = cqsclient.connect(d.address, client="FILL")
    s = c.structure("MSGQ01")
    for i in range(200):
        try:
            acked.append(s.put("FULL", b"%06d" % i + b"x" * 60_000))
        except CQSError as err:
            refused = err
            break
    c.close()
    assert refused is not None, "the disk never filled"
    assert refused.reason in ("SHUTTING_DOWN", "CONNECTION_LOST")
    assert d.proc.wait(30) == 3
    assert d.events("log_write_failed")
    namespace.run("rm", str(disk / "ballast"))
    d.restart()
    with cqsclient.connect(d.address, client="CHECK") as c:
        got = c.structure("MSGQ01").browse("FULL", limit=1000)
    assert [m.entry_id for m in got][: len(acked)] == acked


def test_a_full_srds_disk_fails_the_checkpoint_and_the_next_one_trims_the_log(make_daemon,
                                                                              namespace):
    """With the SRDS on a disk too small for the checkpoint, the job fails with an
    error event saying so and the daemon serves on; once space is freed the next
    checkpoint succeeds, the log behind it is trimmed, and a crash restart from it
    has every acknowledged message."""
    d = make_daemon(JOBS, structures=ONE, prefix=namespace.prefix)
    srds = namespace.small_disk(d.data / "srds", "2m")
    namespace.fill(srds / "ballast", 1)
    d.start()
    acked = put_all(d, payloads(1500))  # 1.5 MB of slot for the 1 MB left
    with cqsclient.connect(d.address, client="OPER") as c, pytest.raises(CQSError) as failed:
        c.checkpoint("MSGQ01")
    (event,) = d.wait_for("checkpoint_failed")  # the log line may trail the reply
    assert "No space left on device" in event["error"] and event["structure"] == "MSGQ01"
    assert "No space left on device" in failed.value.message
    still_serving(d)
    assert namespace.run("ls", "-A", str(srds / "MSGQ01")).split() in (
        [".lock", "manifest.json"], [".lock"]), "the failed job left files behind"
    namespace.run("rm", str(srds / "ballast"))
    checkpoints_again(d, acked)


def test_an_unwritable_data_directory_is_refused_at_start_and_left_as_it_was(make_daemon,
                                                                            namespace):
    """A crashed daemon's data directory mounted read-only: the next start fails at
    once with a start_failed event (after the starting event that names the version,
    config and data directory), one line saying why, exit 1, and changes nothing;
    made writable again, it starts and has every acknowledged message."""
    d = make_daemon(structures=ONE, prefix=namespace.prefix).start()
    acked = put_all(d, payloads(10))
    d.kill()
    namespace.writable(d.data, False)
    before = listing(namespace, d.data)
    done = subprocess.run([*namespace.prefix, sys.executable, "-m", "cqsd", "run", "--config",
                           str(d.config)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1
    *events, message = done.stderr.strip().splitlines()
    assert message == f"cqsd: cannot start: data directory {d.data}: Read-only file system"
    assert [json.loads(e)["event"] for e in events] == ["starting", "start_failed"]
    assert listing(namespace, d.data) == before
    namespace.writable(d.data, True)
    d.start()
    assert [eid for eid, _, _ in contents(d.address)] == acked


def test_a_data_directory_made_read_only_during_a_checkpoint_fails_it_cleanly(make_daemon,
                                                                             namespace):
    """The data directory (but its log, on a disk of its own) turning read-only while a
    checkpoint job runs fails the checkpoint with an error event naming the cause;
    the daemon serves on, and checkpoints and trimming work once it is writable."""
    d = make_daemon(JOBS, structures=ONE, prefix=namespace.prefix)
    namespace.run("mkdir", "-p", str(d.data / "logstream"))
    namespace.writable(d.data, True)
    namespace.writable(d.data / "logstream", True)  # a mount of its own inside it
    d.start()
    acked = put_all(d, payloads(300))
    outcome = []

    def checkpoint():
        with cqsclient.connect(d.address, client="OPER") as c:
            try:
                outcome.append(c.checkpoint("MSGQ01"))
            except CQSError as err:
                outcome.append(err)

    operator = threading.Thread(target=checkpoint)
    operator.start()
    d.wait_for("checkpoint_started")
    namespace.writable(d.data, False)
    operator.join(300)
    (event,) = d.wait_for("checkpoint_failed")  # the log line may trail the reply
    assert "Read-only file system" in event["error"]
    assert isinstance(outcome[0], CQSError)
    acked += put_all(d, payloads(10))  # the log is still writable: work goes on
    still_serving(d)
    namespace.writable(d.data, True)
    checkpoints_again(d, acked)


def test_a_socket_on_a_file_system_without_unix_sockets_is_named_with_what_to_do(make_daemon):
    """A data directory, and its socket, on a file system that refuses Unix sockets
    (a FUSE one without mknod: ENOSYS): the start fails naming the socket's path and
    saying to set [daemon] socket elsewhere; with the socket moved, it starts."""
    from tests.faults.lazyfs import LazyFS

    d = make_daemon(structures=ONE)
    with LazyFS(d.dir / "backing", d.dir / "mnt") as fs:
        fs.sockets(False)
        d.use_data_dir(fs.mountpoint / "data")
        inside = d.data / "cqsd.sock"
        elsewhere = d.config.read_text()
        d.config.write_text(elsewhere.replace(f'socket = "{d.socket}"', f'socket = "{inside}"'))
        done = subprocess.run([sys.executable, "-m", "cqsd", "run", "--config", str(d.config)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 1
        message = done.stderr.strip().splitlines()[-1]
        assert message.startswith(f"cqsd: cannot start: socket {inside}: cannot make a Unix "
                                  "socket there (Function not implemented)")
        assert "set [daemon] socket to a path on a local file system" in message
        d.config.write_text(elsewhere)
        d.start()
        still_serving(d)
        d.stop()
