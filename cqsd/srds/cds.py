"""Class data sharing for the jobs' driver JVM: the classes an earlier job loaded,
mapped from an archive instead of loaded and verified again.

Design note. A job's JVM spent most of its start loading Spark's classes: on two
cores a bare session took 6.3 s to start and 3.4 s to run its first task, 12.2 s
of CPU in all; mapping the classes of an earlier job's JVM (Java's dynamic CDS
archive) made it 3.4 s, 2.5 s and 7.8 s. The archive belongs to one JDK and one
Spark, so it is kept per machine, in a cache directory (``directory``), named for
both. The first job to find none writes it as its JVM exits (which makes that one
job about 15 s slower) while it holds the directory's lock, so one job writes and
the others go on without; it is published by a rename only once its JVM exited
cleanly, so a job killed while writing leaves no archive a JVM would map.
Everything here is best effort: a cache that cannot be written, a JDK with no
base archive, or an archive the JVM refuses (it checks the JDK and the class
path, and runs without) cost the speed, never the job. An archive of a JDK or
Spark no longer installed stays until it is deleted by hand. Java 19's
``-XX:+AutoCreateSharedArchive`` does all this itself; the JDK Debian 12 ships is 17.
"""

import atexit
import fcntl
import hashlib
import os
import shutil
from pathlib import Path

QUIET = "-Xlog:cds*=off"  # a refused archive is a slower start, not a warning on stdout


def directory() -> Path:
    """The cache directory: systemd's ``CacheDirectory=`` (docs/operations.md), else
    ``$XDG_CACHE_HOME/cqsd``, else ``~/.cache/cqsd``."""
    if os.environ.get("CACHE_DIRECTORY"):
        return Path(os.environ["CACHE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cqsd"


def options(spark_home: str) -> str:
    """The driver JVM options that map this JDK's and Spark's archive, or (the first
    time, one job at a time) write it at the JVM's exit; empty when neither can be."""
    try:
        archive = archive_of(spark_home)
        if archive is None:
            return ""
        where = archive.parent
        where.mkdir(parents=True, exist_ok=True)
        if archive.is_file():
            return _mapping(archive)
        lock = os.open(where / "spark-classes.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return ""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)  # another job is writing it
        return ""
    for stale in where.glob("spark-classes-*.jsa.*"):
        stale.unlink(missing_ok=True)  # a killed writer's
    written = archive.with_name(f"{archive.name}.{os.getpid()}")
    atexit.register(_publish, written, archive, lock)
    return f"-XX:ArchiveClassesAtExit={written} {QUIET}"


def executor_options(spark_home: str) -> str:
    """The executors' JVM options: the driver's archive mapped, if there is one. Their
    class path is the driver's, so they map it as it does (a standalone cluster's
    executor took 2.2-2.9 s to its first task, against 4.2-4.8 s); an executor on
    another machine, where the file is missing or of another JDK, runs without."""
    try:
        archive = archive_of(spark_home)
        return _mapping(archive) if archive is not None and archive.is_file() else ""
    except OSError:
        return ""


def archive_of(spark_home: str) -> Path | None:
    """Where the archive of this JDK and this Spark is, or goes; None without a java.
    Raises OSError if the JDK or Spark cannot be looked at."""
    java = _java()
    return None if java is None else directory() / f"spark-classes-{_key(java, spark_home)}.jsa"


def _mapping(archive: Path) -> str:
    return f"-XX:SharedArchiveFile={archive} {QUIET}"


def _publish(written: Path, archive: Path, lock: int) -> None:
    """At the job's exit, once its JVM has ended (``session``'s exit handler, which
    runs first), publish the archive it wrote if it exited cleanly."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    try:
        if proc is not None and proc.poll() == 0 and written.is_file():
            os.replace(written, archive)
    except OSError:
        pass  # no archive this time; the next job writes it
    finally:
        written.unlink(missing_ok=True)
        os.close(lock)


def _java() -> Path | None:
    """The java pyspark starts: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def _key(java: Path, spark_home: str) -> str:
    """Names the JDK and the Spark an archive holds classes of (by path and time)."""
    jars = Path(spark_home) / "jars"
    parts = [str(java), str(java.stat().st_mtime_ns), str(jars.resolve()),
             str(jars.stat().st_mtime_ns if jars.exists() else 0)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
