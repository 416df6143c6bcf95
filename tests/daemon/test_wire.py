"""Bad input from a raw socket gets a clear error or a close for that connection
only; the daemon carries on for everyone else."""

import os
import stat
import struct
import subprocess
import sys
import threading

import msgpack

from cqsd.server.connections import SEND_BUFFER

from .harness import Raw


def healthy(daemon) -> None:
    """Another client can still register, put and read."""
    other = Raw(daemon.socket)
    assert other.register(f"OK{os.getpid() % 1000}{len(daemon.lines)}")["ok"]
    assert other.request("put", structure="MSGQ01", queue="HEALTH", data=b"x")["ok"]
    assert other.request("read", structure="MSGQ01", queue="HEALTH")["ok"]
    other.request("deregister")
    other.close()


def test_socket_is_created_mode_0600(daemon):
    """Only the daemon's user may connect to the Unix socket."""
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600


def test_garbage_gets_an_error_and_a_close(daemon):
    """Bytes that are not a frame get INVALID_REQUEST with no id, then the connection closes."""
    raw = Raw(daemon.socket)
    raw.send(struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1")
    reply = raw.receive()
    assert reply["id"] is None and reply["reason"] == "INVALID_REQUEST"
    assert "msgpack" in reply["message"]
    assert raw.receive() is None
    healthy(daemon)


def test_non_map_frame_is_refused(daemon):
    """A frame holding a list instead of a map is refused by name."""
    raw = Raw(daemon.socket)
    body = msgpack.packb([1, 2, 3])
    raw.send(struct.pack(">I", len(body)) + body)
    assert "not a msgpack map" in raw.receive()["message"]
    healthy(daemon)


def test_oversized_frame_is_refused_before_its_body(make_daemon):
    """A frame larger than max_message is refused from its header alone."""
    d = make_daemon('max_message = "1KiB"').start()
    raw = Raw(d.socket)
    raw.register("BIG")
    raw.send(struct.pack(">I", 50 * 1024 * 1024))  # the body never comes
    reply = raw.receive()
    assert reply["reason"] == "MESSAGE_TOO_LARGE"
    assert raw.receive() is None
    healthy(d)


def test_message_over_max_message_is_too_large_but_connection_stays(make_daemon):
    """A put whose payload exceeds max_message fails with MESSAGE_TOO_LARGE only."""
    d = make_daemon('max_message = "1KiB"').start()
    raw = Raw(d.socket)
    raw.register("BIG")
    assert raw.request("put", structure="MSGQ01", queue="Q", data=b"x" * 2000)["reason"] == (
        "MESSAGE_TOO_LARGE"
    )
    assert raw.request("put", structure="MSGQ01", queue="Q", data=b"x" * 1000)["ok"]


def test_truncated_frame_then_close_leaves_others_alone(daemon):
    """A client that dies mid-frame costs nothing but its own connection."""
    raw = Raw(daemon.socket)
    raw.register("TRUNC")
    raw.send(struct.pack(">I", 100) + b"\x85")
    raw.close()
    healthy(daemon)


def test_wrong_field_types_name_the_field(daemon):
    """Wrong types get INVALID_REQUEST naming the field; the connection stays usable."""
    raw = Raw(daemon.socket)
    raw.register("TYPES")
    cases = [
        ({"structure": "MSGQ01", "queue": "Q", "data": "text"}, "'data' must be bytes"),
        ({"structure": "MSGQ01", "queue": 7, "data": b"x"}, "'queue' must be str"),
        ({"structure": "MSGQ01", "queue": "Q", "data": b"x", "recoverable": 1}, "'recoverable'"),
        ({"structure": "MSGQ01", "queue": "Q", "data": b"x", "qtype": "NOPE"}, "queue type"),
        ({"structure": "MSGQ01", "queue": "Q" * 16, "data": b"x"}, "queue name"),
        ({"structure": "MSGQ01", "queue": "Q", "data": b"x", "colour": 1},
         "unknown field 'colour'"),
        ({"queue": "Q", "data": b"x"}, "'structure' is required"),
    ]
    for fields, words in cases:
        reply = raw.request("put", **fields)
        assert reply["reason"] == "INVALID_REQUEST" and words in reply["message"], reply
    assert raw.request("delete", structure="MSGQ01", entry_id=True)["reason"] == "INVALID_REQUEST"
    assert raw.request("frobnicate")["message"] == "unknown op 'frobnicate'"
    raw.send(msgpack_frame({"op": "put"}))
    assert "request id" in raw.receive()["message"]
    assert raw.request("put", structure="MSGQ01", queue="Q", data=b"ok")["ok"]


def msgpack_frame(obj) -> bytes:
    body = msgpack.packb(obj)
    return struct.pack(">I", len(body)) + body


def test_a_deeply_nested_op_or_a_huge_id_costs_one_request(make_daemon):
    """An op nested a thousand deep, or a 300 KB id, gets INVALID_REQUEST quoting it
    briefly (both once stopped the daemon), and the daemon serves on."""
    d = make_daemon('max_message = "1KiB"').start()
    raw = Raw(d.socket)
    assert raw.register("NEST")["ok"]
    body = b"\x82\xa2id\x01\xa2op" + b"\x91" * 1000 + b"\xc0"
    raw.send(struct.pack(">I", len(body)) + body)
    reply = raw.receive()
    assert reply["reason"] == "INVALID_REQUEST" and len(reply["message"]) < 100
    raw.send(msgpack_frame({"id": b"\x00" * 300_000, "op": "put"}))
    reply = raw.receive()
    assert reply["reason"] == "INVALID_REQUEST" and len(reply["message"]) < 100
    healthy(d)


def test_pipelined_replies_keep_request_order(daemon):
    """Replies that wait for the log (recoverable puts) and replies that do not
    (non-recoverable puts, browses, errors), pipelined in one write, come back in
    request order, each put with its own entry id."""
    raw = Raw(daemon.socket)
    assert raw.register("ORDER")["ok"]
    frames, kinds = [], []
    for i in range(300):
        kind = ("logged", "plain", "browse", "error")[i % 4]
        fields = {"id": 1000 + i, "structure": "MSGQ01", "queue": "ORDERQ"}
        if kind == "browse":
            fields |= {"op": "browse", "qtype": "TRAN"}
        elif kind == "error":
            fields |= {"op": "put", "structure": "NOPE", "data": b"x"}
        else:
            fields |= {"op": "put", "data": b"%d" % i, "recoverable": kind == "logged"}
        frames.append(msgpack_frame(fields))
        kinds.append(kind)
    raw.send(b"".join(frames))
    replies = [raw.receive() for _ in frames]
    assert [r["id"] for r in replies] == [1000 + i for i in range(300)]
    assert [r["ok"] for r in replies] == [k != "error" for k in kinds]
    put_ids = [r["result"]["entry_id"] for r, k in zip(replies, kinds, strict=True)
               if k in ("logged", "plain")]
    assert put_ids == sorted(put_ids) and len(set(put_ids)) == 150


def test_a_flooding_client_does_not_hold_others_back(make_daemon):
    """Each connection gets one receive's worth of requests a turn: another
    client's request is served while a pipelined flood is still being worked
    through, not after it."""
    # the flood's replies are read only after the other client's: room to queue them
    daemon = make_daemon("send_queue = 100000").start()
    flood, other = Raw(daemon.socket), Raw(daemon.socket)
    assert flood.register("FLOOD")["ok"] and other.register("OTHER")["ok"]
    n = 40_000  # about 2.6 MB of requests: many turns' worth
    frames = b"".join(
        msgpack_frame({"id": 10 + i, "op": "put", "structure": "MSGQ01", "queue": "FLOODQ",
                       "data": b"f", "recoverable": False})
        for i in range(n)
    )
    sender = threading.Thread(target=flood.send, args=(frames,))
    sender.start()
    first = flood.receive()  # the daemon has begun on the flood
    reply = other.request("put", structure="MSGQ01", queue="OTHERQ", data=b"o",
                          recoverable=False)
    rest = [flood.receive() for _ in range(n - 1)]
    sender.join()
    assert [r["id"] for r in (first, *rest)] == [10 + i for i in range(n)]
    ids = [r["result"]["entry_id"] for r in (first, reply, rest[-1])]
    assert ids == sorted(ids) and len(set(ids)) == 3


def test_requests_before_register_are_refused(daemon):
    """Every op but register gets NOT_REGISTERED until the client registers."""
    raw = Raw(daemon.socket)
    assert raw.request("put", structure="MSGQ01", queue="Q", data=b"x")["reason"] == (
        "NOT_REGISTERED"
    )
    assert raw.register("LATE")["ok"]
    assert raw.register("AGAIN")["reason"] == "INVALID_REQUEST"


def test_unregistered_connection_is_closed_after_handshake_timeout(make_daemon):
    """A connection that never registers is closed after handshake_timeout."""
    d = make_daemon("handshake_timeout = 0.3").start()
    raw = Raw(d.socket)
    assert raw.receive() is None
    d.wait_for("handshake_timeout")


def test_client_that_reads_nothing_is_cut_off(make_daemon):
    """A client that stops reading is paused, not cut off; notifications piling up
    for it past send_queue cut it off; others carry on."""
    d = make_daemon('send_queue = 16\nlog_level = "debug"').start()
    raw, other = Raw(d.socket), Raw(d.socket)
    raw.register("SLOW")
    other.register("BUSY")
    for i in range(20):
        assert raw.request("register_interest", structure="MSGQ01", queue=f"N{i}")["ok"]
    raw.request("put", structure="MSGQ01", queue="BIG", data=b"x" * 60000)
    frame = msgpack_frame({"id": 1, "op": "browse", "structure": "MSGQ01", "queue": "BIG",
                           "qtype": "TRAN"})
    # more replies than the socket's buffer holds (the kernel doubles what is asked)
    raw.send(frame * (2 * SEND_BUFFER // 60000 + 10))  # reading pauses
    d.wait_for("reading_paused")
    for i in range(20):
        assert other.request("put", structure="MSGQ01", queue=f"N{i}", data=b"n")["ok"]
    [cut] = d.wait_for("client_cut_off")
    assert cut["client"] == "SLOW" and "too many replies" in cut["why"]
    healthy(d)


def test_connection_limit(make_daemon):
    """Connections past max_connections are told why and closed."""
    d = make_daemon("max_clients = 2\nmax_connections = 2").start()
    a, b = Raw(d.socket), Raw(d.socket)
    a.register("A")
    b.register("B")
    c = Raw(d.socket)
    assert c.receive()["reason"] == "CLIENT_LIMIT"


def test_client_limit_and_active_name(make_daemon):
    """max_clients bounds registrations; a name in use is CLIENT_ACTIVE."""
    d = make_daemon("max_clients = 2").start()
    a, b, c = Raw(d.socket), Raw(d.socket), Raw(d.socket)
    assert a.register("A")["ok"]
    assert b.register("A")["reason"] == "CLIENT_ACTIVE"
    assert b.register("B")["ok"]
    assert c.register("C")["reason"] == "CLIENT_LIMIT"


def test_a_deregistered_name_is_free_at_once(daemon):
    """Deregistering frees the client name before the connection is gone: here the
    old connection lingers with its replies unread while the name registers again."""
    old = Raw(daemon.socket)
    assert old.register("AGAIN")["ok"]
    assert old.request("put", structure="MSGQ01", queue="BIG", data=b"x" * 60000)["ok"]
    browse = {"op": "browse", "structure": "MSGQ01", "queue": "BIG", "qtype": "TRAN"}
    old.send(b"".join(msgpack_frame({"id": 100 + i, **browse}) for i in range(20))
             + msgpack_frame({"id": 200, "op": "deregister"}))
    daemon.wait_for("deregister")
    assert Raw(daemon.socket).register("AGAIN")["ok"]


def test_secrets_are_checked(make_daemon):
    """With [[client]] entries only those names register, and only with their secret."""
    digest = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"  # "secret"
    d = make_daemon(extra=f'[[client]]\nname = "IMS1"\nsecret_sha256 = "{digest}"\n').start()
    assert Raw(d.socket).register("IMS1", secret="wrong")["reason"] == "NOT_AUTHORIZED"
    assert Raw(d.socket).register("IMS2", secret="secret")["reason"] == "NOT_AUTHORIZED"
    assert Raw(d.socket).register("IMS1")["reason"] == "NOT_AUTHORIZED"
    assert Raw(d.socket).register("IMS1", secret="secret")["ok"]


def run_cqsd(*args):
    return subprocess.run([sys.executable, "-m", "cqsd", "run", *args],
                          capture_output=True, text=True, timeout=60)


def test_bad_config_gives_readable_errors_and_touches_nothing(tmp_path):
    """A bad config names each key at fault, exits 2 and creates no data."""
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[daemon]\ndata_dir = "{tmp_path / "data"}"\nmax_clients = "many"\n'
                   '[[structure]]\nname = "Q1"\nsize = "1MiB"\ninitsize = "2MiB"\nsise = 3\n')
    result = run_cqsd("--config", str(cfg))
    assert result.returncode == 2
    assert "daemon.max_clients" in result.stderr
    assert "structure[0].initsize" in result.stderr
    assert "sise" in result.stderr and "did you mean 'size'" in result.stderr
    assert not (tmp_path / "data").exists()
    missing = run_cqsd("--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "nope.toml" in missing.stderr


def test_second_daemon_on_the_same_data_dir_is_refused(daemon):
    """A data directory held by a live daemon is refused with a clear error."""
    result = run_cqsd("--config", str(daemon.config))
    assert result.returncode == 1
    assert "in use by a live daemon" in result.stderr
    healthy(daemon)


def test_corrupt_image_is_refused_by_name(make_daemon):
    """A damaged clean-shutdown image stops the start, naming the file, and is kept."""
    d = make_daemon().start()
    raw = Raw(d.socket)
    raw.register("IMG")
    raw.request("put", structure="MSGQ01", queue="Q", data=b"keep me")
    raw.close()
    assert d.stop() == 0
    img = d.dir / "data" / "images" / "MSGQ01.img"
    data = bytearray(img.read_bytes())
    data[-3] ^= 0xFF
    img.write_bytes(bytes(data))
    result = run_cqsd("--config", str(d.config))
    assert result.returncode == 1 and "MSGQ01.img" in result.stderr
    assert img.exists()


def test_daemon_survives_every_error(daemon):
    """After all of the above kinds of abuse in one daemon, it still serves."""
    for payload in [b"\x00\x00\x00\x00", b"\xff" * 8, msgpack_frame({"id": "x"})]:
        raw = Raw(daemon.socket)
        raw.send(payload)
        raw.close()
    healthy(daemon)
    assert daemon.proc.poll() is None


def test_bad_commit_operations_are_named(daemon):
    """Each operation of a commit is checked like a request, and named by its index."""
    raw = Raw(daemon.socket)
    raw.register("COMMIT")
    for ops, words in [
        ([{"op": "put", "queue": "Q", "data": "text"}], "ops[0] (put): field 'data'"),
        ([{"op": "put", "queue": "Q", "data": b"x"}, 7], "ops[1] must be a map"),
        ([{"op": "put", "queue": "Q", "data": b"x", "extra": 1}], "unknown field 'extra'"),
        ([{"op": "explode"}], "ops[0] must be a map with op put"),
        ([{"op": "put", "queue": "Q", "data": b"x"},  # a unit of work across pairs
          {"op": "put", "structure": "EMHQ01", "queue": "Q", "data": b"x"}],
         "ops[1] names structure 'EMHQ01': a unit of work spans one structure pair"),
    ]:
        reply = raw.request("commit", structure="MSGQ01", ops=ops)
        assert reply["reason"] == "INVALID_REQUEST" and words in reply["message"], reply
    assert raw.request("commit", structure="MSGQ01",
                       ops=[{"op": "put", "queue": "Q", "data": b"ok"}])["ok"]
