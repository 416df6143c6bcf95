# cqsd chooses the build (compiled or source) of itself and of logstream when it
# is imported (cqsproto/native.py); import it before any test imports logstream
# alone, so that no test runs a stale compiled module.
import cqsd  # noqa: F401

# `make test` spreads whole files over its workers in the order collected
# (--dist loadfile --no-loadscope-reorder). The directories whose files start
# daemons, Spark jobs and fault loops go first, so the suite ends on the many
# short unit files on both workers, not on one long file while the other waits.
FIRST = ("daemon", "group", "srds", "faults")


def pytest_collection_modifyitems(items):
    def rank(item):
        top = item.nodeid.split("/")[1] if item.nodeid.startswith("tests/") else ""
        return FIRST.index(top) if top in FIRST else len(FIRST)

    items.sort(key=rank)
