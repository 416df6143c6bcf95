"""SIGHUP: reopen the log file, and re-read the config file to apply what can change
without a restart.

What reloads: the ``[[client]]`` list (names, secrets, rights), ``log_level``,
``log_file`` and the TLS certificate, key and client CA (re-read on every
SIGHUP, so certificates renewed in place are picked up; for connections made
from then on). A registered session's rights change at once; a session whose
client is no longer listed (or lost the operator right its operator session
needs) is cut off. Everything else that differs from the running config is
named in a ``restart_needed`` event and left as it runs; a file that does not
load is named in ``reload_failed`` and nothing changes.

``changes`` is pure: what differs, split into what reloads and what needs a
restart; ``apply`` is the daemon's side.
"""

from __future__ import annotations

import dataclasses
import ssl

import structlog

from .. import logs
from ..config import Config, ConfigError, load
from . import notify
from .connections import Connections
from .rooms import Rooms

log = structlog.get_logger()
RELOADABLE = ("log_level", "log_file", "tls_cert", "tls_key", "tls_client_ca", "operator_users")
TLS = ("tls_cert", "tls_key", "tls_client_ca")


def changes(old: Config, new: Config) -> tuple[list[str], list[str]]:
    """(keys that reload, keys that need a restart) where ``new`` differs from ``old``."""
    reload: list[str] = []
    restart: list[str] = []
    for field in dataclasses.fields(old.daemon):
        key = field.name
        if getattr(old.daemon, key) == getattr(new.daemon, key):
            continue
        # TLS on or off changes the listener itself
        tls_switched = key in TLS and bool(old.daemon.tls_cert) != bool(new.daemon.tls_cert)
        (reload if key in RELOADABLE and not tls_switched else restart).append(f"daemon.{key}")
    if old.clients != new.clients:
        reload.append("client")
    old_structures = {s.name: s for s in old.structures}
    for s in new.structures:
        if old_structures.pop(s.name, None) != s:
            restart.append(f"structure {s.name}")
    restart += [f"structure {name}" for name in old_structures]
    return reload, restart


def merged(old: Config, new: Config, reload: list[str]) -> Config:
    """``old`` with the reloadable keys of ``new``: what the daemon runs with now."""
    keys = {k.removeprefix("daemon."): getattr(new.daemon, k.removeprefix("daemon."))
            for k in reload if k.startswith("daemon.")}
    return dataclasses.replace(old, daemon=dataclasses.replace(old.daemon, **keys),
                               clients=new.clients)


def signalled(d: Rooms, connections: Connections) -> dict:
    """A SIGHUP: reopen the log, read the file, and tell systemd the truth of it."""
    new = _read(d)
    if isinstance(new, dict):
        notify.status(f"reload failed: {new['problems'][0]}; running the previous "
                      "configuration (see the reload_failed event)")
        return new
    notify.reloading()
    result = apply(d, connections, new)
    said = "reloaded"
    if "tls_error" in result:
        said += "; the TLS certificates did not load and stay as they were"
    if result["restart_needed"]:
        said += f"; {len(result['restart_needed'])} change(s) wait for a restart"
    notify.ready(said)
    return result


def _read(d: Rooms) -> Config | dict:
    """Reopen the log and load the file; a reload_failed result if it does not load."""
    if d.life.log_sink is not None:
        d.life.log_sink.reopen()
    log.info("logs_reopened")
    try:
        return load(d.life.config_path)
    except ConfigError as err:
        log.error("reload_failed", problems=err.problems, action="nothing changed")
        return {"reloaded": [], "restart_needed": [], "error": str(err),
                "problems": err.problems}


def apply(d: Rooms, connections: Connections, new: Config) -> dict:
    """Apply ``new`` (the config file, read again) into ``d.config``, and reload
    ``connections``' TLS certificates; returns what was reloaded and what needs a
    restart."""
    reload, restart = changes(d.config.current, new)
    config = merged(d.config.current, new, reload)
    tls_error = None
    if config.daemon.tls_cert and "daemon.tls_cert" not in restart:
        try:  # re-read even when the paths are the same: certificates renewed in place
            connections.reload_tls(config.daemon)
            reload.append("tls certificates")
        except (OSError, ssl.SSLError) as err:
            log.error("reload_failed", problems=[f"TLS: {err}"],
                      action="the TLS certificates stay as they were")
            reload = [k for k in reload if k.removeprefix("daemon.") not in TLS]
            config = merged(d.config.current, new, reload)
            tls_error = str(err)
    _install(d, config)
    if restart:
        log.warning("restart_needed", keys=restart,
                    action="these changes take effect at the next restart; a structure's "
                           "size and initsize are the repository's until cqsctl rebuild "
                           "applies the config's")
    log.info("reloaded", reloaded=reload, restart_needed=restart)  # the last word of a reload
    result = {"reloaded": reload, "restart_needed": restart}
    return result if tls_error is None else {**result, "tls_error": tls_error}


def _install(d: Rooms, config: Config) -> None:
    d.config.install(config)  # the one place every room reads it from
    sink = d.life.log_sink
    if sink is not None and sink.path != config.daemon.log_file:
        sink.path = config.daemon.log_file
        sink.reopen()
    logs.set_level(config.daemon.log_level)
    d.clients.reauthorize()
