"""TLS on the TCP listener: TLS 1.2 at least, client certificates from the configured CA
mapped to client names, and certificates that SIGHUP replaces for new connections."""

import hashlib
import signal
import socket
import ssl
import subprocess

import pytest

import cqsclient
from cqsclient.errors import ConnectionLost, NotAuthorized
from cqsd.config import loads
from cqsd.server import tls

from .harness import free_port

SECRET = "s3cret"
DIGEST = hashlib.sha256(SECRET.encode()).hexdigest()


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class Pki:
    """A CA in ``directory`` and the certificates it signs."""

    def __init__(self, directory):
        self.dir = directory
        self.ca, self.ca_key = directory / "ca.pem", directory / "ca.key"
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                "/CN=test CA", "-keyout", str(self.ca_key), "-out", str(self.ca))

    def issue(self, name: str, cn: str, server: bool = False):
        key, csr, cert = (self.dir / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                "-keyout", str(key), "-out", str(csr))
        ext = self.dir / f"{name}.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1\n" if server else "basicConstraints=CA:FALSE\n")
        openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self.ca_key),
                "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert))
        return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def context(pki, cert=None, key=None, maximum=None):
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    if maximum is not None:
        ctx.maximum_version = maximum
    return ctx


def test_client_certificates_map_to_client_names(make_daemon, pki, tmp_path):
    """With tls_client_ca, a client without a certificate is not served, one whose
    certificate names another client is NOT_AUTHORIZED, the right one registers (over
    TLS 1.2 too); after SIGHUP new connections get the replaced server certificate."""
    server, server_key = pki.issue("server", "first", server=True)
    port = free_port()
    d = make_daemon(f'tcp = "127.0.0.1:{port}"\ntls_cert = "{server}"\ntls_key = "{server_key}"\n'
                    f'tls_client_ca = "{pki.ca}"',
                    extra=f'[[client]]\nname = "IMS1"\nsecret_sha256 = "{DIGEST}"\n'
                          f'[[client]]\nname = "IMS2"\nsecret_sha256 = "{DIGEST}"\n'
                          f'tls_cn = "ims2.example"\n').start()
    address = f"tls://127.0.0.1:{port}"
    ims1, ims1_key = pki.issue("ims1", "IMS1")
    ims2, ims2_key = pki.issue("ims2", "ims2.example")
    with pytest.raises(ConnectionLost):
        cqsclient.connect(address, client="IMS1", secret=SECRET, ssl_context=context(pki))
    with pytest.raises(NotAuthorized):
        cqsclient.connect(address, client="IMS1", secret=SECRET,
                          ssl_context=context(pki, ims2, ims2_key))
    for name, cert, key in (("IMS1", ims1, ims1_key), ("IMS2", ims2, ims2_key)):
        with cqsclient.connect(address, client=name, secret=SECRET,
                               ssl_context=context(pki, cert, key, ssl.TLSVersion.TLSv1_2)) as c:
            c.structure("MSGQ01").put("TLSQ", name.encode())
    assert d.events("tls_handshake_failed")
    second, second_key = pki.issue("server2", "second", server=True)
    server.write_bytes(second.read_bytes())
    server_key.write_bytes(second_key.read_bytes())
    before = d.mark()
    d.proc.send_signal(signal.SIGHUP)
    assert "daemon.tls_cert" not in d.wait_for("reloaded", after=before)[0]["restart_needed"]
    with socket.create_connection(("127.0.0.1", port)) as raw, context(
            pki, ims1, ims1_key).wrap_socket(raw, server_hostname="127.0.0.1") as s:
        assert tls.common_name(s.getpeercert()) == "second"


def test_the_server_context_refuses_below_tls_1_2(pki):
    """The listener's context sets TLS 1.2 as its minimum and, with a client CA, requires
    a client certificate."""
    server, key = pki.issue("server3", "third", server=True)
    d = loads(f'[daemon]\ntcp = "127.0.0.1:1"\ntls_cert = "{server}"\ntls_key = "{key}"\n'
              f'tls_client_ca = "{pki.ca}"\n[[structure]]\nname = "S"\nsize = "1MiB"\n'
              f'[[client]]\nname = "A"\nsecret_sha256 = "{DIGEST}"\n').daemon
    ctx = tls.context(d)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_REQUIRED
