"""A Spark standalone cluster for tests: a master and one worker from the installed
pyspark's ``spark-class``, on loopback with ephemeral ports, each awaited by the
log line that says it is up, and killed (with the executors the worker started)
at the end."""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import pyspark

from tests.daemon.harness import free_port

SPARK_HOME = Path(pyspark.__file__).parent
LOOPBACK = "127.0.0.1"
# Nothing binds beyond loopback (SPARK_LOCAL_IP: the RPC ports and the web UIs), and the
# master's REST submission server (a fixed port, 6066) is off.
ENV = {"SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": LOOPBACK,
       "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}


class Process:
    """A Spark daemon (a JVM run by spark-class) whose log lines are kept as they come."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env={**os.environ, **env},
            start_new_session=True)  # its own group: the executors the worker starts go with it
        self.lines: list[str] = []
        self._logged = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._logged:
                self.lines.append(line.rstrip())
                self._logged.notify_all()
        with self._logged:
            self._logged.notify_all()

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        """The first log line matching ``pattern``, once it is logged."""
        found: list[re.Match] = []

        def logged() -> bool:
            found[:] = [m for m in map(re.compile(pattern).search, self.lines) if m][:1]
            return bool(found) or self.proc.poll() is not None

        with self._logged:
            self._logged.wait_for(logged, timeout)
        if not found:
            raise AssertionError(f"spark {self.name} did not log {pattern!r}: {self.lines[-10:]}")
        return found[0]

    def matching(self, pattern: str) -> list[re.Match]:
        with self._logged:
            return [m for m in map(re.compile(pattern).search, self.lines) if m]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Cluster:
    """``master`` is its URL (spark://127.0.0.1:PORT); the worker has ``cores`` cores and
    ``memory`` for executors."""

    def __init__(self, cores: int = 1, memory: str = "1g") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="spark"))
        # The master's port is picked first so that both JVMs start at once (the
        # worker retries until the master is up): seconds saved on a busy machine.
        self.master = f"spark://{LOOPBACK}:{free_port()}"
        self.master_process = Process("master", [
            "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port",
            self.master.rpartition(":")[2], "--webui-port", "0"], ENV)
        self.worker = Process("worker", [
            "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK, "--port", "0",
            "--webui-port", "0", "--cores", str(cores), "--memory", memory,
            "--work-dir", str(self.dir / "work"), self.master], ENV)
        try:
            self.master_process.wait_for(r"elected leader")
            self.worker.wait_for(r"Successfully registered with master")
        except BaseException:
            self.stop()
            raise

    def executors(self) -> list[str]:
        """The applications the master launched an executor for on the worker, in order."""
        return [m.group(1) for m in self.master_process.matching(
            r"Launching executor (app-\S+?)/\d+ on worker")]

    def stop(self) -> None:
        for process in (self.worker, self.master_process):
            process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
