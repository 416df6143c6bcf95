"""TCP and TLS listeners, where registration always needs a secret; and log reopening."""

import hashlib
import json
import signal
import subprocess
import sys
import time

import pytest

import cqsclient
from cqsclient.errors import CQSError

from .harness import free_port

SECRET = "s3cret"
DIGEST = hashlib.sha256(SECRET.encode()).hexdigest()
CLIENT = f'[[client]]\nname = "IMS1"\nsecret_sha256 = "{DIGEST}"\n'


def test_tcp_needs_the_secret(make_daemon):
    """Over TCP a configured client registers with its secret; without it, it is refused."""
    port = free_port()
    d = make_daemon(f'tcp = "127.0.0.1:{port}"', extra=CLIENT).start()
    with pytest.raises(CQSError) as err:
        cqsclient.connect(f"tcp://127.0.0.1:{port}", client="IMS1")
    assert err.value.reason == "NOT_AUTHORIZED"
    with cqsclient.connect(f"tcp://127.0.0.1:{port}", client="IMS1", secret=SECRET) as c:
        s = c.structure("MSGQ01")
        s.put("NET", b"over tcp")
        assert s.read("NET").data == b"over tcp"
    assert d.events("register")


def tls_files(directory):
    """A self-signed certificate for 127.0.0.1 and its key, made in ``directory``."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True)
    return cert, key


def test_tls(make_daemon, tmp_path):
    """With a certificate and key, the TCP listener speaks TLS."""
    cert, key = tls_files(tmp_path)
    port = free_port()
    d = make_daemon(f'tcp = "127.0.0.1:{port}"\ntls_cert = "{cert}"\ntls_key = "{key}"',
                    extra=CLIENT).start()
    with cqsclient.connect(f"tls://127.0.0.1:{port}", client="IMS1", secret=SECRET,
                           cafile=str(cert)) as c:
        c.structure("MSGQ01").put("NET", b"over tls")
        assert c.structure("MSGQ01").read("NET").data == b"over tls"
    assert d.proc.poll() is None


def wait_for_line(path, event, timeout=20):
    """Read the log file until ``event`` appears (the daemon writes it; we observe)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if json.loads(line).get("event") == event:
                    return
        time.sleep(0.02)
    raise AssertionError(f"{event} never appeared in {path}")


def test_sighup_reopens_the_log_file(make_daemon):
    """After logrotate moves the file away, SIGHUP makes the daemon write a new one."""
    d = make_daemon()
    log = d.dir / "cqsd.log"
    text = d.config.read_text().replace("[daemon]\n", f'[daemon]\nlog_file = "{log}"\n', 1)
    d.config.write_text(text)
    proc = subprocess.Popen([sys.executable, "-m", "cqsd", "run", "--config", str(d.config)])
    try:
        wait_for_line(log, "ready")
        log.rename(d.dir / "cqsd.log.1")
        proc.send_signal(signal.SIGHUP)
        wait_for_line(log, "logs_reopened")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        wait_for_line(log, "stopped")
    finally:
        proc.kill()
