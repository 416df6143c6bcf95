"""The SRDS jobs unchanged on a Spark standalone cluster (a master and one worker of
one core, on loopback): the daemon runs checkpoint and recovery there when its
``spark_master`` names the master, and the traffic report runs there beside the
live daemon. The data directory is the shared storage the jobs read and write."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import cqsclient
from cqsd.recovery.sealed import cut_of
from cqsd.server.jobs import cut_args
from cqsd.storage import image
from tests.daemon.harness import Daemon

from .cluster import LOOPBACK, Cluster
from .histories import History, Seeded
from .test_sealed_log import write_epochs

ROOT = Path(__file__).resolve().parents[2]
ONE = '[[structure]]\nname = "MSGQ01"\nsize = "16MiB"\n'
EXECUTOR_MEMORY = "512m"  # spark-defaults.conf in SPARK_CONF_DIR: how an operator sizes executors


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(cores=1, memory="1g")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def daemon(cluster, tmp_path_factory):
    """A daemon whose jobs go to the cluster, sized by a spark-defaults.conf."""
    conf = tmp_path_factory.mktemp("sparkconf")
    (conf / "spark-defaults.conf").write_text(f"spark.executor.memory {EXECUTOR_MEMORY}\n")
    env = {"SPARK_LOCAL_IP": LOOPBACK, "SPARK_CONF_DIR": str(conf)}
    d = Daemon(f'spark_master = "{cluster.master}"\ncheckpoint_interval = 0\n', ONE,
               env=env).start()
    yield d
    d.cleanup()


def ctl(d: Daemon, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "cqsclient.ctl", "--address", d.address,
                           "--json", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def contents(d: Daemon) -> list[tuple[int, bytes]]:
    with cqsclient.connect(d.address, client="LOOK") as c:
        return [(m.entry_id, m.data) for m in c.structure("MSGQ01").browse_all("Q")]


def test_the_daemon_checkpoints_and_recovers_on_the_cluster(cluster, daemon):
    """cqsctl checkpoint and cqsctl recover: each job is an application the master gives
    an executor on the worker (of the memory spark-defaults.conf asks), and their
    results are those of a local run: the slot holds the messages, recovery brings
    back what the checkpoint and the log after it hold."""
    with cqsclient.connect(daemon.address, client="APP") as c:
        s = c.structure("MSGQ01")
        for i in range(40):
            s.put("Q", b"%03d" % i)
        for _ in range(10):
            s.delete(s.read("Q").entry_id)
    before = contents(daemon)
    checkpoint = ctl(daemon, "checkpoint", "MSGQ01")
    # Distinct applications: the master launches another executor for an application
    # whose executor died (a worker starved under load), and the job still finishes.
    assert checkpoint["rows"] == 30 and len(set(cluster.executors())) == 1
    with cqsclient.connect(daemon.address, client="APP") as c:
        c.structure("MSGQ01").put("Q", b"after the checkpoint")
    recovered = ctl(daemon, "recover", "MSGQ01")
    assert recovered["messages"] == 31, recovered
    assert [data for _, data in contents(daemon)] == [d for _, d in before] + [
        b"after the checkpoint"]
    assert len(set(cluster.executors())) == 2
    launched = cluster.worker.matching(r"Asked to launch executor (app-\S+?)/\d+ for (\S+)")
    assert sorted({m.groups() for m in launched}) == [
        (app, "cqsd-srds") for app in sorted(set(cluster.executors()))]
    assert cluster.worker.matching(f"-Xmx{EXECUTOR_MEMORY.upper()}")


def test_the_traffic_report_runs_on_the_cluster_beside_the_live_daemon(cluster, daemon,
                                                                       tmp_path):
    """report --master spark://…: the same figures as the daemon's traffic, one more
    application on the worker, and the daemon still serving."""
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "cqsd.srds", "report", "--data-dir", str(daemon.data),
         "--out", str(out), "--master", cluster.master], cwd=ROOT, capture_output=True,
        text=True, timeout=300, env={**os.environ, **daemon.env})
    assert done.returncode == 0, done.stderr
    row = {r["queue"]: r for r in pq.read_table(out / "queues.parquet").to_pylist()}["Q"]
    assert (row["puts"], row["reads"], row["deletes"]) == (41, 10, 10)
    assert pq.read_table(out / "checkpoints.parquet").column("status").to_pylist() == ["ok"]
    assert len(set(cluster.executors())) == 3
    assert contents(daemon)[-1][1] == b"after the checkpoint"


def test_a_log_of_three_nodes_and_several_epochs_checkpoints_and_recovers_on_the_cluster(
        cluster, tmp_path):
    """A pair's log written by three nodes over four epochs, each deposed owner writing
    on past its seal (test_sealed_log.py): the checkpoint and the recovery jobs on
    the standalone master, given the seals' cuts as the daemon gives them, rebuild
    the pair's primary to the reference fold, the late writes nowhere."""
    h = History("G", Seeded(27)).run(300)
    n = len(h.records)
    (tmp_path / "logstream").mkdir()
    bounds = sorted({h.safe(n // 4), h.safe(n // 2), h.safe(3 * n // 4)})
    assert write_epochs(tmp_path / "logstream", h, bounds, random.Random(27))
    cut = cut_of(tmp_path / "logstream", h.primary.name)
    assert {w.partition("-")[0] for w in cut} == {"NODE1", "NODE2", "NODE3"}, cut
    env, s = {**os.environ, "SPARK_LOCAL_IP": LOOPBACK}, h.primary.name
    for job in (["checkpoint", "--structure", s],
                ["recover", "--structure", s, "--to-image", str(tmp_path / "recovered.img")]):
        done = subprocess.run(
            [sys.executable, "-m", "cqsd.srds", *job, "--data-dir", str(tmp_path),
             "--master", cluster.master, *cut_args(cut)],
            capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    assert image.read_rows(tmp_path / "recovered.img", s)[1] == h.expected()[s]
