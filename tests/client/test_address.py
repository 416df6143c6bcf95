"""Tests for cqsclient.address: the unix, tcp and tls forms and the default."""

from __future__ import annotations

import pytest

from cqsclient.address import DEFAULT_ADDRESS, parse_address


@pytest.mark.parametrize(
    ("text", "scheme", "path", "host", "port"),
    [
        ("unix:///run/cqsd/cqsd.sock", "unix", "/run/cqsd/cqsd.sock", "", 0),
        ("unix://./cqsd-data/cqsd.sock", "unix", "./cqsd-data/cqsd.sock", "", 0),
        ("unix://rel.sock", "unix", "rel.sock", "", 0),
        ("tcp://127.0.0.1:7410", "tcp", "", "127.0.0.1", 7410),
        ("tls://cqs.example.com:7411", "tls", "", "cqs.example.com", 7411),
        ("tcp://[::1]:7410", "tcp", "", "::1", 7410),
    ],
)
def test_address_forms(text, scheme, path, host, port):
    """Each documented address form parses into its scheme and path or host and port."""
    address = parse_address(text)
    assert (address.scheme, address.path, address.host, address.port) == (scheme, path, host, port)
    assert str(address) == text


@pytest.mark.parametrize(
    "text",
    ["/run/cqsd.sock", "http://x:1", "unix://", "tcp://host", "tcp://host:0", "tcp://host:http",
     "tcp://:7410", "tcp://[::1]7410"],
)
def test_bad_addresses_are_refused_with_a_reason(text):
    """A malformed address is a ValueError quoting it."""
    with pytest.raises(ValueError, match="address"):
        parse_address(text)


def test_default_address_comes_from_the_environment(monkeypatch):
    """With no address, $CQSD_ADDRESS is used, else the embedded default's socket."""
    monkeypatch.delenv("CQSD_ADDRESS", raising=False)
    assert parse_address(None).text == DEFAULT_ADDRESS == "unix://./cqsd-data/cqsd.sock"
    monkeypatch.setenv("CQSD_ADDRESS", "tcp://h:1")
    assert parse_address(None).text == "tcp://h:1"
