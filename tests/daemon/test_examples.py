"""The examples in examples/ run against a real daemon, as their docstrings say."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cqsclient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def start(example: str, d, *args: str, client: str) -> subprocess.Popen:
    env = {**os.environ, "CQSD_ADDRESS": d.address, "CQSD_CLIENT": client}
    return subprocess.Popen([sys.executable, str(EXAMPLES / example), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(example: str, d, *args: str, client: str) -> str:
    proc = start(example, d, *args, client=client)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM, as a service manager stops it: it must exit 0."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return out, err


def test_the_producer_the_worker_and_the_operator_report(make_daemon):
    """Orders go in whole; the worker handles every item, fails the bad one until it
    is suspended, and stops on SIGTERM; the operator report finds the dead letter
    and requeues it."""
    d = make_daemon("max_deliveries = 2").start()
    produced = run("producer.py", d, "A1:apples,pears", "B2:failing", client="PROD").splitlines()
    assert [line.split()[0] for line in produced] == ["A1", "B2"]
    assert [len(line.split()) for line in produced] == [4, 3]  # items and the audit line
    worker = start("worker.py", d, client="WORK")
    assert [worker.stdout.readline().strip() for _ in range(2)] == ["A1 apples", "A1 pears"]
    failures = 0
    while failures < 2:  # B2 fails twice (max_deliveries): then it is a dead letter
        failures += "failed" in worker.stderr.readline()
    stop(worker)
    report = run("operator_report.py", d, "--requeue", client="OPER")
    with cqsclient.connect(d.address, client="LOOK") as c:
        (b2,) = c.structure("MSGQ01").browse("TRANX")
        assert b2.data == b"B2 failing" and b2.entry_id == int(produced[1].split()[1])
        assert f"suspended {b2.entry_id} from TRAN:TRANX after 2 deliveries" in report
        assert f"requeued {b2.entry_id} to TRAN:TRANX" in report
        assert "queue LTERM:AUDIT depth 2" in report


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_async_service_answers_under_each_backend(daemon, backend):
    """Requests in, replies out on the queues they name; SIGTERM stops it cleanly."""
    service = start("async_service.py", daemon, backend, client=f"SVC{backend[:3]}")
    assert service.stdout.readline().strip() == "serving"
    with cqsclient.connect(daemon.address, client="ASKER") as c:
        s = c.structure("MSGQ01")
        s.put_batch("TRANQ", [b"REPLY%s hello %d" % (backend[:3].encode(), i) for i in range(5)])
        replies = [s.read(f"REPLY{backend[:3]}", qtype="LTERM", wait=10) for _ in range(5)]
        assert sorted(m.data for m in replies) == [b"HELLO %d" % i for i in range(5)]
        stop(service)
        assert s.read("TRANQ") is None
