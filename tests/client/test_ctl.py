"""cqsctl (cqsclient/ctl.py): its arguments, output and exit codes, against the fake server."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest

from cqsclient import ctl

from .fakeserver import ok

# docs/operations.md, a contract: the subcommands and the display kinds.
CONTRACT_COMMANDS = {
    "display", "put", "read", "browse", "delete", "dequeue", "requeue", "checkpoint", "recover",
    "alter", "rebuild", "delete-structure", "reset-smds", "start-smdsconn", "stop-smdsconn",
}
CONTRACT_KINDS = {
    "structures", "queues", "clients", "locks", "backups", "smds", "smdsconn", "cfstatus",
}


@pytest.fixture
def cqsctl(address, capsys):
    """Run cqsctl against the fake server; returns (status, stdout, stderr)."""

    def run(*argv):
        status = ctl.main(["--address", address, *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def subcommands(parser):
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_command_set_matches_the_contract():
    """Every subcommand and display kind of docs/operations.md is known to the parser."""
    commands = subcommands(ctl.build_parser())
    assert CONTRACT_COMMANDS <= set(commands)
    kinds = next(a for a in commands["display"]._actions if a.dest == "kind").choices
    assert CONTRACT_KINDS <= set(kinds)


def test_global_options_before_or_after_the_subcommand():
    """--json, --address and --client work on either side of the subcommand."""
    parser = ctl.build_parser()
    before = parser.parse_args(["--json", "--address", "tcp://h:1", "display", "clients"])
    after = parser.parse_args(["display", "clients", "--json", "--address", "tcp://h:1"])
    for args in (before, after):
        assert (args.json, args.address, args.kind) == (True, "tcp://h:1", "clients")
    plain = parser.parse_args(["display", "clients"])
    assert (plain.json, plain.address, plain.client) == (False, None, None)


def test_default_client_name_is_valid(monkeypatch):
    """The default client name is CTL and five digits, unless $CQSD_CLIENT names one."""
    monkeypatch.delenv("CQSD_CLIENT", raising=False)
    assert re.fullmatch(r"CTL\d{5}", ctl.default_client_name())
    assert ctl.CLIENT_NAME.fullmatch(ctl.default_client_name())
    monkeypatch.setenv("CQSD_CLIENT", "OPER1")
    assert ctl.default_client_name() == "OPER1"


def test_show_data_text_hex_and_truncation():
    """Printable UTF-8 shows as text, anything else as hex, cut to 60 characters in tables."""
    assert ctl.show_data(b"hello") == "hello"
    assert ctl.show_data("wörld".encode()) == "wörld"
    assert ctl.show_data(b"\x00\xff") == "hex:00ff"
    assert ctl.show_data(b"a\nb") == "hex:610a62"
    assert ctl.show_data(b"a\nb", limit=None) == "a\nb"
    long = ctl.show_data(b"x" * 100)
    assert len(long) == 60 and long.endswith("…")


def test_format_table_aligns_columns():
    """Tables have upper-case headers, left-aligned text and right-aligned numbers."""
    text = ctl.format_table([{"name": "MSGQ01", "depth": 5}, {"name": "Q", "depth": 12345}])
    assert text.splitlines() == [
        "NAME    DEPTH",
        "MSGQ01      5",
        "Q       12345",
    ]


def test_to_json_encodes_bytes_as_base64():
    """In JSON output every bytes value is an object with its base64."""
    assert json.loads(ctl.to_json({"data": b"\x00\x01"})) == {"data": {"base64": "AAE="}}


def test_put_browse_and_display(cqsctl):
    """put prints the entry id; browse and display print aligned tables."""
    status, out, _ = cqsctl("put", "MSGQ01", "TRANX", "hello")
    assert status == 0
    eid = int(out)
    assert cqsctl("put", "MSGQ01", "LT1", "x", "--qtype", "LTERM", "--nonrecoverable")[0] == 0
    status, out, _ = cqsctl("browse", "MSGQ01", "TRANX")
    lines = out.splitlines()
    assert status == 0 and len(lines) == 2
    assert lines[0].split()[:3] == ["ENTRY_ID", "QTYPE", "QUEUE"]
    assert lines[1].split()[:3] == [str(eid), "TRAN", "TRANX"] and lines[1].endswith("hello")
    status, out, _ = cqsctl("display", "queues", "--structure", "MSGQ01")
    assert out.splitlines()[0].split()[:4] == ["STRUCTURE", "QTYPE", "QUEUE", "DEPTH"]
    assert len(out.splitlines()) == 3


def test_browse_json_round_trips_the_bytes(cqsctl):
    """browse --json lists messages whose data decodes back to the exact bytes."""
    cqsctl("put", "MSGQ01", "Q", "payload")
    status, out, _ = cqsctl("--json", "browse", "MSGQ01")
    [message] = json.loads(out)
    assert status == 0
    assert base64.b64decode(message["data"]["base64"]) == b"payload"
    assert (message["queue"], message["qtype"], message["structure"]) == ("Q", "TRAN", "MSGQ01")


def test_browse_limit_warns_that_more_follow(cqsctl):
    """browse --limit shows at most that many and says on stderr that more exist."""
    for i in range(3):
        cqsctl("put", "MSGQ01", "Q", str(i))
    status, out, err = cqsctl("browse", "MSGQ01", "Q", "--limit", "2")
    assert status == 0 and len(out.splitlines()) == 3
    assert "more messages" in err


def test_read_prints_then_deletes(server, cqsctl):
    """read shows the whole message and deletes it; the queue is then empty."""
    cqsctl("put", "MSGQ01", "TRANX", "hello")
    status, out, _ = cqsctl("read", "MSGQ01", "TRANX")
    assert status == 0
    assert re.search(r"^data\s+hello$", out, re.M)
    assert len(server.ops("delete")) == 1 and server.messages() == []
    status, _, err = cqsctl("read", "MSGQ01", "TRANX")
    assert status == 1
    assert err.startswith("cqsctl: NO_MESSAGE: ")


def test_read_keep_unlocks_instead(server, cqsctl):
    """read --keep gives the message back instead of deleting it."""
    cqsctl("put", "MSGQ01", "TRANX", "hello")
    status, out, _ = cqsctl("--json", "read", "MSGQ01", "TRANX", "--keep")
    assert status == 0 and json.loads(out)["delivery_count"] == 1
    assert server.ops("delete") == [] and len(server.ops("unlock")) == 1
    [entry] = server.messages()
    assert (entry.where, entry.owner) == ("ready", None)


def test_operator_delete_and_errors(server, cqsctl):
    """delete is an operator delete; a failed request exits 1 with REASON: message."""
    eid = int(cqsctl("put", "MSGQ01", "Q", "x")[1])
    assert cqsctl("delete", "MSGQ01", str(eid))[:2] == (0, f"deleted {eid}\n")
    assert server.ops("delete")[0]["operator"] is True
    status, out, err = cqsctl("delete", "MSGQ01", str(eid))
    assert (status, out) == (1, "")
    assert err.startswith("cqsctl: ENTRY_NOT_FOUND: ")
    assert cqsctl("put", "NOPE", "Q", "x")[2].startswith("cqsctl: UNKNOWN_STRUCTURE: ")


def test_dequeue_needs_confirmation(server, cqsctl, monkeypatch):
    """dequeue refuses without a terminal or --yes, asks on a terminal, and counts with --yes."""
    cqsctl("put", "MSGQ01", "Q", "a")
    cqsctl("put", "MSGQ01", "Q", "b")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    status, _, err = cqsctl("dequeue", "MSGQ01", "Q")
    assert status == 2 and "--yes" in err
    assert server.ops("dequeue") == []

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    assert cqsctl("dequeue", "MSGQ01", "Q")[0] == 1
    assert server.ops("dequeue") == []
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    assert cqsctl("dequeue", "MSGQ01", "Q")[:2] == (0, "dequeued 2 messages\n")
    assert cqsctl("--json", "dequeue", "MSGQ01", "Q", "--yes")[1] == '{\n  "count": 0\n}\n'


def test_requeue(server, cqsctl):
    """requeue says where the message went back to."""
    eid = int(cqsctl("put", "MSGQ01", "TRANX", "x")[1])
    with server.engine() as s:  # its reader cold-started: the message is on the cold queue
        s.read("IMS1", "TRAN", "TRANX")
        s.cold_client("IMS1")
    assert cqsctl("requeue", "MSGQ01", str(eid))[:2] == (0, f"requeued {eid} to TRAN queue TRANX\n")


SMDSCONN_ROW = {"structure": "MSGQ01", "owner": "IMS1", "status": "CLOSED", "avail": "STOPPED",
                "openmode": "NONE"}
CFSTATUS_ROW = {"structure": "MSGQ01", "owner": "IMS1", "status": "RECOVERED",
                "access": "ENABLED", "rcvtime": None, "failtime": 1_700_000_000_000_000_000}
SMDS_ROW = {"structure": "MSGQ01", "owner": "IMS1", "size": 67108864, "used_percent": 1.5,
            "dsblock": 262144, "dsbufs": 200, "dsexpand": True, "status": "ACTIVE",
            "access": "ENABLED"}


@pytest.mark.parametrize(("argv", "op", "fields", "result", "text"), [
    (["reset-smds", "MSGQ01", "IMS1", "--status", "recovered"], "reset_smds",
     {"owner": "IMS1", "access": None, "status": "recovered"}, CFSTATUS_ROW,
     "data set of IMS1 in MSGQ01: STATUS(RECOVERED) ACCESS(ENABLED)\n"),
    (["stop-smdsconn", "MSGQ01", "IMS1"], "stop_smdsconn", {"owner": "IMS1"},
     {"rows": [SMDSCONN_ROW]}, "CLOSED  STOPPED"),
    (["start-smdsconn", "MSGQ01"], "start_smdsconn", {"owner": None}, {"rows": []},
     "(no data sets)\n"),
    (["alter-smds", "MSGQ01", "IMS1", "--dsbufs", "200", "--dsexpand", "default"], "alter_smds",
     {"owner": "IMS1", "dsbufs": 200, "dsexpand": "default"}, SMDS_ROW, "64 MiB"),
    (["alter-smds", "MSGQ01", "IMS1", "--dsbufs", "default"], "alter_smds",
     {"owner": "IMS1", "dsbufs": "default", "dsexpand": None}, SMDS_ROW, "ENABLED"),
])
def test_smds_commands_send_their_request_and_show_the_result(cqsctl, server, argv, op, fields,
                                                              result, text):
    """reset-smds, start/stop-smdsconn and alter-smds send one request of their op with
    the fields given, and show the result as text, or as it came with --json."""
    server.handlers[op] = lambda conn, f: ok(f["id"], **result)
    status, out, _ = cqsctl(*argv)
    assert status == 0 and text in out
    (request,) = server.ops(op)
    assert {k: request[k] for k in fields} == fields and request["structure"] == "MSGQ01"
    status, out, _ = cqsctl("--json", *argv)
    assert json.loads(out) == (result.get("rows", result) if op.endswith("smdsconn") else result)


def test_display_cfstatus_and_smdsconn_take_the_structure_as_design_writes_it(cqsctl, server):
    """`display cfstatus STRUCTURE --type smds` and `display smdsconn STRUCTURE` query their
    kind for that structure; times show as UTC."""
    server.handlers["query"] = lambda conn, f: ok(f["id"], rows=[CFSTATUS_ROW])
    status, out, _ = cqsctl("display", "cfstatus", "MSGQ01", "--type", "smds")
    assert status == 0 and "2023-11-14T22:13:20.000Z" in out and "RECOVERED" in out
    cqsctl("display", "smdsconn", "MSGQ01")
    assert [(q["kind"], q["structure"]) for q in server.ops("query")] == [
        ("cfstatus", "MSGQ01"), ("smdsconn", "MSGQ01")]


@pytest.mark.parametrize("argv", [
    ["reset-smds", "MSGQ01", "IMS1"], ["alter-smds", "MSGQ01", "IMS1"],
    ["reset-smds", "MSGQ01", "IMS1", "--access", "maybe"], ["stop-smdsconn"],
    ["alter-smds", "MSGQ01", "IMS1", "--dsbufs", "0"],
])
def test_smds_commands_without_what_to_change_are_usage_errors(cqsctl, server, argv):
    """A reset-smds or alter-smds that changes nothing, or a bad value, exits 2 unsent."""
    status, out, _ = cqsctl(*argv)
    assert (status, out) == (2, "")
    assert not server.ops("reset_smds") and not server.ops("alter_smds")


def test_usage_errors_exit_2(cqsctl, capsys):
    """Bad arguments, a bad client name or a bad address exit 2."""
    assert cqsctl("display", "nonsense")[0] == 2
    assert cqsctl("--client", "no spaces!", "display", "clients")[0] == 2
    assert cqsctl("browse", "MSGQ01", "--limit", "0")[0] == 2
    assert ctl.main(["--address", "bogus", "display", "clients"]) == 2
    assert "no scheme" in capsys.readouterr().err
    assert ctl.main(["--help"]) == 0


def test_unreachable_daemon_exits_3_naming_the_address(tmp_path, capsys):
    """When nothing listens at the address, cqsctl exits 3 and names it."""
    address = f"unix://{tmp_path}/absent.sock"
    assert ctl.main(["--address", address, "display", "clients"]) == 3
    assert address in capsys.readouterr().err
