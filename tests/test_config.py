"""Tests for cqsd.config: defaults, every key's checks, and how problems are reported."""

from __future__ import annotations

import dataclasses
import grp
import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cqsd import config
from cqsd.config import ConfigError, format_size, load, loads, parse_size

EXAMPLE = Path(__file__).resolve().parents[1] / "config" / "cqsd.toml"

# The smallest valid config: one structure, every daemon key defaulted.
ONE_STRUCTURE = '[[structure]]\nname = "S1"\nsize = "1MiB"\n'
SECRET_DIGEST = hashlib.sha256(b"secret").hexdigest()
ONE_CLIENT = f'[[client]]\nname = "IMS1"\nsecret_sha256 = "{SECRET_DIGEST}"\n'


def problems(text: str) -> list[str]:
    """The problems loads() reports for *text*, which must be invalid."""
    with pytest.raises(ConfigError) as info:
        loads(text)
    return info.value.problems


def daemon(**keys: str) -> str:
    """A config with a [daemon] table of *keys* (TOML values) and one structure."""
    lines = "".join(f"{key} = {value}\n" for key, value in keys.items())
    return f"[daemon]\n{lines}{ONE_STRUCTURE}"


def structure(**keys: str) -> str:
    """A config with one [[structure]] of *keys* (TOML values)."""
    lines = "".join(f"{key} = {value}\n" for key, value in keys.items())
    return f"[[structure]]\n{lines}"


# --- defaults ----------------------------------------------------------------


def test_embedded_default_is_the_design_default():
    """load(None) gives the daemon and structures of docs/operations.md."""
    c = load(None)
    d = c.daemon
    assert (d.data_dir, d.socket, d.tcp, d.tls_cert, d.tls_key) == (
        "./cqsd-data", "./cqsd-data/cqsd.sock", "", "", "")
    assert (d.max_clients, d.max_connections, d.max_deliveries, d.send_queue) == (32, 256, 5, 4096)
    assert (d.resync_grace, d.handshake_timeout, d.max_wait) == (0.0, 10.0, 3600.0)
    assert (d.send_queue_bytes, d.send_timeout, d.frame_timeout, d.tcp_keepalive) == (
        64 * 1024**2, 60.0, 60.0, 60.0)
    assert d.max_message == 100 * 1024**2  # MQ's MAXMSGL with SMDS (docs/robustness.md)
    assert d.log_level == "info"
    assert d.tcp_address is None
    assert [s.name for s in c.structures] == ["MSGQ01", "MSGQ01OV", "EMHQ01"]
    assert c.structure("MSGQ01") == config.StructureConfig(
        name="MSGQ01", size=64 * 1024**2, initsize=32 * 1024**2, entry_max=32 * 1024,
        overflow="MSGQ01OV", overflow_threshold=70, max_entries=64 * 1024**2 // 512,
        overflow_exit="", queue_space_exit="", overflow_share=20, overflow_candidates=512,
        offload="smds", dsblock=256 * 1024, dsbufs=100,
        dssize=64 * 1024**2, dsexpand=True, dsmax=16 * 1024**3, offld1thr=70,
        offld1sze=32 * 1024, offld2thr=80, offld2sze=4 * 1024, offld3thr=90, offld3sze=0)
    assert c.structure("MSGQ01OV").offload == c.structure("EMHQ01").offload == "none"
    assert (d.checkpoint_interval, d.checkpoint_log_volume, d.log_retention) == (
        3600.0, 256 * 1024**2, 0.0)
    assert (d.spark_master, d.spark_recovery_records) == ("local[*]", 5_000_000)
    assert c.structure("MSGQ01OV").size == 16 * 1024**2
    assert c.structure("EMHQ01").size == 32 * 1024**2
    assert c.clients == ()


def test_example_file_equals_embedded_default():
    """config/cqsd.toml loads to the same Config as the embedded default."""
    assert load(EXAMPLE) == load(None)


def test_example_file_mentions_every_key():
    """Every key the config accepts is explained in config/cqsd.toml."""
    text = EXAMPLE.read_text()
    for table in (config._DAEMON, config._STRUCTURE, config._CLIENT, config._GROUP):
        for key in table:
            assert key in text, key


def test_default_toml_sets_every_daemon_key_explicitly():
    """DEFAULT_TOML spells out every [daemon] key, so it documents itself."""
    assert set(tomllib.loads(config.DEFAULT_TOML)["daemon"]) == set(config._DAEMON)


def test_omitted_keys_take_their_defaults():
    """A config with only a name and size gets every other default."""
    c = loads(ONE_STRUCTURE)
    assert c.daemon == load(None).daemon
    s = c.structure("S1")
    assert (s.size, s.initsize, s.entry_max, s.overflow, s.overflow_threshold, s.max_entries) == (
        1024**2, 1024**2, 32 * 1024, None, 70, 2048)


def test_socket_is_derived_from_data_dir():
    """Without socket, the socket lives in data_dir."""
    assert loads(daemon(data_dir='"/var/lib/cqsd"')).daemon.socket == "/var/lib/cqsd/cqsd.sock"


def test_relative_paths_are_kept_as_written():
    """Relative paths stay relative (to the daemon's working directory)."""
    d = loads(daemon(data_dir='"data/../q"', socket='"q.sock"')).daemon
    assert (d.data_dir, d.socket) == ("data/../q", "q.sock")


def test_validation_creates_nothing(tmp_path):
    """Loading a config does not create its data directory."""
    loads(daemon(data_dir=f'"{tmp_path / "data"}"'))
    assert list(tmp_path.iterdir()) == []


def test_lookup_by_name():
    """Config.structure and Config.client find by name and raise KeyError otherwise."""
    c = loads(ONE_STRUCTURE + ONE_CLIENT)
    assert c.structure("S1").name == "S1"
    assert c.client("IMS1").secret_sha256 == SECRET_DIGEST
    with pytest.raises(KeyError):
        c.structure("NOPE")
    with pytest.raises(KeyError):
        c.client("NOPE")


def test_config_is_frozen():
    """A Config cannot be changed after validation."""
    c = load(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.daemon.max_clients = 1  # type: ignore[misc]


def test_valid_non_default_values_are_accepted():
    """Every daemon key accepts a valid non-default value, normalized."""
    d = loads(daemon(tcp='"[::1]:7410"', max_clients="1024", max_connections="1024",
                     resync_grace="2.5", max_deliveries="1", max_message="1",
                     handshake_timeout="0.5", send_queue="16", max_wait="0.01",
                     send_queue_bytes='"1MiB"', send_timeout="0.5", frame_timeout="0.5",
                     tcp_keepalive="0", log_level='"WARNING"') + ONE_CLIENT).daemon
    assert d.tcp_address == ("::1", 7410)
    assert (d.max_clients, d.max_connections, d.max_deliveries, d.max_message) == (1024, 1024, 1, 1)
    assert (d.resync_grace, d.handshake_timeout, d.max_wait, d.send_queue) == (2.5, 0.5, 0.01, 16)
    assert (d.send_queue_bytes, d.send_timeout, d.frame_timeout, d.tcp_keepalive) == (
        1024**2, 0.5, 0.5, 0.0)
    assert d.log_level == "warning"


# --- sizes ---------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    (0, 0),
    (512, 512),
    ("512", 512),
    ("512B", 512),
    ("512b", 512),
    ("32KiB", 32 * 1024),
    ("32kib", 32 * 1024),
    ("64MiB", 64 * 1024**2),
    ("64 MiB", 64 * 1024**2),
    ("1GiB", 1024**3),
    ("1gib", 1024**3),
    ("2KB", 2000),
    ("3MB", 3 * 1000**2),
    ("4gb", 4 * 1000**3),
])
def test_parse_size_accepts(value, expected):
    """parse_size reads integers and unit-suffixed strings."""
    assert parse_size(value, "k") == expected


@pytest.mark.parametrize(("value", "message"), [
    ("1.5MiB", 'k: expected a size like "64MiB" or an integer number of bytes, got "1.5MiB"'),
    ("", 'got ""'),
    ("MiB", 'got "MiB"'),
    ("-1", 'got "-1"'),
    ("64 megs", 'k: unknown unit "megs" in "64 megs" (use B, KB, MB, GB, KiB, MiB or GiB)'),
    ("1TiB", 'unknown unit "TiB"'),
    (-1, "k: must not be negative, got -1"),
    (1.5, "got 1.5"),
    (True, "got true"),
    ([1], "got an array"),
])
def test_parse_size_rejects(value, message):
    """parse_size names the key and says what is wrong."""
    with pytest.raises(ConfigError) as info:
        parse_size(value, "k")
    assert message in str(info.value)


@pytest.mark.parametrize(("n", "text"), [
    (0, "0B"), (512, "512B"), (1024, "1KiB"), (64 * 1024**2, "64MiB"),
    (1024**3, "1GiB"), (2000, "2KB"), (1500, "1500B"),
])
def test_format_size_round_trips(n, text):
    """format_size writes what parse_size reads back."""
    assert format_size(n) == text
    assert parse_size(text, "k") == n


# --- daemon keys ---------------------------------------------------------------


@pytest.mark.parametrize(("key", "value", "message"), [
    ("data_dir", "1", "expected a string, got 1"),
    ("data_dir", '""', "must not be empty"),
    ("socket", '""', "must not be empty"),
    ("socket", "false", "expected a string, got false"),
    ("tcp", '"localhost"', 'expected "host:port"'),
    ("tcp", '":7410"', 'expected "host:port"'),
    ("tcp", '"h:0"', 'port must be an integer between 1 and 65535, got "0"'),
    ("tcp", '"h:65536"', "got \"65536\""),
    ("tcp", '"h:http"', 'got "http"'),
    ("tcp", '"::1:7410"', "an IPv6 host goes in brackets"),
    ("tcp", "7410", "expected a string, got 7410"),
    ("tls_cert", "1", "expected a string, got 1"),
    ("max_clients", '"many"', 'expected an integer, got "many"'),
    ("max_clients", "0", "must be between 1 and 1024, got 0"),
    ("max_clients", "1025", "must be between 1 and 1024, got 1025"),
    ("max_clients", "32.0", "expected an integer, got 32.0"),
    ("max_connections", "0", "must be at least 1, got 0"),
    ("max_connections", "8", "8 is less than max_clients 32"),
    ("resync_grace", "-1", "must be at least 0, got -1"),
    ("resync_grace", '"5s"', 'expected a number of seconds, got "5s"'),
    ("resync_grace", "inf", "must be a finite number of seconds, got inf"),
    ("resync_grace", "nan", "must be a finite number of seconds"),
    ("max_deliveries", "0", "must be at least 1, got 0"),
    ("max_message", "0", "must be between 1B and 1GiB, got 0B"),
    ("max_message", '"2GiB"', "must be between 1B and 1GiB, got 2GiB"),
    ("max_message", '"lots"', 'expected a size like "64MiB"'),
    ("handshake_timeout", "0", "must be greater than 0, got 0"),
    ("handshake_timeout", "-0.5", "must be greater than 0, got -0.5"),
    ("send_queue", "15", "must be at least 16, got 15"),
    ("send_queue_bytes", '"1000KiB"', "must be between 1MiB and 64GiB, got 1000KiB"),
    ("send_timeout", "0", "must be greater than 0, got 0"),
    ("frame_timeout", "-1", "must be greater than 0, got -1"),
    ("tcp_keepalive", "-1", "must be at least 0, got -1"),
    ("max_wait", "0", "must be greater than 0, got 0"),
    ("max_wait", "[1]", "expected a number of seconds, got an array"),
    ("log_level", '"warn"', "expected one of debug, info, warning, error, got \"warn\" "
                            "(did you mean 'warning'?)"),
    ("log_level", "3", "expected a string, got 3"),
])
def test_daemon_key_is_checked(key, value, message):
    """Each [daemon] key rejects values of the wrong type or out of range."""
    [problem] = problems(daemon(**{key: value}))
    assert problem.startswith(f"daemon.{key}: ")
    assert message in problem


def test_max_connections_default_is_named_when_too_small():
    """A max_clients above the default max_connections points at that default."""
    assert problems(daemon(max_clients="500")) == [
        "daemon.max_connections: 256 (the default) is less than max_clients 500"]


def test_long_socket_path_is_refused():
    """A socket path longer than a Unix socket allows is refused before bind() would fail."""
    [problem] = problems(daemon(data_dir='"/' + "d" * 100 + '"'))
    assert problem.startswith("daemon.socket: ")
    assert "(derived from data_dir)" in problem and "limited to 107 bytes" in problem


@pytest.mark.parametrize("key", [
    "max_clients", "max_connections", "max_deliveries", "send_queue",
    "resync_grace", "handshake_timeout", "max_wait", "max_message",
    "send_queue_bytes", "send_timeout", "frame_timeout", "tcp_keepalive",
])
def test_booleans_are_not_numbers_in_daemon(key):
    """TOML true is not accepted where a number is expected."""
    [problem] = problems(daemon(**{key: "true"}))
    assert problem.startswith(f"daemon.{key}: ") and problem.endswith("got true")


@pytest.mark.parametrize("key", ["size", "initsize", "entry_max", "overflow_threshold",
                                 "max_entries"])
def test_booleans_are_not_numbers_in_structure(key):
    """TOML true is not accepted for a structure's sizes and counts."""
    [problem] = problems(structure(**{"name": '"S1"', "size": '"1MiB"', key: "true"}))
    assert problem.startswith(f"structure[0].{key}: ") and problem.endswith("got true")


# --- TLS and TCP -----------------------------------------------------------------


def test_tls_files_that_exist_are_accepted(tmp_path):
    """tls_cert and tls_key naming readable files, with tcp, are accepted."""
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("cert")
    key.write_text("key")
    d = loads(daemon(tcp='"127.0.0.1:7410"', tls_cert=f'"{cert}"', tls_key=f'"{key}"')
              + ONE_CLIENT).daemon
    assert (d.tls_cert, d.tls_key, d.tcp_address) == (str(cert), str(key), ("127.0.0.1", 7410))


def test_tls_needs_both_files_and_tcp(tmp_path):
    """A TLS certificate without a key or without TCP is refused, and so is a missing file."""
    cert = tmp_path / "c.pem"
    cert.write_text("cert")
    assert problems(daemon(tls_cert=f'"{cert}"')) == [
        "daemon.tls_key: tls_cert and tls_key must be given together",
        "daemon.tls_cert: TLS applies to the TCP listener only, but daemon.tcp is off",
    ]
    missing = tmp_path / "nope.pem"
    assert problems(daemon(tcp='"h:1"', tls_cert=f'"{cert}"', tls_key=f'"{missing}"')
                    + ONE_CLIENT) == [f"daemon.tls_key: no such file: {missing}"]


def test_tcp_needs_a_client_with_a_secret():
    """TCP with no [[client]] is refused: nobody could register over it."""
    assert problems(daemon(tcp='"127.0.0.1:7410"')) == [
        "daemon.tcp: registering over TCP needs a secret, "
        "but no [[client]] with a secret_sha256 is defined"]


# --- structure keys ----------------------------------------------------------------


@pytest.mark.parametrize(("keys", "message"), [
    ({"size": '"1MiB"'}, "structure[0].name: required key is missing"),
    ({"name": '"S1"'}, "structure[0].size: required key is missing"),
    ({"name": '"s1"', "size": '"1MiB"'},
     'structure[0].name: "s1" is not a valid name: 1-16 characters of A-Z, 0-9, @, #, $ and _ '
     '(did you mean "S1"?)'),
    ({"name": '""', "size": '"1MiB"'}, 'structure[0].name: "" is not a valid name'),
    ({"name": '"ABCDEFGHIJKLMNOPQ"', "size": '"1MiB"'}, "is not a valid name"),
    ({"name": '"A-B"', "size": '"1MiB"'}, '"A-B" is not a valid name'),
    ({"name": "7", "size": '"1MiB"'}, "structure[0].name: expected a string, got 7"),
    ({"name": '"S1"', "size": "511"},
     "structure[0].size: must be between 512B and 1024GiB, got 511B"),
    ({"name": '"S1"', "size": '"2048GiB"'},
     "structure[0].size: must be between 512B and 1024GiB, got 2048GiB"),
    ({"name": '"S1"', "size": '"1MiB"', "initsize": '"2MiB"'},
     "structure[0].initsize: 2MiB is larger than size 1MiB"),
    ({"name": '"S1"', "size": '"1MiB"', "initsize": "100"},
     "structure[0].initsize: must be between 512B and 1024GiB, got 100B"),
    ({"name": '"S1"', "size": '"1MiB"', "entry_max": "511"},
     "structure[0].entry_max: must be between 512B and 1024GiB, got 511B"),
    ({"name": '"S1"', "size": '"1MiB"', "entry_max": '"2MB"'},
     "structure[0].entry_max: 2MB is larger than size 1MiB"),
    ({"name": '"S1"', "size": '"16KiB"'},
     "structure[0].entry_max: 32KiB (the default) is larger than size 16KiB"),
    ({"name": '"S1"', "size": '"1MiB"', "overflow_threshold": "0"},
     "structure[0].overflow_threshold: must be between 1 and 100, got 0"),
    ({"name": '"S1"', "size": '"1MiB"', "overflow_threshold": "101"},
     "structure[0].overflow_threshold: must be between 1 and 100, got 101"),
    ({"name": '"S1"', "size": '"1MiB"', "overflow_threshold": "70.5"},
     "structure[0].overflow_threshold: expected an integer, got 70.5"),
    ({"name": '"S1"', "size": '"1MiB"', "max_entries": "0"},
     "structure[0].max_entries: must be at least 1, got 0"),
    ({"name": '"S1"', "size": '"1MiB"', "max_entries": '"10"'},
     'structure[0].max_entries: expected an integer, got "10"'),
    ({"name": '"S1"', "size": '"1MiB"', "overflow": "1"},
     "structure[0].overflow: expected a string, got 1"),
])
def test_structure_key_is_checked(keys, message):
    """Each [[structure]] key is required or defaulted, typed and range-checked."""
    [problem] = problems(structure(**keys))
    assert message in problem


def test_structure_optional_keys_are_read():
    """initsize, entry_max, overflow_threshold and max_entries override their defaults."""
    s = loads(structure(name='"Q@#$_9"', size="1048576", initsize='"512KiB"', entry_max="512",
                        overflow_threshold="100", max_entries="7")).structure("Q@#$_9")
    assert (s.size, s.initsize, s.entry_max, s.overflow_threshold, s.max_entries) == (
        1024**2, 512 * 1024, 512, 100, 7)


def test_at_least_one_structure_is_required():
    """A config that defines no structure is refused."""
    assert problems("[daemon]\n") == ["structure: at least one [[structure]] must be defined"]
    assert problems("structure = []\n") == ["structure: at least one [[structure]] must be defined"]


def test_structure_must_be_an_array_of_tables():
    """[structure] (a single table) is refused with the right syntax named."""
    assert problems('[structure]\nname = "S1"\n') == [
        "structure: expected an array of tables ([[structure]]), got a table"]
    assert problems("structure = [1]\n") == ["structure[0]: expected a table, got 1"]


# --- overflow references ------------------------------------------------------------


def overflow_config(*pairs: tuple[str, str | None]) -> str:
    """Structures given as (name, overflow or None)."""
    text = ""
    for name, overflow in pairs:
        text += f'[[structure]]\nname = "{name}"\nsize = "1MiB"\n'
        if overflow is not None:
            text += f'overflow = "{overflow}"\n'
    return text


def test_overflow_to_another_structure_is_accepted():
    """A primary may name another, plain structure as its overflow."""
    c = loads(overflow_config(("A", "AOV"), ("AOV", None)))
    assert c.structure("A").overflow == "AOV"
    assert c.structure("AOV").overflow is None


def test_overflow_must_be_defined():
    """An overflow naming no structure is refused, with a suggestion."""
    assert problems(overflow_config(("A", "AOW"), ("AOV", None))) == [
        "structure[0].overflow: no structure named AOW is defined (did you mean 'AOV'?)"]


def test_overflow_name_is_checked_like_a_structure_name():
    """A lowercase overflow name is refused with its uppercase form suggested."""
    assert problems(overflow_config(("A", "aov"), ("AOV", None))) == [
        'structure[0].overflow: "aov" is not a valid name: 1-16 characters of A-Z, 0-9, @, #, $ '
        'and _ (did you mean "AOV"?)']


def test_structure_cannot_be_its_own_overflow():
    """A structure naming itself as overflow is refused."""
    assert problems(overflow_config(("A", "A"))) == [
        "structure[0].overflow: a structure cannot be its own overflow structure"]


def test_overflow_structures_cannot_be_chained():
    """An overflow structure that has an overflow of its own is refused."""
    assert problems(overflow_config(("A", "B"), ("B", "C"), ("C", None))) == [
        "structure[0].overflow: B (structure[1]) has an overflow structure of its own (C); "
        "overflow structures cannot be chained"]


def test_overflow_cycle_reports_both_ends():
    """Two structures that overflow into each other are both reported."""
    assert [p.split(":")[0] for p in problems(overflow_config(("A", "B"), ("B", "A")))] == [
        "structure[0].overflow", "structure[1].overflow"]


def test_overflow_structure_serves_one_primary():
    """Two primaries sharing one overflow structure are refused."""
    assert problems(overflow_config(("A", "OV"), ("B", "OV"), ("OV", None))) == [
        "structure[1].overflow: OV is already the overflow structure of A (structure[0])"]


def test_overflow_candidates_and_share_default_to_the_seed_and_are_checked():
    """overflow_share (20%) and overflow_candidates (512 names) are settings of a primary."""
    c = loads(overflow_config(("A", "AOV"), ("AOV", None)))
    assert (c.structure("A").overflow_share, c.structure("A").overflow_candidates) == (20, 512)
    text = structure(name='"A"', size='"1MiB"', overflow_share=0, overflow_candidates=0)
    assert problems(text) == [
        "structure[0].overflow_share: must be between 1 and 100, got 0",
        "structure[0].overflow_candidates: must be at least 1, got 0"]


@pytest.mark.parametrize("key, value", [
    ("overflow_threshold", "80"), ("overflow_exit", '"site:pick"'),
    ("queue_space_exit", '"site:room"'), ("overflow_share", "30"),
    ("overflow_candidates", "10")])
def test_overflow_keys_on_an_overflow_structure_are_refused(key, value):
    """Overflow processing is the primary's: the same keys on its overflow structure
    would be ignored, so they are refused, naming the key and where it belongs."""
    text = overflow_config(("A", "AOV"), ("AOV", None)) + f"{key} = {value}\n"
    assert problems(text) == [
        f"structure[1].{key}: means nothing on AOV, the overflow structure of A "
        f"(overflow processing is the primary's): set it on A"]


def test_a_queue_space_exit_without_an_overflow_structure_is_refused():
    """The queue space exit is asked about puts that would go to an overflow structure;
    without one those puts are refused anyway, so the exit would never be asked."""
    text = structure(name='"A"', size='"1MiB"', queue_space_exit='"site:room"')
    assert problems(text) == [
        "structure[0].queue_space_exit: means nothing without an overflow structure "
        "(puts to queues in overflow status are refused); set overflow, or remove it"]
    plain = structure(name='"A"', size='"1MiB"', overflow_threshold=50,
                      overflow_exit='"site:pick"')
    assert loads(plain).structure("A").overflow_exit == "site:pick"


# --- clients -------------------------------------------------------------------------


def test_client_secret_is_normalized_to_lowercase():
    """An uppercase hex digest is accepted and stored in lowercase."""
    text = ONE_STRUCTURE + ONE_CLIENT.replace(SECRET_DIGEST, SECRET_DIGEST.upper())
    assert loads(text).client("IMS1").secret_sha256 == SECRET_DIGEST


@pytest.mark.parametrize(("keys", "message"), [
    ({"secret_sha256": f'"{SECRET_DIGEST}"'}, "client[0].name: required key is missing"),
    ({"name": '"IMS1"'}, "client[0].secret_sha256: required key is missing"),
    ({"name": '"IMS 1"', "secret_sha256": f'"{SECRET_DIGEST}"'},
     'client[0].name: "IMS 1" is not a valid name: 1 to 16 of A-Z a-z 0-9 @ # $ _ . -'),
    ({"name": '"IMSCLIENT_TOO_LONG"', "secret_sha256": f'"{SECRET_DIGEST}"'},
     "is not a valid name"),
    ({"name": '""', "secret_sha256": f'"{SECRET_DIGEST}"'}, "is not a valid name"),
    ({"name": '"IMS1"', "secret_sha256": '"…"'},
     "client[0].secret_sha256: expected 64 hexadecimal digits"),
    ({"name": '"IMS1"', "secret_sha256": f'"{SECRET_DIGEST[:-1]}g"'}, "expected 64 hexadecimal"),
    ({"name": '"IMS1"', "secret_sha256": "1"}, "client[0].secret_sha256: expected a string, got 1"),
])
def test_client_key_is_checked(keys, message):
    """Each [[client]] key is required, typed and checked."""
    lines = "".join(f"{key} = {value}\n" for key, value in keys.items())
    [problem] = problems(ONE_STRUCTURE + "[[client]]\n" + lines)
    assert message in problem


def test_a_client_name_is_any_name_register_accepts():
    """[[client]] names follow the protocol's client-name rule, lower case and dots included."""
    text = ONE_STRUCTURE + ONE_CLIENT.replace('"IMS1"', '"ims.worker-1"')
    assert loads(text).client("ims.worker-1").secret_sha256 == SECRET_DIGEST


# --- duplicates, unknown keys, reporting ------------------------------------------------


def test_duplicate_names_are_refused():
    """Two structures or two clients with one name are refused, naming the first."""
    text = overflow_config(("A", None), ("B", None), ("A", None)) + ONE_CLIENT + ONE_CLIENT
    assert problems(text) == [
        'structure[2].name: "A" is already defined by structure[0]',
        'client[1].name: "IMS1" is already defined by client[0]',
    ]


def test_unknown_key_is_named_with_a_suggestion():
    """A misspelt key is refused, and the key it resembles is suggested."""
    assert problems(structure(name='"S1"', size='"1MiB"', sise='"2MiB"')) == [
        "structure[0].sise: unknown key (did you mean 'size'?)"]
    assert problems(daemon(max_client="3")) == [
        "daemon.max_client: unknown key (did you mean 'max_clients'?)"]
    assert problems(daemon(zzz="3")) == ["daemon.zzz: unknown key"]


def test_unknown_table_is_named_with_a_suggestion():
    """A misspelt table is refused, and so is a daemon key outside [daemon]."""
    assert problems("[demon]\n" + ONE_STRUCTURE) == [
        "demon: unknown table (did you mean 'daemon'?)"]
    assert problems("[[structures]]\n" + ONE_STRUCTURE) == [
        "structures: unknown table (did you mean 'structure'?)"]
    assert problems('data_dir = "x"\n' + ONE_STRUCTURE) == [
        "data_dir: unknown top-level key (did you mean to put it under [daemon]?)"]
    assert problems("daemon = 3\n" + ONE_STRUCTURE) == [
        "daemon: expected a table ([daemon]), got 3"]


def test_quoted_unknown_key_is_shown_quoted():
    """An unknown key that is not a bare TOML key is shown in quotes."""
    assert problems('[daemon]\n"max clients" = 3\n' + ONE_STRUCTURE) == [
        'daemon."max clients": unknown key (did you mean \'max_clients\'?)']


def test_all_problems_are_reported_together():
    """Every problem in a config is reported in one ConfigError, in document order."""
    text = (
        '[daemon]\nmax_clients = "many"\nmax_message = "2GiB"\nlog_level = "loud"\n'
        '[[structure]]\nname = "S1"\nsize = "64MiB"\ninitsize = "80MiB"\nsise = 1\n'
        '[[structure]]\nname = "S1"\nsize = "1MiB"\noverflow = "NOPE"\n'
    )
    assert problems(text) == [
        'daemon.max_clients: expected an integer, got "many"',
        "daemon.max_message: must be between 1B and 1GiB, got 2GiB",
        'daemon.log_level: expected one of debug, info, warning, error, got "loud"',
        "structure[0].sise: unknown key (did you mean 'size'?)",
        "structure[0].initsize: 80MiB is larger than size 64MiB",
        'structure[1].name: "S1" is already defined by structure[0]',
        "structure[1].overflow: no structure named NOPE is defined",
    ]


def test_error_message_names_the_file(tmp_path):
    """Each line of a file's ConfigError starts with the file's name."""
    path = tmp_path / "cqsd.toml"
    path.write_text('[daemon]\nmax_clients = 0\n[[structure]]\nname = "S1"\nsize = "64MiB"\n'
                    'initsize = "80MiB"\n')
    with pytest.raises(ConfigError) as info:
        load(path)
    assert info.value.source == str(path)
    assert str(info.value).splitlines() == [
        f"{path}: daemon.max_clients: must be between 1 and 1024, got 0",
        f"{path}: structure[0].initsize: 80MiB is larger than size 64MiB",
    ]


def test_bad_toml_is_reported_with_line_and_column(tmp_path):
    """A TOML syntax error names the file, the line and the column."""
    path = tmp_path / "cqsd.toml"
    path.write_text("[daemon]\nmax_clients = 3\nsome key = 4\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    [problem] = info.value.problems
    assert problem.startswith("not valid TOML: ")
    assert "(at line 3, column 6)" in problem
    assert str(info.value).startswith(f"{path}: not valid TOML: ")


def test_unreadable_files_are_named(tmp_path):
    """A missing file, a directory or non-UTF-8 bytes give a ConfigError naming the file."""
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read config file: No such file"):
        load(missing)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"[daemon]\n\xff\n")
    with pytest.raises(ConfigError, match=r"binary\.toml: not valid UTF-8 \(at byte 9\)"):
        load(binary)


def test_load_accepts_a_byte_order_mark(tmp_path):
    """A file saved with a UTF-8 byte order mark still loads."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + ONE_STRUCTURE.encode())
    assert load(path).structure("S1").size == 1024**2


def test_loads_names_its_source():
    """loads names the given source in its messages."""
    with pytest.raises(ConfigError) as info:
        loads(daemon(max_clients='"many"'), source="inline")
    assert str(info.value) == 'inline: daemon.max_clients: expected an integer, got "many"'


def test_exit_references_must_name_a_module_and_function():
    expected = r'structure\[0\]\.overflow_exit: expected "module:function"'
    with pytest.raises(ConfigError, match=expected):
        loads(structure(name='"S"', size='"1MiB"', overflow_exit='"no colon"'))
    c = loads(overflow_config(("S", "SOV"), ("SOV", None)).replace(
        'overflow = "SOV"', 'overflow = "SOV"\nqueue_space_exit = "site.exits:space"'))
    assert c.structure("S").queue_space_exit == "site.exits:space"


def test_spark_master_must_not_be_blank():
    with pytest.raises(ConfigError, match="daemon.spark_master: expected a Spark master URL"):
        loads(daemon(spark_master='" "'))


@pytest.mark.parametrize(("key", "value", "says"), [
    ("dsblock", '"12KiB"', "power of two"),
    ("dsblock", '"2MiB"', "between"),
    ("dsbufs", "0", "between"),
    ("offload", '"disk"', "expected one of none, smds"),
    ("dsexpand", '"yes"', "expected true or false"),
    ("offld1thr", "101", "between"),
    ("dssize", '"32GiB"', "larger than dsmax"),
])
def test_bad_smds_keys_are_named(tmp_path, key, value, says):
    """Each SMDS key of docs/smds.md is checked, and the error names the key and why."""
    path = tmp_path / "c.toml"
    path.write_text(f'[[structure]]\nname = "S"\nsize = "1MiB"\n{key} = {value}\n')
    with pytest.raises(config.ConfigError) as caught:
        load(path)
    assert f"structure[0].{key}" in str(caught.value) and says in str(caught.value)


# --- operations keys and client rights ------------------------------------------------


def test_socket_mode_group_and_monitoring_keys():
    """socket_mode takes TOML octal or an octal string, socket_group a name, metrics_listen
    an address; the defaults keep the socket 0600 and monitoring off."""
    assert (load(None).daemon.socket_mode, load(None).daemon.metrics_listen) == (0o600, "")
    d = loads(daemon(socket_mode="0o660", socket_group='"cqsd"',
                     metrics_listen='"127.0.0.1:9410"')).daemon
    assert (d.socket_mode, d.socket_group, d.metrics_listen) == (0o660, "cqsd", "127.0.0.1:9410")
    assert loads(daemon(socket_mode='"0640"')).daemon.socket_mode == 0o640


@pytest.mark.parametrize(("keys", "message"), [
    ({"socket_mode": "0o066"}, "daemon.socket_mode: the daemon's own user needs read and write"),
    ({"socket_mode": '"rw"'}, "daemon.socket_mode: expected permission bits"),
    ({"metrics_listen": '"9410"'}, "daemon.metrics_listen: expected \"host:port\""),
    ({"tls_client_ca": '"ca.pem"'}, "daemon.tls_client_ca: client certificates need TLS"),
])
def test_operations_keys_are_checked(keys, message):
    """Each new [daemon] key says what is wrong with a bad value."""
    assert any(p.startswith(message) for p in problems(daemon(**keys))), problems(daemon(**keys))


def test_client_rights_are_read():
    """structures, queues (both directions unless put_queues or read_queues say otherwise),
    operator and tls_cn; absent means unrestricted and no operator right."""
    text = ONE_STRUCTURE + ONE_CLIENT + 'structures = ["S1"]\nqueues = ["TRAN*"]\n' \
        'read_queues = ["LTERM*", "*"]\noperator = true\ntls_cn = "ims1.example"\n'
    c = loads(text).client("IMS1")
    assert (c.structures, c.put_queues, c.read_queues) == (("S1",), ("TRAN*",), ("LTERM*", "*"))
    assert (c.operator, c.tls_cn) == (True, "ims1.example")
    plain = loads(ONE_STRUCTURE + ONE_CLIENT).client("IMS1")
    assert (plain.structures, plain.put_queues, plain.read_queues, plain.operator) == (
        None, None, None, False)


@pytest.mark.parametrize(("lines", "message"), [
    ('structures = ["NOPE"]', "client[0].structures: no structure named NOPE"),
    ('queues = ["TR*AN"]', 'client[0].queues: "TR*AN" is not a queue pattern'),
    ('put_queues = "TRAN*"', "client[0].put_queues: expected an array of strings"),
    ('operator = "yes"', 'client[0].operator: expected true or false, got "yes"'),
])
def test_client_rights_are_checked(lines, message):
    """A right that cannot be meant is refused, naming the key."""
    found = problems(ONE_STRUCTURE + ONE_CLIENT + lines + "\n")
    assert any(p.startswith(message) for p in found), found


def test_a_client_names_a_primary_not_its_overflow():
    """Rights name the primary structure, which covers its overflow structure."""
    text = ('[[structure]]\nname = "P"\nsize = "1MiB"\noverflow = "POV"\n'
            '[[structure]]\nname = "POV"\nsize = "1MiB"\n' + ONE_CLIENT + 'structures = ["POV"]\n')
    assert problems(text) == ["client[0].structures: POV is the overflow structure of P: "
                              "name P, which covers both"]


def test_a_socket_group_this_host_lacks_is_refused_before_start(tmp_path):
    """check_host names a misspelled socket_group (with the group meant); ``cqsd run``
    exits 2 on it and leaves no socket and no data directory behind."""
    real = grp.getgrgid(os.getgid()).gr_name
    config.check_host(loads(daemon(socket_group=f'"{real}"')))
    config.check_host(loads(daemon(socket_group='"12345"')))  # a number is taken as is
    misspelled = real + "x"
    with pytest.raises(ConfigError, match=f"daemon.socket_group: no group named '{misspelled}'"
                       f".*did you mean '{real}'"):
        config.check_host(loads(daemon(socket_group=f'"{misspelled}"')))
    data, sock = tmp_path / "data", tmp_path / "s"
    path = tmp_path / "cqsd.toml"
    path.write_text(f'[daemon]\ndata_dir = "{data}"\nsocket = "{sock}"\n'
                    f'socket_group = "{misspelled}"\n[[structure]]\nname = "S"\nsize = "1MiB"\n')
    run = subprocess.run([sys.executable, "-m", "cqsd", "run", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "socket_group" in run.stderr and str(path) in run.stderr
    assert not sock.exists() and not data.exists()


def test_a_typed_queue_pattern_is_read_and_a_misspelled_type_refused():
    c = loads(ONE_STRUCTURE + ONE_CLIENT + 'put_queues = ["LTERM:REPLY*", "TRAN*", "A:B"]\n')
    assert c.clients[0].put_queues == ("LTERM:REPLY*", "TRAN*", "A:B")  # A is no type: a name
    found = problems(ONE_STRUCTURE + ONE_CLIENT + 'put_queues = ["LTRM:REPLY*"]\n')
    assert any("unknown queue type 'LTRM' (did you mean 'LTERM'?)" in p for p in found), found
    found = problems(ONE_STRUCTURE + ONE_CLIENT + 'put_queues = ["LTERM:REPLY*X"]\n')
    assert any("is not a queue pattern" in p for p in found), found
