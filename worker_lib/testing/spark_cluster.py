"""A standalone Spark cluster on loopback for tests: a master and workers started from PySpark's own ``spark-class``,
each a JVM of its own, and the job submitted with PySpark's ``spark-submit`` — what an EMR or a self-run cluster
does, on one machine.

    with SparkCluster(tmp_path, workers=2, cores_per_worker=1) as cluster:
        submitted = cluster.submit("job", "job.py", "--flag", archives=["env.tar.gz#environment"], conf={...})
        ...
        cluster.executor_pids()       # the executors' JVMs (CoarseGrainedExecutorBackend), to kill one

Everything runs in sessions of its own through :class:`~worker_lib.testing.processes.ProcessFleet` and is killed by
PID on exit, whatever the test did. Needs the ``spark`` extra (pyspark) and a Java runtime.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from worker_lib.core.errors import ShardleaseError
from worker_lib.testing.processes import FleetProcess, ProcessFleet

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


class SparkClusterError(ShardleaseError):
    """The cluster did not come up (its processes' logs say why)."""


def spark_home() -> Path:
    """PySpark's own Spark distribution (``bin/spark-class``, ``bin/spark-submit``, ``sbin``, ``jars``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class SparkCluster:
    """A master and ``workers`` workers of ``cores_per_worker`` cores and ``memory`` each (see the module)."""

    def __init__(
        self,
        work_dir: Path,
        *,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory: str = "1g",
        env: Mapping[str, str] | None = None,
        submit_dir: Path | None = None,
        start_timeout_s: float = 90.0,
    ) -> None:
        self.work_dir = work_dir
        self.workers, self.cores_per_worker, self.memory = workers, cores_per_worker, memory
        self.start_timeout_s = start_timeout_s
        self.home = spark_home()
        base = {k: v for k, v in (env if env is not None else os.environ).items() if k not in ("PYTHONPATH",)}
        self.env = {
            **base,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(work_dir / "spark-logs"),
            "SPARK_NO_DAEMONIZE": "1",
        }
        work_dir.mkdir(parents=True, exist_ok=True)
        # Every process starts in ``submit_dir`` (where a client-mode driver finds what it was given, e.g. an
        # unpacked ./environment); the cluster's own processes do not mind.
        self.fleet = ProcessFleet(work_dir, env=self.env, cwd=submit_dir or work_dir, log_level="WARNING")
        self.master_port = free_port()
        self.master_ui_port = free_port()

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    # --- lifecycle ------------------------------------------------------------------------------------------------

    def __enter__(self) -> SparkCluster:
        self.fleet.__enter__()
        try:
            self._start()
        except BaseException:
            self.fleet.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.fleet.__exit__(exc_type, exc, tb)

    def _start(self) -> None:
        spark_class = str(self.home / "bin" / "spark-class")
        self.fleet.start(
            "spark-master",
            [
                spark_class,
                MASTER_CLASS,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_ui_port),
            ],
        )
        for n in range(self.workers):
            work = self.work_dir / f"spark-worker-{n}"
            work.mkdir(parents=True, exist_ok=True)
            self.fleet.start(
                f"spark-worker-{n}",
                [
                    spark_class,
                    WORKER_CLASS,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.cores_per_worker),
                    "--memory",
                    self.memory,
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(work),
                    self.master_url,
                ],
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            state = self.master_state()
            alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
            if len(alive) >= self.workers:
                return
            for process in self.fleet.processes.values():
                if not process.alive():
                    raise SparkClusterError(f"{process.name} exited: see {process.log_path}")
            time.sleep(0.5)
        raise SparkClusterError(
            f"{self.workers} Spark workers did not register within {self.start_timeout_s:.0f} s (logs in "
            f"{self.work_dir})"
        )

    def master_state(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications); empty while it is not up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=2) as reply:
                state: dict[str, Any] = json.loads(reply.read())
                return state
        except OSError:
            return {}

    # --- jobs -----------------------------------------------------------------------------------------------------

    def submit(
        self,
        name: str,
        script: str | Path,
        *args: str,
        archives: Sequence[str] = (),
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> FleetProcess:
        """``spark-submit --master <this cluster> --deploy-mode client [--archives …] [--conf …] script args``."""
        command = [str(self.home / "bin" / "spark-submit"), "--master", self.master_url, "--deploy-mode", "client"]
        if archives:
            command += ["--archives", ",".join(archives)]
        for key, value in (conf or {}).items():
            command += ["--conf", f"{key}={value}"]
        return self.fleet.start(name, [*command, str(script), *args], env=env, role="spark-submit")

    def driver_pid(self, name: str, script: str | Path) -> int:
        """The pid of a submitted job's Python driver running ``script`` (client mode: a child of ``spark-submit``'s
        JVM, beside the Python workers the JVM starts for itself). A signal meant for the job goes there: the JVM's
        own SIGTERM handler stops the SparkContext under it."""
        parent = self.fleet.processes[name].pid
        for pid, ppid in _processes():
            if ppid == parent and _runs(pid, Path(script).name):
                return pid
        raise SparkClusterError(f"{name} has no Python driver process running {script} (yet)")

    def executor_pids(self) -> list[int]:
        """The pids of the executor JVMs the workers launched (children of our worker processes)."""
        workers = {p.pid for p in self.fleet.processes.values() if p.name.startswith("spark-worker-") and p.alive()}
        return sorted(pid for pid, parent in _processes() if parent in workers and _runs(pid, EXECUTOR_CLASS))


def _processes() -> Iterable[tuple[int, int]]:
    """(pid, parent pid) of every process (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        yield int(entry.name), int(fields[1])


def _runs(pid: int, main_class: str) -> bool:
    try:
        return main_class.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
