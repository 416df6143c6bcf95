"""What a SIGHUP reload may apply and what waits for a restart, as a pure comparison."""

import hashlib

from cqsd.config import loads
from cqsd.server.reload import changes, merged

DIGEST = hashlib.sha256(b"pw").hexdigest()
BASE = '[daemon]\n{daemon}\n[[structure]]\nname = "S"\nsize = "{size}"\n{clients}'


def config(daemon="", size="1MiB", clients=""):
    return loads(BASE.format(daemon=daemon, size=size, clients=clients))


def test_clients_and_log_settings_reload():
    """A new client list, log level and log file reload; nothing needs a restart."""
    old = config()
    new = config('log_level = "debug"\nlog_file = "/tmp/x.log"',
                 clients=f'[[client]]\nname = "A"\nsecret_sha256 = "{DIGEST}"\n')
    reload, restart = changes(old, new)
    assert set(reload) == {"daemon.log_level", "daemon.log_file", "client"} and restart == []
    now = merged(old, new, reload)
    assert now.daemon.log_level == "debug" and now.clients == new.clients


def test_everything_else_needs_a_restart_and_stays():
    """max_clients and a structure's size are named for a restart and keep their value."""
    old, new = config(), config("max_clients = 8", size="2MiB")
    reload, restart = changes(old, new)
    assert reload == [] and restart == ["daemon.max_clients", "structure S"]
    assert merged(old, new, reload) == old
