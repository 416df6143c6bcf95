"""Tests for cqsproto.names: the one client-name rule, and everyone who checks a name uses it."""

import pytest

from cqsproto import CLIENT_NAME


@pytest.mark.parametrize("name", ["IMS1", "A", "ims.worker-1", "X" * 16, "@#$_.-"])
def test_names_register_accepts(name):
    """1 to 16 of A-Z a-z 0-9 @ # $ _ . - is a client name."""
    assert CLIENT_NAME.fullmatch(name)


@pytest.mark.parametrize("name", ["", "X" * 17, "IMS 1", "IMS1\n", "a/b", "é"])
def test_names_register_refuses(name):
    """Empty, too long, or any other character is not."""
    assert not CLIENT_NAME.fullmatch(name)


def test_the_daemon_the_config_and_cqsctl_share_the_rule():
    """register, [[client]] and cqsctl --client check with the same pattern object."""
    from cqsclient import ctl
    from cqsd import config
    from cqsd.server import clients

    assert clients.CLIENT_NAME is ctl.CLIENT_NAME is CLIENT_NAME
    assert config._client_name("ims.worker-1") == "ims.worker-1"
