"""The monitoring listener against a real daemon under load: Prometheus /metrics has
the families an operator graphs, in valid text format, and /healthz needs no client
slot."""

import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import cqsclient

from .harness import STRUCTURES, free_port

FAMILIES = {
    "cqsd_queue_depth", "cqsd_queue_locked", "cqsd_locks_in_flight", "cqsd_redeliveries",
    "cqsd_suspends", "cqsd_puts", "cqsd_reads", "cqsd_deletes", "cqsd_fsync_seconds",
    "cqsd_fsync_records", "cqsd_structure_fullness_ratio", "cqsd_overflow_mode",
    "cqsd_checkpoint_age_seconds", "process_cpu_seconds",
    "process_resident_memory_bytes", "cqsd_clients", "cqsd_log_bytes",
}
WORKERS, MESSAGES = 4, 300


def scrape(port, path="/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.status, r.read().decode()


def samples(text):
    """{(name, frozenset(labels)): value} of a Prometheus text page."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def work(address, n, errors):
    """Put ``MESSAGES`` and read them back, failing every third delivery once (it comes
    back), then fail one more message twice (max_deliveries = 2: it is suspended)."""
    try:
        with cqsclient.connect(address, client=f"W{n}") as c:
            s = c.structure("MSGQ01")
            s.put_batch(f"LOAD{n}", [b"x" * 100] * MESSAGES)
            for i in range(MESSAGES):
                m = s.read(f"LOAD{n}")
                if i % 3 == 0:
                    s.unlock(m.entry_id, failed=True)
                    m = s.read(f"LOAD{n}")
                s.delete(m.entry_id)
            s.put(f"SUSP{n}", b"poison")
            for _ in range(2):
                s.unlock(s.read(f"SUSP{n}").entry_id, failed=True)
    except Exception as err:  # reported by the test
        errors.append(err)


def test_metrics_under_load(make_daemon):
    """While four clients put, read, fail and delete, every scrape parses and has the
    families; afterwards the counters add up and the queues are empty."""
    port = free_port()
    d = make_daemon(f'metrics_listen = "127.0.0.1:{port}"\nmax_deliveries = 2').start()
    with cqsclient.connect(d.address, client="HELD") as held:
        held.structure("MSGQ01").put("HELDQ", b"locked")
        held.structure("MSGQ01").read("HELDQ")
        errors: list[Exception] = []
        workers = [threading.Thread(target=work, args=(d.address, n, errors))
                   for n in range(WORKERS)]
        for w in workers:
            w.start()
        scrapes = 0
        while any(w.is_alive() for w in workers) or scrapes == 0:
            status, text = scrape(port)
            assert status == 200
            assert FAMILIES <= {f.name for f in text_string_to_metric_families(text)}
            scrapes += 1
        for w in workers:
            w.join()
        assert not errors, errors
        got = samples(scrape(port)[1])
    mine = frozenset({("structure", "MSGQ01")})
    total = WORKERS * MESSAGES
    assert got[("cqsd_puts_total", mine)] == total + WORKERS + 1
    assert got[("cqsd_deletes_total", mine)] == total
    assert got[("cqsd_redeliveries_total", mine)] == WORKERS * ((MESSAGES + 2) // 3 + 1)
    assert got[("cqsd_suspends_total", mine)] == WORKERS
    assert got[("cqsd_locks_in_flight", mine)] == 1  # HELD's
    held_q = frozenset({("structure", "MSGQ01"), ("qtype", "TRAN"), ("queue", "HELDQ")})
    assert got[("cqsd_queue_locked", held_q)] == 1
    assert got[("cqsd_fsync_seconds_count", frozenset())] >= 1
    assert got[("cqsd_fsync_records_sum", frozenset())] >= total / 100  # a few batches
    assert got[("process_resident_memory_bytes", frozenset())] > 10_000_000
    assert scrapes >= 1


def test_healthz_needs_no_client_slot(make_daemon):
    """/healthz answers 200 while every client slot is taken; unknown paths get 404."""
    port = free_port()
    d = make_daemon(f'metrics_listen = "127.0.0.1:{port}"\nmax_clients = 1').start()
    with cqsclient.connect(d.address, client="ONLY"):
        status, body = scrape(port, "/healthz")
        assert status == 200 and '"ready"' in body
    try:
        scrape(port, "/nothing")
    except urllib.error.HTTPError as err:
        assert err.code == 404
    else:
        raise AssertionError("/nothing answered")


def test_names_pass_promtool_and_backlog_age_and_delays_are_there(make_daemon):
    """A scrape with every family filled in (queues, a delayed put, a data set) passes
    ``promtool check metrics`` (the Prometheus naming rules: units, _total, _ratio);
    the oldest ready message's age grows with the clock; delayed puts are counted."""
    port = free_port()
    structures = STRUCTURES.replace('overflow = "MSGQ01OV"',
                                    'overflow = "MSGQ01OV"\noffload = "smds"')
    d = make_daemon(f'metrics_listen = "127.0.0.1:{port}"', structures=structures).start()
    with cqsclient.connect(d.address, client="APP") as c:
        s = c.structure("MSGQ01")
        before = time.time()
        s.put("BACKLOG", b"waiting")
        s.put("BACKLOG", b"x" * 300_000)  # offloaded to APP's data set
        s.put("LATER", b"not yet", delay=3600)
        text = scrape(port)[1]
        elapsed = time.time() - before
    check = subprocess.run([shutil.which("promtool") or "/usr/bin/promtool", "check",
                            "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    got = samples(text)
    backlog = frozenset({("structure", "MSGQ01"), ("qtype", "TRAN"), ("queue", "BACKLOG")})
    later = frozenset({("structure", "MSGQ01"), ("qtype", "TRAN"), ("queue", "LATER")})
    assert 0 <= got[("cqsd_queue_oldest_age_seconds", backlog)] <= elapsed + 0.01
    assert got[("cqsd_queue_delayed", later)] == 1 and got[("cqsd_queue_delayed", backlog)] == 0
    assert got[("cqsd_queue_oldest_age_seconds", later)] == 0  # nothing ready there
    mine = frozenset({("structure", "MSGQ01"), ("owner", "APP")})
    assert 0 < got[("cqsd_smds_used_ratio", mine)] < 1
    assert got[("cqsd_smds_size_bytes", mine)] > 0
    assert got[("cqsd_node_fenced", frozenset())] == 0
    assert not any(name.startswith("cqsd_process_") for name, _ in got)
    assert got[("process_open_fds", frozenset())] > 0
