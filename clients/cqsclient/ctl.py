"""cqsctl, the operator's command line (docs/operations.md), a thin shell over the cqsclient SDK.

Every subcommand connects, opens an operator session (it takes no
``max_clients`` slot and never collides with another cqsctl, whatever the
name), makes its requests, prints the result and deregisters. Output is an
aligned table (or a field list for a single message) by default, with sizes,
times and durations made readable (readable.py), and JSON with ``--json``,
which keeps every number in its one unit.

Data in the output: in tables a payload is shown as text when it is printable
UTF-8 and as ``hex:…`` otherwise, cut to 60 characters; ``read`` shows it
whole. In JSON every bytes value is ``{"base64": "..."}``, so that any payload
survives the trip unchanged (``base64 -d`` gives back the exact bytes).

Exit status: 0 success, 1 a request failed (``cqsctl: REASON: message`` on
stderr, e.g. NO_MESSAGE from ``read`` on an empty queue), 2 a usage error, 3 the
daemon could not be reached (or the connection dropped), naming the address.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any, Final, TextIO

import cqsclient
from cqsclient import profile as profiles
from cqsclient import readable
from cqsclient.credentials import read_secret_file, secret_from_env
from cqsclient.errors import CannotConnect, ConnectionLost, CQSError
from cqsclient.group import parse_targets
from cqsclient.model import Message
from cqsclient.profile import Candidate, Profile
from cqsproto import CLIENT_NAME, CLIENT_NAME_RULE
from cqsproto.sizes import parse_size

__all__ = ["build_parser", "format_table", "main", "show_data", "to_json"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3

# Table cells holding data are cut here, so one message cannot blow up a table.
DATA_WIDTH: Final = 60

QUERY_KINDS: Final = ("structures", "queues", "clients", "locks", "headers", "backups", "jobs",
                      "smds", "usage", "cfstatus", "smdsconn", "owners")
PROGRESS_POLL: Final = 0.5  # seconds between looks at a long job's progress


class UsageError(Exception):
    """The command line asks for something impossible; exit status 2."""


# --- formatting --------------------------------------------------------------


def show_data(data: bytes, limit: int | None = DATA_WIDTH) -> str:
    """*data* as text if it is printable UTF-8, else as ``hex:...``; cut to *limit* chars."""
    try:
        text = data.decode("utf-8")
        printable = text.isprintable() if limit is not None else _printable_lines(text)
    except UnicodeDecodeError:
        printable = False
    if not printable:
        text = "hex:" + data.hex()
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _printable_lines(text: str) -> bool:
    # Outside tables, line breaks and tabs are fine.
    return all(line.isprintable() for line in text.replace("\t", " ").splitlines())


def _format_time(ns: Any) -> str:
    return _cell(readable.moment_ns(ns))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (bytes, bytearray)):
        return show_data(bytes(value))
    if isinstance(value, (list, tuple)):
        return ",".join(_cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return json.dumps(value, default=_json_default, separators=(",", ":"))
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """*rows* as an aligned text table; numbers right-aligned, headers upper-case.

    The columns are *columns*, else every key in order of first appearance.
    """
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            seen.update(dict.fromkeys(row))
        columns = list(seen)
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    numeric = [
        all(isinstance(row.get(c), int) and not isinstance(row.get(c), bool) for row in rows)
        and bool(rows)
        for c in columns
    ]
    headers = [c.upper() for c in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers)] + [line(r) for r in cells])


MESSAGE_COLUMNS: Final = (
    "entry_id", "qtype", "queue", "where", "owner", "deliveries", "put_time", "size", "data",
)


def _message_row(m: Message) -> dict[str, Any]:
    row: dict[str, Any] = {
        "entry_id": m.entry_id,
        "qtype": m.qtype,
        "queue": m.queue,
        "where": m.where,
        "owner": m.owner,
        "deliveries": m.delivery_count,
        "put_time": _format_time(m.put_time),
        "size": len(m.data),
        "data": m.data,
    }
    if m.home is not None:
        row["home"] = "/".join(m.home)
    return row


def format_messages(messages: Sequence[Message]) -> str:
    """Browse output: one message per line."""
    rows = [_message_row(m) for m in messages]
    columns = list(MESSAGE_COLUMNS)
    # The recoverable and home columns appear only when they say something.
    if any(not m.recoverable for m in messages):
        columns.insert(-2, "recoverable")
        for row, m in zip(rows, messages, strict=True):
            row["recoverable"] = m.recoverable
    if any(m.home is not None for m in messages):
        columns.insert(-2, "home")
    if any(m.unavailable is not None for m in messages):  # data in an unavailable data set
        columns.insert(-2, "unavailable")
        for row, m in zip(rows, messages, strict=True):
            row["unavailable"] = m.unavailable is not None
    return format_table(rows, columns)


def format_message(m: Message) -> str:
    """Read output: the fields of one message, its data whole."""
    fields = [
        ("structure", m.structure),
        ("entry_id", str(m.entry_id)),
        ("qtype", m.qtype),
        ("queue", m.queue),
        ("recoverable", _cell(m.recoverable)),
        ("put_time", _format_time(m.put_time)),
        ("deliveries", str(m.delivery_count)),
        ("size", str(len(m.data))),
        ("data", show_data(m.data, limit=None)),
    ]
    width = max(len(k) for k, _ in fields)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in fields)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if is_dataclass(value) and not isinstance(value, type):
        return {f: getattr(value, f) for f in value.__dataclass_fields__}
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


def to_json(value: Any) -> str:
    """*value* as indented JSON; bytes become ``{"base64": ...}``, dataclasses objects."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    return json.dumps(value, indent=2, default=_json_default, ensure_ascii=False)


# --- the command line --------------------------------------------------------


def default_client_name() -> str:
    """``$CQSD_CLIENT``, else ``CTL`` and the last five digits of the process id."""
    return os.environ.get("CQSD_CLIENT") or f"CTL{os.getpid() % 100_000:05d}"


def _client_name(text: str) -> str:
    if not CLIENT_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a client name: {CLIENT_NAME_RULE}")
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be zero or more seconds")
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--size: {error}") from None


def _dsbufs(text: str) -> int | str:
    return "default" if text == "default" else _positive_int(text)


def _entry_id(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an entry id") from None


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    # The global options are accepted before and after the subcommand; in the
    # subcommand's copy they default to SUPPRESS so they do not overwrite the
    # values given before it.
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--address",
        default=default(None),
        help="daemon address: unix://PATH, tcp://HOST:PORT or tls://HOST:PORT; for a group, "
        "several (comma-separated, tried in turn) or etcd://HOST:PORT/GROUP, and requests "
        "go to the structure's owner "
        "(default: $CQSD_ADDRESS, else the profile's address, else the socket the daemon's "
        "config names, else unix:///run/cqsd/cqsd.sock, else unix://./cqsd-data/cqsd.sock)",
    )
    parser.add_argument(
        "--config",
        default=default(None),
        help="the daemon's config file, read for its socket (default: $CQSD_CONFIG, else "
        "the profile's config, else /etc/cqsd/cqsd.toml)",
    )
    parser.add_argument(
        "--client",
        type=_client_name,
        default=default(None),
        help="client name to register as (default: $CQSD_CLIENT, else the profile's client, "
        "else CTL + 5 digits of the pid)",
    )
    parser.add_argument(
        "--secret",
        default=default(None),
        help="the client's secret (default: $CQSD_SECRET); visible to other users in ps, "
        "so prefer --secret-file",
    )
    parser.add_argument(
        "--secret-file",
        default=default(None),
        help="a file whose first line is the secret (default: $CQSD_SECRET_FILE, else the "
        "profile's secret_file)",
    )
    parser.add_argument(
        "--cafile", default=default(None), help="CA certificates for a tls:// address"
    )
    parser.add_argument(
        "--certfile", default=default(None),
        help="client certificate (PEM) for a tls:// daemon that asks for one",
    )
    parser.add_argument(
        "--keyfile", default=default(None), help="its private key (default: in --certfile)"
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=default(10.0),
        help="seconds to connect and register, and for each reply; jobs such as "
        "checkpoint take as long as they take (default 10)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print JSON instead of tables (bytes as {\"base64\": ...})",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of cqsctl."""
    parser = argparse.ArgumentParser(
        prog="cqsctl",
        description="Operate a cqsd daemon: status, display, put, read, browse, delete, requeue, "
                    "dequeue, checkpoint, recover, fail, alter, rebuild, delete-structure, and the "
                    "shared message data sets: alter-smds, reset-smds, start-smdsconn, "
                    "stop-smdsconn.",
        epilog="Exit status: 0 ok, 1 request failed, 2 usage, 3 daemon unreachable.",
    )
    parser.add_argument("--version", action="version", version=f"cqsctl {cqsclient.__version__}")
    _global_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, suppress=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help, parents=[common])

    command("status", "the daemon at a glance: version, uptime, clients, structures and their "
            "fullness, the log and fsync latency, checkpoints, recovery in progress")

    sub = command("display", "display structures, queues, clients, locks, headers, backups, "
                  "jobs, a group's owners, or the shared message data sets: smds, usage, "
                  "cfstatus, smdsconn")
    sub.add_argument("kind", choices=QUERY_KINDS, metavar="KIND",
                     help=f"one of: {', '.join(QUERY_KINDS)}")
    sub.add_argument("where", nargs="?", metavar="STRUCTURE", help="only this structure")
    sub.add_argument("--structure", help="only this structure (as STRUCTURE)")
    sub.add_argument("--type", choices=("smds",), default="smds",
                     help="what display usage and cfstatus show: smds (the data sets)")

    sub = command("put", "put a message; prints its entry id")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("queue", metavar="QUEUE")
    sub.add_argument("data", metavar="DATA", help="the message as UTF-8 text; '-' reads stdin")
    sub.add_argument("--qtype", default="TRAN", help="queue type (default TRAN)")
    sub.add_argument("--nonrecoverable", action="store_true",
                     help="a non-recoverable message (not logged)")
    sub.add_argument("--delay", type=_seconds, default=None,
                     help="seconds before the message may be read (default: at once)")

    sub = command("read", "read the next message, print it and delete it (unless --keep)")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("queue", metavar="QUEUE")
    sub.add_argument("--qtype", default="TRAN", help="queue type (default TRAN)")
    sub.add_argument("--wait", type=_seconds, default=None,
                     help="seconds to wait for a message (default: do not wait)")
    sub.add_argument("--keep", action="store_true",
                     help="unlock the message again instead of deleting it")

    sub = command("browse", "list messages without locking them")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("queue", metavar="QUEUE", nargs="?")
    sub.add_argument("--qtype", default=None,
                     help="queue type (default TRAN with a QUEUE, every type without)")
    sub.add_argument("--limit", type=_positive_int, default=100,
                     help="most messages to list (default 100)")

    sub = command("delete", "delete a message not locked by another client (operator delete)")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("entry_id", metavar="ENTRY_ID", type=_entry_id)

    sub = command("requeue", "put a cold or suspended message back on its home queue")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("entry_id", metavar="ENTRY_ID", type=_entry_id)

    sub = command("dequeue", "delete every message of a queue")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("queue", metavar="QUEUE")
    sub.add_argument("--qtype", default="TRAN", help="queue type (default TRAN)")
    sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    sub = command("checkpoint", "checkpoint a structure to its SRDS (waits for the job, "
                  "showing its stages, and reports it)")
    sub.add_argument("structure", metavar="STRUCTURE")
    _no_wait(sub)

    sub = command("recover", "recover a structure from its SRDS and the logstream (RECOVER "
                  "CFSTRUCT); it is failed meanwhile. Several are recovered together, by "
                  "one job")
    sub.add_argument("structure", metavar="STRUCTURE", nargs="+")
    sub.add_argument("--purge", action="store_true",
                     help="empty the structure instead (TYPE(PURGE)): nothing is recovered")
    _no_wait(sub)

    sub = command("fail", "mark a structure failed, for a recovery drill (RESET CFSTRUCT "
                  "ACTION(FAIL)); its requests get STRUCTURE_FAILED until recover")
    sub.add_argument("structure", metavar="STRUCTURE")

    sub = command("move-structure", "move a group's structure pair to another node by a "
                  "planned move (SETXCF START,REBUILD); waits until that node serves it")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("--to", required=True, metavar="NODE", help="the node to move it to")

    sub = command("alter", "change a structure's current size (SETXCF START,ALTER)")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("--size", type=_size, required=True, help="the new size, e.g. 48MiB")

    sub = command("rebuild", "copy a structure to a new instance, optionally with a new size")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("--size", type=_size, default=None, help="its new SIZE, e.g. 128MiB")

    sub = command("delete-structure", "delete an empty structure: empty its checkpoints so "
                  "that nothing in it is recovered (SETXCF FORCE); one holding messages only "
                  "with --force")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    sub.add_argument("--force", action="store_true",
                     help="delete it even if it holds messages (they are lost; the log keeps "
                          "their records, as history)")

    sub = command("alter-smds", "change a data set's buffers or expansion (ALTER SMDS); "
                  "turning expansion on retries it")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("owner", metavar="OWNER", type=_client_name, help="the owning client")
    sub.add_argument("--dsbufs", type=_dsbufs, metavar="N|default",
                     help="buffers of the structure's pool it asks for (1-9999)")
    sub.add_argument("--dsexpand", choices=("yes", "no", "default"),
                     help="may it grow by 20%% when 90%% full (default: the structure's)")

    sub = command("reset-smds", "mark a data set FAILED or RECOVERED, or its access enabled "
                  "or disabled (RESET SMDS)")
    sub.add_argument("structure", metavar="STRUCTURE")
    sub.add_argument("owner", metavar="OWNER", type=_client_name, help="the owning client")
    sub.add_argument("--access", choices=("enabled", "disabled"),
                     help="disabled closes it normally; enabled brings it back (or retries it)")
    sub.add_argument("--status", choices=("failed", "recovered"),
                     help="failed: stop using it at once, for recovery; recovered: its data "
                          "is right again, restart processing makes it ACTIVE")

    for name, verb in (("start-smdsconn", "make the daemon's connection to a data set "
                        "available and open it (START SMDSCONN)"),
                       ("stop-smdsconn", "close a data set normally and keep it closed, across "
                        "restarts, until started (STOP SMDSCONN)")):
        sub = command(name, verb)
        sub.add_argument("structure", metavar="STRUCTURE")
        sub.add_argument("owner", metavar="OWNER", nargs="?", type=_client_name,
                         help="the owning client (default: every data set of the structure)")
    return parser


def _no_wait(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--no-wait", action="store_true",
                     help="return once the job has started; follow it with `display jobs`")


# --- the commands --------------------------------------------------------------


class Report:
    """What a command prints: *value* for --json, *text* otherwise."""

    def __init__(self, value: Any, text: str) -> None:
        self.value = value
        self.text = text


def cmd_status(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    snapshot = client.query("status")[0]
    return Report(snapshot, readable.status(snapshot, format_table))


def cmd_display(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    rows = client.query(args.kind, args.where or args.structure)
    text = format_table([readable.row(r) for r in rows]) if rows else f"(no {args.kind})"
    return Report(rows, text)


def cmd_put(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    data = sys.stdin.buffer.read() if args.data == "-" else args.data.encode("utf-8")
    handle = client.structure(args.structure)
    entry_id = handle.put(args.queue, data, qtype=args.qtype, recoverable=not args.nonrecoverable,
                          delay=args.delay)
    return Report({"entry_id": entry_id}, str(entry_id))


def cmd_read(client: cqsclient.Client, args: argparse.Namespace) -> None:
    handle = client.structure(args.structure)
    message = handle.read(args.queue, qtype=args.qtype, wait=args.wait)
    if message is None:
        raise cqsclient.errors.NoMessage(
            f"no message on {args.qtype} queue {args.queue} of {args.structure}"
        )
    # Shown first, released second: if printing fails the message is not lost
    # (the daemon releases the lock of a client that goes away).
    _emit(Report(message, format_message(message)), args.json)
    if args.keep:
        handle.unlock(message.entry_id)
    else:
        handle.delete(message.entry_id)
    return None


def cmd_browse(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    handle = client.structure(args.structure)
    messages: list[Message] = []
    cursor: Any = None
    while len(messages) < args.limit:
        page = handle.browse(args.queue, args.qtype, limit=args.limit - len(messages),
                             cursor=cursor)
        messages.extend(page)
        cursor = page.cursor
        if cursor is None or not page:
            break
    if cursor is not None:
        print(f"cqsctl: more messages follow; raise --limit (now {args.limit}) to see them",
              file=sys.stderr)
    text = format_messages(messages) if messages else "(no messages)"
    return Report(messages, text)


def cmd_delete(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    client.structure(args.structure).operator_delete(args.entry_id)
    return Report({"deleted": args.entry_id}, f"deleted {args.entry_id}")


def cmd_requeue(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    where = client.structure(args.structure).requeue(args.entry_id)
    return Report(
        {"entry_id": args.entry_id, "qtype": where.qtype, "queue": where.queue},
        f"requeued {args.entry_id} to {where.qtype} queue {where.queue}",
    )


def cmd_dequeue(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    count = client.structure(args.structure).dequeue(args.queue, qtype=args.qtype)
    return Report({"count": count}, f"dequeued {count} message{'s' * (count != 1)}")


def cmd_checkpoint(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    r = _follow_job(client, args, "checkpoint", lambda: client.checkpoint(args.structure))
    if "job" in r:
        return _started(r)
    return Report(r, "\n".join(_checkpointed(c) for c in (r, r.get("overflow")) if c))


def _checkpointed(r: dict[str, Any]) -> str:
    return (f"checkpoint of {r['structure']} in {r['slot']}: {r['rows']} messages, "
            f"{r['records']} log records folded, {r['seconds']}s")


def cmd_recover(client: cqsclient.Client, args: argparse.Namespace) -> Report | None:
    if len(args.structure) > 1:
        _recover_together(client, args)
        return None
    one = argparse.Namespace(**{**vars(args), "structure": args.structure[0]})
    r = _follow_job(client, one, "recover",
                    lambda: client.recover(one.structure, purge=args.purge))
    if "job" in r:
        return _started(r)
    return Report(r, _recovered(r))


def _recovered(r: dict[str, Any]) -> str:
    return (f"{r['structure']} recovered ({r['source']}): {r['messages']} messages, "
            f"{r['records_replayed']} log records replayed, {r['seconds']}s")


def _recover_together(client: cqsclient.Client, args: argparse.Namespace) -> None:
    """RECOVER CFSTRUCT of a list: one job; each structure's outcome on a line of its
    own, and exit status 1 (STRUCTURE_FAILED) if any stays failed."""
    every = argparse.Namespace(**{**vars(args), "structure": None})
    r = _follow_job(client, every, "recover", lambda: client.recover(args.structure))
    if "job" in r:
        _emit(_started({**r, "structure": ", ".join(args.structure)}), args.json)
        return None
    lines = [_recovered(done) for done in r["recovered"]]
    lines += [f"{name} NOT recovered, it stays failed: {why}" for name, why in r["failed"].items()]
    _emit(Report(r, "\n".join(lines)), args.json)
    if r["failed"]:
        raise cqsclient.errors.StructureFailed(
            f"{len(r['failed'])} of {len(args.structure)} structures not recovered: "
            f"{', '.join(r['failed'])}")
    return None


def _started(r: dict[str, Any]) -> Report:
    return Report(r, f"{r['kind']} of {r['structure']} started as job {r['job']}; "
                     "follow it with `cqsctl display jobs`")


def _follow_job(client: cqsclient.Client, args: argparse.Namespace, kind: str,
                call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Make ``call`` (a request that runs a Spark job) while showing the job's stages
    on stderr as they end; with --no-wait, return ``{job, kind, structure}`` once
    the daemon has started the job (the job belongs to the daemon: it goes on)."""
    # a job running already serves this request too (the daemon joins it)
    before = {j["id"] for j in client.query("jobs", args.structure) if j["state"] != "running"}
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(_outcome(call)), daemon=True)
    worker.start()
    shown: dict[int, int] = {}  # stages of each job already printed
    live = sys.stderr.isatty() and not args.json  # a progress line, redrawn in place
    while True:
        finished = bool(outcome)  # then one last look: the stages that ended meanwhile
        try:
            jobs = client.query("jobs", args.structure)
        except CQSError:
            if not finished:
                raise
            jobs = []  # the call's own outcome says what went wrong
        for job in jobs:
            if job["id"] in before or job["kind"] != kind:
                continue
            if args.no_wait and not finished:
                return {"job": job["id"], "kind": kind, "structure": args.structure}
            if args.json:
                continue
            lines = stage_lines(job, shown.get(job["id"], 0))
            shown[job["id"]] = len(job.get("stages", ()))
            if lines:
                print(("\r\033[K" if live else "") + "\n".join(lines), file=sys.stderr)
            if live and job["state"] == "running":
                print("\r\033[K" + progress_line(job, time.time()), end="", file=sys.stderr)
            sys.stderr.flush()
        if finished:
            break
        worker.join(PROGRESS_POLL)
    if live and shown:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    result: dict[str, Any] = outcome[0]
    return result


# The stages of a job in the order it runs them (cqsd/srds/jobs.py), to say which
# one is under way.
JOB_STAGES: Final = {"checkpoint": ("session", "plan", "read", "fold", "commit"),
                     "recover": ("session", "plan", "read", "fold", "image")}


def stage_lines(job: dict[str, Any], shown: int) -> list[str]:
    """One line for each stage of ``job`` finished since the first ``shown``, with the
    stage's own time: ``checkpoint MSGQ01: read done in 12.3 s``."""
    return [f"{job['kind']} {job['structure']}: {s['stage']} done"
            + (f" in {readable.duration(s['seconds'])}" if s.get("seconds") is not None else "")
            for s in job.get("stages", [])[shown:]]


def progress_line(job: dict[str, Any], now: float) -> str:
    """Where a running job is: the stage under way, how long it has run and the whole
    job's time, e.g. ``checkpoint MSGQ01: fold… 4.2 s (stage 4 of 5, 21.0 s in all)``."""
    order = JOB_STAGES.get(job["kind"], ())
    done = [s["stage"] for s in job.get("stages", [])]
    since = job["started"] + sum(s.get("seconds") or 0 for s in job.get("stages", []))
    following = next((s for s in order if s not in done), None)
    where = (f"{following}… {readable.duration(max(0.0, now - since))} "
             f"(stage {order.index(following) + 1} of {len(order)}, "
             if following is not None else "finishing… (")
    return f"{job['kind']} {job['structure']}: {where}" \
           f"{readable.duration(now - job['started'])} in all)"


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except BaseException as error:  # noqa: BLE001 - handed to the main thread
        return error


def cmd_fail(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    r = client.fail_structure(args.structure)
    return Report(r, f"{r['structure']} failed with {r['messages']} messages; its requests get "
                     f"STRUCTURE_FAILED until `cqsctl recover {r['structure']}`")


def cmd_move_structure(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    r = client.move_structure(args.structure, args.to)
    return Report(r, f"{r['structure']} moved to {r['owner']} (epoch {r['epoch']}) in "
                     f"{r['seconds']}s")


def cmd_alter(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    r = client.alter(args.structure, args.size)
    return Report(r, f"{r['name']} is now {r['current_size']} bytes ({r['percent_full']}% full)")


def cmd_rebuild(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    r = client.rebuild(args.structure, args.size)
    return Report(r, f"{r['name']} rebuilt: {r['messages']} messages, size {r['size']}, "
                     f"{r['seconds']}s")


def cmd_delete_structure(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    r = client.delete_structure(args.structure, force=args.force)
    held = f" ({r['deleted']} messages deleted)" if r.get("deleted") else ""
    return Report(r, f"{r['structure']} deleted{held}: empty, and nothing older will be "
                     "recovered")


def cmd_reset_smds(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    r = client.reset_smds(args.structure, args.owner, access=args.access, status=args.status)
    return Report(r, f"data set of {r['owner']} in {r['structure']}: STATUS({r['status']}) "
                     f"ACCESS({r['access']})")


def cmd_start_smdsconn(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    rows = client.start_smdsconn(args.structure, args.owner)
    return Report(rows, format_table(rows) if rows else "(no data sets)")


def cmd_stop_smdsconn(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    rows = client.stop_smdsconn(args.structure, args.owner)
    return Report(rows, format_table(rows) if rows else "(no data sets)")


def cmd_alter_smds(client: cqsclient.Client, args: argparse.Namespace) -> Report:
    r = client.alter_smds(args.structure, args.owner, dsbufs=args.dsbufs, dsexpand=args.dsexpand)
    return Report(r, format_table([readable.row(r)]))


# Each returns what to print, or None if it printed already.
COMMANDS: Final[dict[str, Callable[[cqsclient.Client, argparse.Namespace], Report | None]]] = {
    "status": cmd_status,
    "display": cmd_display,
    "put": cmd_put,
    "read": cmd_read,
    "browse": cmd_browse,
    "delete": cmd_delete,
    "requeue": cmd_requeue,
    "dequeue": cmd_dequeue,
    "checkpoint": cmd_checkpoint,
    "recover": cmd_recover,
    "fail": cmd_fail,
    "move-structure": cmd_move_structure,
    "alter": cmd_alter,
    "rebuild": cmd_rebuild,
    "delete-structure": cmd_delete_structure,
    "alter-smds": cmd_alter_smds,
    "reset-smds": cmd_reset_smds,
    "start-smdsconn": cmd_start_smdsconn,
    "stop-smdsconn": cmd_stop_smdsconn,
}


def _confirm_dequeue(args: argparse.Namespace, stdin: TextIO) -> bool:
    """True if the dequeue may go ahead; raises UsageError when nobody can be asked."""
    if args.yes:
        return True
    if not stdin.isatty():
        raise UsageError("dequeue deletes every message of the queue: pass --yes to confirm")
    print(
        f"Delete every message of {args.qtype} queue {args.queue} in {args.structure}? [y/N] ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    return stdin.readline().strip().lower() in ("y", "yes")


def _emit(report: Report, as_json: bool) -> None:
    if as_json:
        print(to_json(report.value))
    elif report.text:
        print(report.text)


def _fail(message: str) -> None:
    print(f"cqsctl: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run cqsctl with *argv* (default: the process's arguments); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # argparse's usage errors (2) and --help (0)
        return exit.code if isinstance(exit.code, int) else EXIT_USAGE
    try:
        profile = profiles.read_profile(profiles.profile_path())
        notes: list[str] = []
        addresses = profiles.candidates(args.address, args.config, profile, notes=notes)
        for candidate in addresses:
            parse_targets(candidate.address)
        name = args.client or _client_name_or_usage(*_default_client(profile))
        if args.command == "dequeue" and not _confirm_dequeue(args, sys.stdin):
            _fail("dequeue cancelled")
            return EXIT_FAILED
        if args.command == "delete-structure" and not args.yes:
            raise UsageError("delete-structure empties the structure for good: pass --yes")
        if args.command == "recover" and args.purge and len(args.structure) > 1:
            raise UsageError("recover --purge takes one structure: purge each on its own")
        if args.command == "reset-smds" and args.access is None and args.status is None:
            raise UsageError("reset-smds: give --access, --status or both")
        if args.command == "alter-smds" and args.dsbufs is None and args.dsexpand is None:
            raise UsageError("alter-smds: give --dsbufs, --dsexpand or both")
    except (UsageError, ValueError) as error:
        _fail(str(error))
        return EXIT_USAGE
    try:
        secret = _secret(args, profile)
        context = _tls_context(args)
    except (UsageError, OSError, ssl.SSLError) as error:
        _fail(str(error))
        return EXIT_USAGE
    try:
        connected = _connect(addresses, notes, str(profiles.profile_path()), client=name,
                             secret=secret, timeout=args.timeout,
                             cafile=args.cafile or profile.cafile, ssl_context=context)
        if connected is None:
            return EXIT_UNREACHABLE
        with connected as client:
            report = COMMANDS[args.command](client, args)
        if report is not None:
            _emit(report, args.json)
        return EXIT_OK
    except ConnectionLost as error:
        _fail(error.message)
        return EXIT_UNREACHABLE
    except CQSError as error:
        _fail(f"{error.reason}: {error.message}")
        return EXIT_FAILED
    except BrokenPipeError:
        # The reader of our output went away (`cqsctl browse ... | head`). Point
        # stdout at /dev/null so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def _connect(addresses: list[Candidate], notes: list[str], profile: str,
             **options: Any) -> cqsclient.Client | None:
    """The first of ``addresses`` that answers, as an operator session; None (and what
    was tried, said on stderr) if none does. A daemon that answers and refuses the
    registration is not passed over: its refusal is the answer."""
    tried: list[tuple[Candidate, str]] = []
    for candidate in addresses:
        try:
            return cqsclient.connect(candidate.address, operator=True, **options)
        except CannotConnect as error:
            if isinstance(error.__cause__, CQSError) or len(addresses) == 1:
                raise  # it answered (then dropped or timed out), or there is no other
            cause = error.__cause__
            tried.append((candidate, getattr(cause, "strerror", None) or str(cause)))
    _fail(profiles.unreachable(tried, notes, profile))
    return None


def _default_client(profile: Profile) -> tuple[str, str]:
    """(the client name, where it came from) when --client is not given."""
    if os.environ.get("CQSD_CLIENT"):
        return os.environ["CQSD_CLIENT"], "$CQSD_CLIENT"
    if profile.client:
        return profile.client, f"client in {profile.path}"
    return default_client_name(), "the default"


def _secret(args: argparse.Namespace, profile: Profile) -> str | None:
    """--secret, else --secret-file, else $CQSD_SECRET, else $CQSD_SECRET_FILE, else the
    profile's secret_file."""
    if args.secret is not None:
        return str(args.secret)
    try:
        if args.secret_file is not None:
            return read_secret_file(args.secret_file)
        from_env = secret_from_env()
        if from_env is not None or profile.secret_file is None:
            return from_env
        return read_secret_file(profile.secret_file)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """A client context presenting --certfile, if given (else the SDK's default)."""
    if args.certfile is None:
        return None
    context = ssl.create_default_context(cafile=args.cafile)
    context.load_cert_chain(args.certfile, args.keyfile)
    return context


def _client_name_or_usage(name: str, source: str) -> str:
    try:
        return _client_name(name)
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"{source}: {error}") from None


if __name__ == "__main__":
    sys.exit(main())
