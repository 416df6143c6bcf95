import pytest

from .harness import Daemon, MountNamespace


@pytest.fixture
def daemon():
    d = Daemon().start()
    yield d
    d.cleanup()


@pytest.fixture
def make_daemon():
    made = []

    def make(*args, **kw):
        d = Daemon(*args, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.cleanup()


@pytest.fixture
def namespace():
    """A mount namespace of its own, for small and read-only filesystems."""
    ns = MountNamespace()
    yield ns
    ns.close()
