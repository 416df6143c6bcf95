"""Resource abuse: a client that reads none of its replies is paused, then served
in order; slow writers and half-open peers are cut off by their deadlines;
connections past max_connections are refused; the daemon's memory stays bounded
and everyone else is served throughout."""

import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

import pytest

from cqsd.server.connections import SEND_BUFFER
from cqsproto import FrameDecoder

from .harness import Raw, free_port
from .test_network import CLIENT, SECRET, tls_files
from .test_wire import healthy, msgpack_frame

PIPELINED = 10_000
PAUSING = 'send_queue_bytes = "1MiB"\nlog_level = "debug"'  # reading pauses at 256 KiB


def rss(daemon) -> int:
    """The daemon process's resident memory, in bytes."""
    with open(f"/proc/{daemon.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def browses(n: int) -> bytes:
    """``n`` pipelined browses of queue BIG, ids 100 on."""
    return b"".join(msgpack_frame({"id": 100 + i, "op": "browse", "structure": "MSGQ01",
                                   "queue": "BIG", "qtype": "TRAN"}) for i in range(n))


def browses_and_puts(n: int) -> bytes:
    """``n`` pipelined requests, ids 100 on: browses of queue BIG and puts of 1 KiB,
    taking turns (several MB: more than the kernel and the daemon's reader hold)."""
    put = {"op": "put", "structure": "MSGQ01", "queue": "SIDE", "data": b"p" * 1024,
           "recoverable": False}
    return b"".join(msgpack_frame({"id": 100 + i, "op": "browse", "structure": "MSGQ01",
                                   "queue": "BIG", "qtype": "TRAN"} if i % 2 == 0 else
                                  {"id": 100 + i, **put}) for i in range(n))


def served_in_order(client: Raw, n: int, payload: int, every: int = 1) -> None:
    """The ``n`` replies come, in order, every ``every``-th a browse with the message."""
    replies = [client.receive() for _ in range(n)]
    assert [r["id"] for r in replies] == [100 + i for i in range(n)]
    assert all(r["ok"] for r in replies)
    assert all(len(r["result"]["messages"][0]["data"]) == payload for r in replies[::every])


def served_as_usual(other: Raw) -> None:
    """Another client's 200 puts and reads all succeed."""
    for _ in range(200):
        assert other.request("put", structure="MSGQ01", queue="OTHERQ", data=b"o")["ok"]
        assert other.request("read", structure="MSGQ01", queue="OTHERQ")["ok"]


def test_a_client_that_reads_no_replies_is_paused_then_served_in_order(make_daemon):
    """10,000 pipelined requests whose replies go unread stop being read once 256 KiB
    of replies waits, the daemon's memory stays bounded while another client is
    served as usual, and once the client reads, every reply comes, in order."""
    d = make_daemon(PAUSING).start()
    flood, other = Raw(d.socket), Raw(d.socket)
    assert flood.register("PIPE")["ok"] and other.register("OTHER")["ok"]
    assert flood.request("put", structure="MSGQ01", queue="BIG", data=b"b" * 10_000)["ok"]
    before = rss(d)
    sender = threading.Thread(target=flood.send, args=(browses_and_puts(PIPELINED),))
    sender.start()
    d.wait_for("reading_paused")
    served_as_usual(other)
    assert sender.is_alive(), "the daemon went on taking the unread client's requests"
    grown = rss(d) - before
    assert grown < 30 * 1024 * 1024, f"the daemon grew by {grown} bytes"  # unpaused: 55 MB
    served_in_order(flood, PIPELINED, 10_000, every=2)
    sender.join()
    assert d.events("reading_resumed")
    assert flood.request("put", structure="MSGQ01", queue="AFTER", data=b"a")["ok"]


class TlsRaw(Raw):
    """Raw, over TLS (one thread: an SSL socket cannot send and receive at once)."""

    def __init__(self, port: int, cafile: str) -> None:
        context = ssl.create_default_context(cafile=cafile)
        self.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), 10),
                                        server_hostname="127.0.0.1")
        self.sock.settimeout(10)
        self.decoder = FrameDecoder()
        self.next_id = 1


def test_a_tls_client_that_reads_no_replies_is_paused_too(make_daemon, tmp_path):
    """Over TLS, where a reader task reads each connection, reading pauses the same
    way and resumes with the requests already received."""
    cert, key = tls_files(tmp_path)
    port = free_port()
    d = make_daemon(f'{PAUSING}\ntcp = "127.0.0.1:{port}"\ntls_cert = "{cert}"\n'
                    f'tls_key = "{key}"', extra=CLIENT).start()
    flood = TlsRaw(port, str(cert))
    assert flood.register("IMS1", secret=SECRET)["ok"]
    assert flood.request("put", structure="MSGQ01", queue="BIG", data=b"b" * 200_000)["ok"]
    before = rss(d)
    flood.send(browses(300))  # small enough to be sent whole: the daemon holds them
    d.wait_for("reading_paused")
    other = Raw(d.socket)
    assert other.register("IMS1", secret=SECRET)["reason"] == "CLIENT_ACTIVE"  # yet served
    grown = rss(d) - before
    assert grown < 25 * 1024 * 1024, f"the daemon grew by {grown} bytes"  # unpaused: 60 MB
    served_in_order(flood, 300, 200_000)
    assert d.events("reading_resumed")


def test_waiting_reads_count_towards_pausing(make_daemon):
    """A client's waiting reads are bounded like its unsent replies: with send_queue
    64, reading pauses at 16 of them; when they are served it resumes, and every
    read is served."""
    d = make_daemon('send_queue = 64\nlog_level = "debug"').start()
    reader, writer = Raw(d.socket), Raw(d.socket)
    assert reader.register("WAITER")["ok"] and writer.register("PUTTER")["ok"]
    read = {"op": "read", "structure": "MSGQ01", "queue": "LATER", "wait": 30}
    reader.send(b"".join(msgpack_frame({"id": 100 + i, **read}) for i in range(100)))
    [paused] = d.wait_for("reading_paused")
    assert (paused["client"], paused["deferred"], paused["unsent_frames"]) == ("WAITER", 16, 0)
    for i in range(100):
        assert writer.request("put", structure="MSGQ01", queue="LATER", data=b"%d" % i)["ok"]
    replies = [reader.receive() for _ in range(100)]
    assert sorted(r["id"] for r in replies) == [100 + i for i in range(100)]
    assert all(r["ok"] for r in replies)


def test_a_client_that_reads_nothing_is_cut_off_after_send_timeout(make_daemon):
    """A client whose replies the daemon cannot send for send_timeout is cut off."""
    d = make_daemon("send_timeout = 0.5").start()
    raw = Raw(d.socket)
    raw.register("DEAF")
    raw.request("put", structure="MSGQ01", queue="BIG", data=b"x" * 60000)
    frame = msgpack_frame({"id": 1, "op": "browse", "structure": "MSGQ01", "queue": "BIG",
                           "qtype": "TRAN"})
    raw.send(frame * (2 * SEND_BUFFER // 60000 + 20))  # more than the socket buffer holds
    [cut] = d.wait_for("client_cut_off")
    assert cut["client"] == "DEAF" and "send_timeout" in cut["why"]
    healthy(d)


def trickle(sock: socket.socket, data: bytes, every: float) -> None:
    """Send ``data`` a byte at a time, ``every`` seconds apart, until the peer hangs up."""
    try:
        for i in range(len(data)):
            sock.send(data[i:i + 1])
            time.sleep(every)  # the pace under test, not a synchronisation
    except OSError:
        pass


def test_a_byte_a_second_writer_is_cut_off(make_daemon):
    """A registered client that trickles a request frame is cut off once the frame
    has taken frame_timeout, though a byte comes more often than that."""
    d = make_daemon("frame_timeout = 1").start()
    raw = Raw(d.socket)
    raw.register("TRICKLE")
    frame = msgpack_frame({"id": 7, "op": "put", "structure": "MSGQ01", "queue": "Q",
                           "data": b"t" * 100})
    writer = threading.Thread(target=trickle, args=(raw.sock, frame, 0.2), daemon=True)
    writer.start()
    [cut] = d.wait_for("client_cut_off")
    assert cut["client"] == "TRICKLE" and "frame_timeout" in cut["why"]
    assert raw.receive() is None
    healthy(d)


def test_a_half_sent_frame_is_cut_off(make_daemon):
    """A client that stops half-way through a frame is cut off after frame_timeout,
    and whole frames before it are served."""
    d = make_daemon("frame_timeout = 0.5").start()
    raw = Raw(d.socket)
    raw.register("HALF")
    whole = msgpack_frame({"id": 5, "op": "put", "structure": "MSGQ01", "queue": "Q",
                           "data": b"w", "recoverable": False})
    raw.send(whole + whole[:7])
    assert raw.receive()["id"] == 5
    [cut] = d.wait_for("client_cut_off")
    assert cut["client"] == "HALF" and "frame_timeout" in cut["why"]
    assert raw.receive() is None


def test_an_unregistered_peer_cannot_send_a_large_frame(daemon):
    """Before its register reply a peer's frames are at most 64 KiB: a larger one is
    refused from its header, so unregistered peers hold little memory."""
    raw = Raw(daemon.socket)
    raw.send(struct.pack(">I", 65 * 1024) + b"\x80")
    reply = raw.receive()
    assert reply["reason"] == "MESSAGE_TOO_LARGE" and raw.receive() is None
    registered = Raw(daemon.socket)
    assert registered.register("BIGPUT")["ok"]
    assert registered.request("put", structure="MSGQ01", queue="Q", data=b"x" * 200_000)["ok"]


def test_a_connection_flood_is_refused_and_others_are_served(make_daemon):
    """Connections past max_connections get CLIENT_LIMIT at once, memory stays
    bounded, a registered client is served throughout, and the slots come back."""
    d = make_daemon("max_clients = 8\nmax_connections = 8").start()
    other = Raw(d.socket)
    assert other.register("OTHER")["ok"]
    held = [Raw(d.socket) for _ in range(7)]
    for i, raw in enumerate(held):
        assert raw.register(f"HELD{i}")["ok"]
    before = rss(d)
    for round_ in range(10):
        flood = [Raw(d.socket) for _ in range(50)]
        assert {f.receive()["reason"] for f in flood} == {"CLIENT_LIMIT"}
        assert {f.receive() for f in flood} == {None}
        for f in flood:
            f.close()
        assert other.request("put", structure="MSGQ01", queue="Q", data=b"%d" % round_)["ok"]
    assert rss(d) - before < 10 * 1024 * 1024
    for raw in held:
        raw.close()
    d.wait_for("connection_lost", 7)
    healthy(d)


def test_connections_past_the_limit_that_close_at_once_do_not_stop_the_daemon(make_daemon):
    """A peer that is gone before its CLIENT_LIMIT refusal is sent costs only its own
    connection (the refusal's failed send once stopped the daemon)."""
    d = make_daemon("max_clients = 2\nmax_connections = 2").start()
    a, b = Raw(d.socket), Raw(d.socket)
    assert a.register("A")["ok"] and b.register("B")["ok"]
    for _ in range(200):
        gone = socket.socket(socket.AF_UNIX)
        gone.connect(d.socket)
        gone.close()
    late = Raw(d.socket)  # behind the 200 in the daemon's accept queue
    assert late.receive()["reason"] == "CLIENT_LIMIT"
    assert a.request("put", structure="MSGQ01", queue="Q", data=b"still here")["ok"]
    assert d.proc.poll() is None


NETNS_HOLDER = "ip link set lo up && echo up && exec sleep 600"
HALF_OPEN_CLIENT = """
import sys, cqsclient
c = cqsclient.connect(sys.argv[1], client="IMS1", secret=sys.argv[2])
print("registered", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def netns():
    """A network namespace of its own (loopback only), entered with nsenter."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.fail("util-linux unshare and nsenter are needed for the half-open test")
    holder = subprocess.Popen(["unshare", "-rn", "sh", "-c", NETNS_HOLDER],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "up"
    yield ("nsenter", "-t", str(holder.pid), "-U", "-n", "--preserve-credentials")
    holder.send_signal(signal.SIGKILL)
    holder.wait()


def test_a_half_open_tcp_peer_is_dropped(make_daemon, netns):
    """A TCP peer that vanishes without a close (here its network goes down) is
    dropped once keepalive probes go unanswered, and its name is free again."""
    port = free_port()
    d = make_daemon(f'tcp = "127.0.0.1:{port}"\ntcp_keepalive = 1', extra=CLIENT,
                    prefix=netns).start()
    client = subprocess.Popen([*netns, sys.executable, "-c", HALF_OPEN_CLIENT,
                               f"tcp://127.0.0.1:{port}", SECRET],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "registered"
        subprocess.run([*netns, "ip", "link", "set", "lo", "down"], check=True)
        [lost] = d.wait_for("connection_lost")
        assert lost["client"] == "IMS1"
        assert Raw(d.socket).register("IMS1", secret=SECRET)["ok"]  # the daemon still serves
    finally:
        client.kill()
        client.wait()


@pytest.mark.parametrize("open_files", [120, 121])  # one of them runs out at the duplicate
def test_a_daemon_out_of_file_descriptors_refuses_connections_and_carries_on(
        make_daemon, open_files):
    """With fewer open files allowed than max_connections needs, the daemon says so
    at start; a flood past the limit gets connections refused (accept fails, or the
    poller's duplicate of an accepted one does), never the daemon stopped, and once
    the flood is gone it serves again."""
    if shutil.which("prlimit") is None:
        pytest.fail("util-linux prlimit is needed for the file descriptor test")
    d = make_daemon("max_connections = 100",
                    prefix=("prlimit", f"--nofile={open_files}:{open_files}")).start()
    [low] = d.events("open_files_limit_low")
    assert (low["limit"], low["max_connections"]) == (open_files, 100)
    flood = []
    for _ in range(200):
        s = socket.socket(socket.AF_UNIX)
        s.connect(d.socket)  # the kernel queues what the daemon cannot accept yet
        flood.append(s)
    d.wait_until(lambda: d.events("connection_refused") or any(
        "EMFILE" in e.get("text", "") for e in d.events("text")), "running out of files")
    for s in flood:
        s.close()
    for _ in range(100):  # each try waits in the kernel's queue until the daemon answers
        reply = Raw(d.socket).register("PATIENT")
        if reply is not None and reply["ok"]:
            break
        assert reply is None or reply["reason"] == "CLIENT_LIMIT"  # still out of files
    else:
        raise AssertionError("the daemon did not serve again once the flood was gone")
    assert d.proc.poll() is None
