# cqsd chooses the build (compiled or source) of itself and of logstream when it
# is imported (cqsproto/native.py); import it before any test imports logstream
# alone, so that no test runs a stale compiled module.
import cqsd  # noqa: F401
