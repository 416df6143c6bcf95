"""What the live fuzzer (test_fuzz.py) found, each kept as the request sequence
that showed it."""

from cqsproto import encode_frame

from .harness import Raw

MiB = 1024 * 1024
PAIR = '''[[structure]]
name = "MSGQ01"
size = "48MiB"
initsize = "24MiB"
overflow = "MSGQ01OV"

[[structure]]
name = "MSGQ01OV"
size = "40MiB"
'''


def test_a_purge_after_a_read_answers_without_another_request(daemon):
    """A read's lock record starts no fsync; a purge waits for the log's end to be
    durable, and starts the fsync itself instead of hanging until another request does."""
    r = Raw(daemon.socket)
    r.register("A")
    assert r.request("put", structure="SMALL", queue="Q", data=b"m")["ok"]
    assert r.request("read", structure="SMALL", queue="Q")["ok"]
    r.sock.settimeout(10)
    assert r.request("delete_structure", structure="SMALL", force=True)["ok"]


def test_a_waiting_read_gets_a_put_pipelined_behind_it(daemon):
    """A read with wait, then a put in the same write: the read is parked before the
    put is handled, so the put serves it."""
    r = Raw(daemon.socket)
    r.register("A")
    r.send(encode_frame({"id": 10, "op": "read", "structure": "SMALL", "queue": "Q",
                         "wait": 30})
           + encode_frame({"id": 11, "op": "put", "structure": "SMALL", "queue": "Q",
                           "data": b"m"}))
    assert r.receive()["id"] == 11
    read = r.receive()
    assert read["ok"] and read["result"]["messages"][0]["data"] == b"m"


def test_overflow_moves_of_large_recoverable_messages_stay_within_a_record(make_daemon):
    """Messages of 15 and 2 MiB, each within a record, move to the overflow structure
    in batches whose records the log takes: the daemon serves on."""
    d = make_daemon(structures=PAIR).start()
    r = Raw(d.socket)
    r.register("A")
    r.sock.settimeout(30)
    for n in (15, 2, 15, 2, 2):  # 17 MiB reach the threshold at SIZE: moves begin
        reply = r.request("put", structure="MSGQ01", queue="Q", data=b"x" * (n * MiB))
        assert reply is not None and reply["ok"], reply
    d.wait_for("overflow_moved")
    assert r.request("query", kind="structures")["ok"]
    assert d.proc.poll() is None and not d.events("log_record_refused")
