"""Instructions (and system calls) the daemon spends on one message of the plain
pattern (issue 30), counted rather than timed, so that the machine's load does
not move the figure.

The workload drives the real ``Daemon`` (cqsd/server) in this process, on a
data directory in /dev/shm: ``--sessions`` connections over socket pairs, each
server end handed to ``Connections.serve_connection``, so that requests go the
way a client's do (the poller's epoll, ``Connections.handle``, dispatch,
settle, the journal and its flusher, the replies' non-blocking sends). Half the
sessions put, half read and delete, the pattern most applications write: per
cycle each producer puts one recoverable message (1 KiB by default) and all
wait for their replies (one poller round, the flush), then each consumer reads
one with a lock (``wait`` given, as ``cqsclient`` does) and deletes it, each
its own request (the delete durable, the flush). This imports server internals
(``Daemon``, its ``connections`` and ``journal``), and it sets two things the
daemon would choose by itself, so that each run takes the same path: the fsync
runs inline (``--fsync thread``: always in the fsync thread, syncthread.py),
and Trio's scheduler is seeded.

Figures are differences of two runs, so that start-up, recovery and shutdown
cancel: one of W + M cycles against one of W + W, divided by the messages the
extra M - W cycles moved. What the harness's own client side costs (frames
sent from templates, replies unpacked with msgpack) stays in the figure; it is
small and unchanged by the daemon's code.

    nice -n 10 .venv/bin/python benchmarks/instructions.py              # Ir a message
    nice -n 10 .venv/bin/python benchmarks/instructions.py --top 25     # and C functions
    nice -n 10 .venv/bin/python benchmarks/instructions.py --syscalls   # strace -c
    nice -n 10 .venv/bin/python benchmarks/instructions.py --profile 30 # cProfile, in process

``--profile`` runs in process under cProfile (CPU time of the thread), and
prints each Python function's calls a message (exact) and its share of the
profiled time (approximate: cProfile's own cost weighs on small functions).
"""

import argparse
import cProfile
import json
import os
import pstats
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import trio
import trio.lowlevel
import trio.testing
from _procs import callgrind_total

ROOT = Path(__file__).resolve().parent.parent
STRUCTURE = "MSGQ01"
QUEUE = "PLAIN"
READ_WAIT = 5.0
CONFIG = """
[daemon]
data_dir = "{dir}/data"
socket = "{dir}/s"
max_clients = {clients}
log_level = "info"
checkpoint_interval = 0
checkpoint_log_volume = 0
[[structure]]
name = "MSGQ01"
size = "256MiB"
"""


def frame(body: dict) -> bytes:
    packed = msgpack.packb(body, use_bin_type=True)
    return len(packed).to_bytes(4, "big") + packed


class Client:
    """One session's client end: sends prepared frames, awaits one reply at a time."""

    calls = {"sendto": 0, "recvfrom": 0}  # the harness's own system calls, every session's

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def send(self, data: bytes) -> None:
        Client.calls["sendto"] += 1
        self.sock.sendall(data)  # small frames into an empty socket buffer: never blocks

    async def reply(self) -> dict:
        while len(self.buffer) < 4 or len(self.buffer) < 4 + int.from_bytes(self.buffer[:4]):
            try:
                Client.calls["recvfrom"] += 1
                got = self.sock.recv(1 << 20)
            except BlockingIOError:  # not there yet: the daemon's turn
                await trio.lowlevel.wait_readable(self.sock)
                continue
            if not got:
                raise SystemExit("the daemon closed a session")
            self.buffer += got
        n = 4 + int.from_bytes(self.buffer[:4])
        body, self.buffer = self.buffer[4:n], self.buffer[n:]
        reply = msgpack.unpackb(body, raw=False)
        if not reply.get("ok"):
            raise SystemExit(f"request failed: {reply}")
        return reply["result"]


async def workload(cycles: int, sessions: int, size: int, warm: int = 0,
                   profile: cProfile.Profile | None = None, waiting: bool = False) -> None:
    """``warm`` cycles, then ``cycles`` more (under ``profile`` if given); ``waiting``:
    each cycle's reads are sent first, and wait in the daemon for the puts."""
    from cqsd import logs
    from cqsd.config import loads
    from cqsd.server.daemon import Daemon
    from cqsproto import PROTOCOL_VERSION

    where = Path(tempfile.mkdtemp(prefix="cqsd-ir-", dir="/dev/shm"))
    try:
        config = loads(CONFIG.format(dir=where, clients=sessions + 1))
        sink = logs.configure("info", str(where / "daemon.log"))
        daemon = Daemon(config, sink)
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            assert daemon.connections is not None
            clients = []
            for i in range(sessions):
                ours, theirs = socket.socketpair()
                ours.setblocking(False)
                nursery.start_soon(daemon.connections.serve_connection,
                                   trio.SocketStream(trio.socket.from_stdlib_socket(theirs)),
                                   False)
                c = Client(ours)
                c.send(frame({"id": 1, "op": "register", "client": f"IR{i}",
                              "version": PROTOCOL_VERSION}))
                await c.reply()
                clients.append(c)
            producers, consumers = clients[: sessions // 2], clients[sessions // 2:]
            data = random.Random(30).randbytes(size)
            put = frame({"id": 2, "op": "put", "structure": STRUCTURE, "queue": QUEUE,
                         "qtype": "TRAN", "data": data, "recoverable": True})
            read = frame({"id": 3, "op": "read", "structure": STRUCTURE, "queue": QUEUE,
                          "qtype": "TRAN", "n": 1, "wait": READ_WAIT})
            for i in range(warm + cycles):
                if i == warm and profile is not None:
                    profile.enable()
                if waiting:  # the reads wait in the daemon, and the puts wake them
                    for c in consumers:
                        c.send(read)
                    await trio.testing.wait_all_tasks_blocked()
                for p in producers:
                    p.send(put)
                for p in producers:
                    await p.reply()
                if not waiting:
                    for c in consumers:
                        c.send(read)
                held = [(await c.reply())["messages"][0]["entry_id"] for c in consumers]
                for c, entry_id in zip(consumers, held, strict=True):
                    c.send(frame({"id": 4, "op": "delete", "structure": STRUCTURE,
                                  "entry_id": entry_id}))
                for c in consumers:
                    await c.reply()
            if profile is not None:
                profile.disable()
            daemon.stop("end of the workload")
    finally:
        shutil.rmtree(where, ignore_errors=True)


def run_once(args) -> None:
    """The workload in this process (what the counting modes run, twice)."""
    from cqsd.server import journal

    journal.INLINE_FSYNC = float("inf") if args.fsync == "inline" else -1.0
    trio._core._run._r.seed(30)  # the scheduler's batch order: the same every run
    profile = None
    if args.profile:
        profile = cProfile.Profile(time.thread_time)
    trio.run(workload, args.cycles, args.sessions, args.size, args.warm, profile, args.waiting)
    if args.client_calls:
        args.client_calls.write_text(json.dumps(Client.calls))
    if profile is not None:
        report_profile(profile, args.cycles * (args.sessions // 2), args.profile)


# Where a message goes, by the inclusive time of the function that does each part
# (they nest: the poller's pass holds decode, parse, the handler, settle and replies).
PHASES = [
    ("poller pass (recv, decode, dispatch, the round's write)", "cqsd/server/poller.py", "_round"),
    ("  decode (FrameDecoder.next_frame)", "cqsproto/codec.py", "next_frame"),
    ("  dispatch (parse, handler, settle, reply)", "cqsd/server/dispatch.py", "dispatch"),
    ("    parse (requests.parse)", "cqsproto/requests.py", "parse"),
    ("    handler: put", "cqsd/server/handlers.py", "op_put"),
    ("    handler: read", "cqsd/server/handlers.py", "op_read"),
    ("    handler: delete", "cqsd/server/handlers.py", "op_delete"),
    ("    settle (notifications, waiters, record)", "cqsd/server/dispatch.py", "_settle"),
    ("      log append (split, journal)", "cqsd/server/dispatch.py", "_log"),
    ("    reply (encode, send or queue)", "cqsd/server/session.py", "reply"),
    ("  round's lock records written", "cqsd/server/journal.py", "write_deferred"),
    ("flusher (write, fsync, release replies)", "cqsd/server/journal.py", "run"),
    ("  records encoded and written", "logstream/writer.py", "append_batch"),
    ("  fsync", "logstream/writer.py", "flush"),
    ("  replies released and sent", "cqsd/server/journal.py", "_wake"),
    ("the harness's client side", "benchmarks/instructions.py", "reply"),
]


def report_profile(profile: cProfile.Profile, messages: int, top: int) -> None:
    stats = pstats.Stats(profile)
    rows = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for _cc, _nc, tt, _ct, _callers in rows.values())
    print(f"{'cum %':>6}  part of a message (cProfile, inclusive)")
    for label, where, function in PHASES:
        cum = sum(ct for (path, _line, name), (_cc, _nc, _tt, ct, _c) in rows.items()
                  if name == function and path.endswith(where))
        print(f"{100 * cum / total:6.1f}  {label}")
    by_module: dict[str, float] = {}
    for (path, _line, _name), (_cc, _nc, tt, _ct, _callers) in rows.items():
        m = re.search(r"(cqsd/\w+|cqsproto|logstream|trio|outcome|benchmarks)/",
                      path)
        by_module[m.group(1) if m else "builtins and other"] = (
            by_module.get(m.group(1) if m else "builtins and other", 0) + tt)
    print("own time by module: " + ", ".join(
        f"{k} {100 * v / total:.1f}%" for k, v in sorted(by_module.items(), key=lambda kv: -kv[1])))
    ranked = sorted(rows.items(), key=lambda kv: kv[1][2], reverse=True)
    calls = sum(nc for _cc, nc, _tt, _ct, _callers in rows.values())
    print(f"Python and C calls a message: {calls / messages:.0f}")
    print(f"{'own %':>6} {'cum %':>6} {'calls/msg':>9}  function")
    for (path, line, name), (_cc, nc, tt, ct, _callers) in ranked[:top]:
        short = path.replace(str(ROOT) + "/", "").replace(sys.prefix, "~")
        short = re.sub(r".*/site-packages/", "", short)
        print(f"{100 * tt / total:6.1f} {100 * ct / total:6.1f} {nc / messages:9.2f}  "
              f"{name} ({short}:{line})")


def child(args, cycles: int, prefix: list[str], more: tuple[str, ...] = ()) -> list[str]:
    return [*prefix, sys.executable, __file__, "--run", "--cycles", str(cycles), "--warm",
            str(args.warm), "--sessions", str(args.sessions), "--size", str(args.size),
            "--fsync", args.fsync, *(["--waiting"] if args.waiting else []), *more]


def environment() -> dict[str, str]:
    env = dict(os.environ, PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "clients"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def callgrind(args, cycles: int, out: Path) -> int:
    subprocess.run(child(args, cycles, ["valgrind", "--tool=callgrind", "--quiet",
                                        f"--callgrind-out-file={out}"]),
                   check=True, env=environment())
    return callgrind_total(out)


def functions(out: Path, inclusive: bool) -> dict[str, int]:
    """Instructions by C function (callgrind_annotate), self or inclusive."""
    text = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
                           "--threshold=100", str(out)],
                          check=True, capture_output=True, text=True).stdout
    costs: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
        if m and ":" in m.group(2):
            name = m.group(2).rsplit(" [", 1)[0]
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return costs


def count_instructions(args) -> None:
    messages = (args.measured - args.warm) * (args.sessions // 2)
    with tempfile.TemporaryDirectory(prefix="cqsd-callgrind-") as tmp:
        base, more = Path(tmp) / "base.out", Path(tmp) / "more.out"
        figures = []
        for _ in range(args.repeat):
            ir_base = callgrind(args, args.warm, base)
            ir_more = callgrind(args, args.measured, more)
            figures.append(round((ir_more - ir_base) / messages))
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(base, args.keep / "base.out")
            shutil.copy(more, args.keep / "more.out")
        result = {"bench": "instructions", "sessions": args.sessions, "size": args.size,
                  "fsync": args.fsync, "waiting": args.waiting, "cycles": [args.warm + args.warm,
                                                  args.warm + args.measured],
                  "messages": messages,
                  "ir_per_message": sorted(figures)[len(figures) // 2], "runs": figures}
        print(json.dumps(result))
        if args.top:
            for inclusive in (False, True):
                a, b = functions(base, inclusive), functions(more, inclusive)
                diff = {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b)}
                kind = "inclusive" if inclusive else "self"
                print(f"\nC functions by {kind} instructions a message:")
                for name, d in sorted(diff.items(), key=lambda kv: -kv[1])[:args.top]:
                    print(f"{d / messages:10.0f}  {name}")


def count_syscalls(args) -> None:
    """strace -c -f of both runs: the daemon's system calls a message, by call (the
    harness's own sends and receives, counted in process, taken off)."""
    messages = (args.measured - args.warm) * (args.sessions // 2)
    counts = []
    with tempfile.TemporaryDirectory(prefix="cqsd-strace-") as tmp:
        for cycles in (args.warm, args.measured):
            out, ours = Path(tmp) / f"{cycles}.txt", Path(tmp) / f"{cycles}.json"
            subprocess.run(child(args, cycles, ["strace", "-f", "-c", "-o", str(out)],
                                 ("--client-calls", str(ours))),
                           check=True, env=environment())
            calls: dict[str, int] = {}
            for line in out.read_text().splitlines():
                fields = line.split()
                if len(fields) >= 5 and fields[-1] != "total" and fields[3].isdigit():
                    calls[fields[-1]] = int(fields[3])
            for name, n in json.loads(ours.read_text()).items():
                calls[name] -= n
            counts.append(calls)
    diff = {k: (counts[1].get(k, 0) - counts[0].get(k, 0)) / messages
            for k in set(counts[0]) | set(counts[1])}
    print(json.dumps({"bench": "syscalls", "sessions": args.sessions, "fsync": args.fsync,
                      "messages": messages, "per_message": round(sum(diff.values()), 2),
                      "by_call": {k: round(v, 2) for k, v in sorted(diff.items(),
                                                                     key=lambda kv: -kv[1])
                                  if abs(v) >= 0.01}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8, help="half put, half read+delete")
    parser.add_argument("--size", type=int, default=1024, help="bytes a message")
    parser.add_argument("--warm", type=int, default=20, help="W: cycles in both runs")
    parser.add_argument("--measured", type=int, default=320, help="M: cycles of the longer run")
    parser.add_argument("--fsync", choices=["inline", "thread"], default="inline")
    parser.add_argument("--waiting", action="store_true",
                        help="reads sent first, each woken by a put")
    parser.add_argument("--repeat", type=int, default=1,
                        help="pairs of runs (the median is reported; the periodic tasks a "
                             "run's wall time includes move a figure ~1%%)")
    parser.add_argument("--top", type=int, default=0, help="C functions that differ most")
    parser.add_argument("--keep", type=Path, help="copy both callgrind outputs here")
    parser.add_argument("--syscalls", action="store_true", help="strace -c instead")
    parser.add_argument("--profile", type=int, default=0, metavar="K",
                        help="cProfile in process, the top K Python functions")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cycles", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--client-calls", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run or args.profile:
        if args.profile:
            args.cycles = args.measured
        run_once(args)
    elif args.syscalls:
        count_syscalls(args)
    else:
        count_instructions(args)


if __name__ == "__main__":
    main()
