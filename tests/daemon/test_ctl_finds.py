"""cqsctl with no flags on a daemon whose config it is pointed at (``$CQSD_CONFIG``),
as on the service layout: it finds the socket there, and its user is let in as an
operator by its peer credentials (``operator_users``), or names itself from the
profile; a refusal names the peer in the daemon's log."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

import cqsclient
from cqsclient.errors import NotAuthorized

SECRET = "ops-secret"
OPS = (f'[[client]]\nname = "OPS"\nsecret_sha256 = "{hashlib.sha256(SECRET.encode()).hexdigest()}"'
       '\noperator = true\n')
APP = (f'[[client]]\nname = "APP"\nsecret_sha256 = "{hashlib.sha256(b"x").hexdigest()}"\n')


def bare_ctl(d, home, *args):
    """cqsctl as a new operator runs it: no flags, only $CQSD_CONFIG."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "CQSD_CONFIG": str(d.config),
           "PYTHONPATH": ":".join(sys.path)}
    return subprocess.run([sys.executable, "-m", "cqsclient.ctl", *args], cwd=home, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_operators_user_needs_no_flags(make_daemon, tmp_path):
    d = make_daemon(f'operator_users = ["{os.getuid()}"]\nlog_level = "debug"',
                    extra=OPS + APP).start()
    run = bare_ctl(d, tmp_path, "--json", "status")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["state"] == "ready"
    registered = d.wait_for("register", operator=True)[-1]
    assert registered["peer"].startswith(f"unix:uid={os.getuid()},pid=")


def test_others_are_refused_by_name_and_peer_or_use_their_profile(make_daemon, tmp_path):
    """Without operator_users a bare cqsctl is refused, logged with its peer; a profile
    naming the operator client and its secret file lets it in."""
    d = make_daemon("operator_users = []", extra=OPS + APP).start()
    before = d.mark()
    run = bare_ctl(d, tmp_path, "status")
    assert run.returncode == 1 and "NOT_AUTHORIZED" in run.stderr
    refused = d.wait_for("not_authorized", after=before)[-1]
    assert refused["peer"].startswith(f"unix:uid={os.getuid()},pid=")
    (tmp_path / "ops.secret").write_text(SECRET + "\n")
    profile = tmp_path / ".config" / "cqsd" / "cqsctl.toml"
    profile.parent.mkdir(parents=True)
    profile.write_text('client = "OPS"\nsecret_file = "~/ops.secret"\n')
    run = bare_ctl(d, tmp_path, "status")
    assert run.returncode == 0, run.stderr
    assert "ready" in run.stdout


def test_an_application_is_not_an_operator_by_its_user(make_daemon):
    """Peer credentials admit operator sessions only: an application still needs its
    secret, whoever runs it."""
    d = make_daemon(f'operator_users = ["{os.getuid()}"]', extra=OPS + APP).start()
    with pytest.raises(NotAuthorized):
        cqsclient.connect(d.address, client="APP")


SDK_PROGRAM = """
import cqsclient
with cqsclient.connect() as c:
    print(c.structure("MSGQ01").put("PAYROLL", b"from the environment"))
"""


def test_the_sdk_takes_its_name_and_secret_from_the_environment(make_daemon, tmp_path):
    """An application holding no name and no secret: $CQSD_CLIENT, $CQSD_SECRET_FILE
    and $CQSD_ADDRESS give them; a wrong secret is refused."""
    app = (f'[[client]]\nname = "PAYROLL"\n'
           f'secret_sha256 = "{hashlib.sha256(b"pay-secret").hexdigest()}"\n'
           'put_queues = ["PAY*"]\n')
    d = make_daemon("operator_users = []", extra=OPS + app).start()
    (tmp_path / "secret").write_text("pay-secret\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), "CQSD_ADDRESS": d.address,
           "CQSD_CLIENT": "PAYROLL", "CQSD_SECRET_FILE": str(tmp_path / "secret")}
    run = subprocess.run([sys.executable, "-c", SDK_PROGRAM], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) > 0
    run = subprocess.run([sys.executable, "-c", SDK_PROGRAM], env={**env, "CQSD_SECRET": "no"},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "NotAuthorized" in run.stderr


def test_queue_patterns_match_names_or_a_type_and_names(make_daemon):
    """put_queues = ["LTERM*"] is LTERM1 of any type, never REPLY1 of type LTERM, which
    "LTERM:REPLY*" allows, and only of type LTERM; a refusal names the patterns."""
    front = (f'[[client]]\nname = "FRONT"\nsecret_sha256 = "{hashlib.sha256(b"f").hexdigest()}"'
             '\nput_queues = ["LTERM*", "LTERM:REPLY*"]\nread_queues = ["LTERM:REPLY*"]\n')
    d = make_daemon(extra=OPS + front).start()
    with cqsclient.connect(d.address, client="FRONT", secret="f") as c:
        s = c.structure("MSGQ01")
        s.put("LTERM1", b"by name", qtype="TRAN")
        s.put("REPLY1", b"by type and name", qtype="LTERM")
        assert s.read("REPLY1", qtype="LTERM").data == b"by type and name"
        with pytest.raises(NotAuthorized, match=r"allowed queue names: LTERM\*,LTERM:REPLY\*"):
            s.put("REPLY1", b"another type", qtype="TRAN")
        with pytest.raises(NotAuthorized):
            s.read("REPLY1", qtype="TRAN")
