"""The jobs' driver JVM shares its classes through an archive in the cache directory
(cqsd/srds/cds.py, docs/srds.md "The jobs"): the first job writes it as its JVM
exits, the next JVMs map it, and nothing about it can fail a job."""

import fcntl
import os
import subprocess
import sys

import pytest

from cqsd.srds import cds

# A job in a fresh interpreter: one task, then whether its JVM maps an archive in
# the cache directory (argv[1]).
JOB = """
import sys
from pyspark import SparkContext
from cqsd.srds import session
spark = session.start("local[1]")
assert spark.sparkContext.parallelize([1, 2], 1).count() == 2
jvm = SparkContext._gateway.proc.pid  # spark-submit execs the JVM
print(any(sys.argv[1] in line for line in open(f"/proc/{jvm}/maps")))
spark.stop()
"""


def cached(tmp_path, monkeypatch):
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "cqsd"


def job(cache) -> bool:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache.parent)}
    env.pop("CACHE_DIRECTORY", None)
    done = subprocess.run([sys.executable, "-c", JOB, str(cache)], env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.strip().splitlines()[-1] == "True"


def test_the_first_job_writes_the_archive_as_its_jvm_exits_and_the_next_maps_it(tmp_path):
    cache = tmp_path / "cqsd"
    assert job(cache) is False  # no archive yet: this JVM writes it
    [archive] = cache.glob("spark-classes-*.jsa")
    assert archive.stat().st_size > 10 * 2**20
    assert list(cache.glob("*.jsa.*")) == []  # the JVM's file, renamed into place
    assert job(cache) is True


def test_a_job_finding_the_lock_held_runs_without_the_next_writes_and_the_one_after_maps(
        tmp_path, monkeypatch):
    cache = cached(tmp_path, monkeypatch)
    cache.mkdir()
    killed = cache / "spark-classes-0123456789abcdef.jsa.4242"
    killed.write_bytes(b"half an archive")
    held = os.open(cache / "spark-classes.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    assert cds.options(spark_home()) == ""
    assert killed.exists()  # it may be the holder's own
    os.close(held)
    published = []
    monkeypatch.setattr(cds.atexit, "register", lambda *args: published.append(args))
    written = cds.options(spark_home())
    [(_, path, archive, lock)] = published
    os.close(lock)
    assert written == f"-XX:ArchiveClassesAtExit={path} {cds.QUIET}"
    assert not killed.exists()
    assert (path.parent, archive.parent) == (cache, cache)
    archive.write_bytes(b"")  # as if that writer published it
    assert cds.options(spark_home()) == f"-XX:SharedArchiveFile={archive} {cds.QUIET}"


def test_executors_map_the_archive_there_is_and_never_write_one(tmp_path, monkeypatch):
    """On a cluster the executors get the driver's archive to map, if there is one;
    without one they run as before: writing it is the driver's (options above)."""
    cache = cached(tmp_path, monkeypatch)
    monkeypatch.setattr(cds.atexit, "register", lambda *args: pytest.fail("an executor wrote"))
    assert cds.executor_options(spark_home()) == ""
    cache.mkdir()
    assert cds.executor_options(spark_home()) == ""
    archive = cds.archive_of(spark_home())
    assert archive.parent == cache
    archive.write_bytes(b"")
    assert cds.executor_options(spark_home()) == f"-XX:SharedArchiveFile={archive} {cds.QUIET}"


def test_a_cache_that_cannot_be_written_leaves_the_jvm_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    cached(tmp_path / "file", monkeypatch)
    assert cds.options(spark_home()) == ""


def test_the_service_managers_cache_directory_comes_first(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CACHE_DIRECTORY", f"{tmp_path}/svc:{tmp_path}/other")
    assert cds.directory() == tmp_path / "svc"
    monkeypatch.delenv("CACHE_DIRECTORY")
    assert cds.directory() == tmp_path / "xdg" / "cqsd"


def spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()
