import pytest

from .etcdserver import EtcdServer


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    """A real etcd on loopback for this module's tests, stopped after them."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()
