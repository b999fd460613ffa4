"""One benchmark fleet on this machine: moto (DynamoDB) and kinesalite (Kinesis) on loopback, the tables, an
8-shard stream, a producer thread, worker processes and a leader host (``shardlease leader`` or the Lambda
handler on a 1-minute schedule). Every child runs in its own session and is killed by PID at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import coordinator_state_table_name, lease_table_name
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.commands import leader_command, shardlease_command, worker_command
from worker_lib.testing.emulators import Emulator, start_kinesalite, start_moto
from worker_lib.testing.streams import create_stream, list_all_shards
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

from .journal import JournalTail
from .processor import JOURNAL_DIR_ENV, SPEC, WORKER_ID_ENV

REPO = Path(__file__).resolve().parents[2]
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}
# Not passed on to children: our own settings come from the benchmark only, and no real AWS identity is used.
_DROPPED_ENV_PREFIXES = ("SHARDLEASE_", "POWERTOOLS_")
_DROPPED_ENV = {"AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_CONFIG_FILE", "AWS_ROLE_ARN"}
LAMBDA_PERIOD_S = 60.0

Say = Callable[[str], None]


# --- every child process of the benchmark, for clean-up -------------------------------------------------------


class Children:
    """Every process the benchmark started; :meth:`kill_all` SIGKILLs each one's process group (by PID)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: list[subprocess.Popen[bytes]] = []
        self._emulators: list[Emulator] = []

    def add(self, process: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._processes.append(process)

    def add_emulator(self, emulator: Emulator) -> None:
        with self._lock:
            self._emulators.append(emulator)

    def kill_all(self) -> None:
        with self._lock:
            processes, emulators = list(self._processes), list(self._emulators)
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGCONT)  # a stopped process must be able to die
                    os.killpg(process.pid, signal.SIGKILL)
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for emulator in emulators:
            with contextlib.suppress(Exception):
                emulator.stop()


CHILDREN = Children()


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_ENV_PREFIXES) and k not in _DROPPED_ENV}
    env.update(AWS_ENV)
    return env


# --- producer ----------------------------------------------------------------------------------------------


class Producer:
    """One record to each shard every ``period_s`` (ExplicitHashKey = the shard's starting hash key); payload
    and partition key = a unique id ``<shard>:<n>``. Remembers every id Kinesis accepted, with its wall time."""

    def __init__(self, kinesis: Any, stream: str, shards: Mapping[str, str], *, period_s: float = 0.2) -> None:
        self.kinesis, self.stream, self.shards, self.period_s = kinesis, stream, dict(shards), period_s
        self.produced: dict[str, tuple[str, float]] = {}  # record id -> (shard, wall time of the put)
        self.errors = 0
        self.misrouted = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def snapshot(self) -> dict[str, tuple[str, float]]:
        with self.lock:
            return dict(self.produced)

    def _run(self) -> None:
        start = time.monotonic()
        tick = 0
        while not self._stop.is_set():
            batch = [
                {"Data": f"{shard}:{tick}".encode(), "PartitionKey": f"{shard}:{tick}", "ExplicitHashKey": key}
                for shard, key in sorted(self.shards.items())
            ]
            wall = time.time()
            try:
                reply = self.kinesis.put_records(StreamName=self.stream, Records=batch)
            except Exception:  # the emulator is slow or busy: those ids are simply never produced
                self.errors += 1
            else:
                with self.lock:
                    for sent, result in zip(batch, reply.get("Records", []), strict=False):
                        if result.get("ErrorCode"):
                            self.errors += 1
                            continue
                        rid = str(sent["PartitionKey"])
                        if result.get("ShardId") != rid.partition(":")[0]:
                            self.misrouted += 1
                        self.produced[rid] = (str(result.get("ShardId")), wall)
            tick += 1
            self._stop.wait(max(0.0, start + tick * self.period_s - time.monotonic()))


# --- processes ---------------------------------------------------------------------------------------------


@dataclass
class Proc:
    role: str  # "worker" | "leader"
    name: str  # worker id, or the leader's lock owner / runner name
    process: subprocess.Popen[bytes]
    log: Path
    started: float
    signals: list[tuple[float, str]] = field(default_factory=list)  # (wall, SIGKILL|SIGTERM|SIGSTOP|SIGCONT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stopped_or_killed_at(self) -> list[tuple[float, str]]:
        return [(t, s) for t, s in self.signals if s in ("SIGKILL", "SIGSTOP")]


@dataclass
class FleetSpec:
    config: str  # "ours" | "kcl"
    host: str  # "cli" | "lambda"
    env: Mapping[str, str]  # SHARDLEASE_* overrides for every process
    lambda_timeout_s: float
    workers: int = 4
    shards: int = 8
    liveness: str = "lease"  # the application's liveness mode (docs/liveness-modes.md)
    record_liveness: bool = False  # record it with `shardlease liveness --set` before any process starts


class Fleet:
    def __init__(self, spec: FleetSpec, workdir: Path, say: Say) -> None:
        self.spec, self.workdir, self.say = spec, workdir, say
        stamp = f"{os.getpid()}-{int(time.time()) % 100000}"
        self.app = f"failover-{spec.config}-{spec.liveness}-{spec.host}-{stamp}"
        self.stream = f"{self.app}-stream"
        self.journal_dir = workdir / "journal"
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        self.journal = JournalTail(self.journal_dir)
        self.moto: Emulator | None = None
        self.kinesalite: Emulator | None = None
        self.ddb: Any = None
        self.kinesis: Any = None
        self.producer: Producer | None = None
        self.shard_ids: list[str] = []
        self.procs: list[Proc] = []
        self.leader: Proc | None = None
        self._worker_seq = 0
        self._leader_seq = 0
        self.env: dict[str, str] = {}

    # --- start ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.moto = start_moto(log_path=self.workdir / "moto.log")
        CHILDREN.add_emulator(self.moto)
        self.kinesalite = start_kinesalite(log_path=self.workdir / "kinesalite.log")
        CHILDREN.add_emulator(self.kinesalite)
        os.environ.update(AWS_ENV)  # the benchmark's own clients
        self.ddb = aws.client("dynamodb", AwsConfig(endpoint_url=self.moto.endpoint_url))
        self.kinesis = aws.client("kinesis", AwsConfig(endpoint_url=self.kinesalite.endpoint_url, read_timeout_s=30))
        ensure_tables(self.app, self.ddb)
        create_stream(self.kinesis, self.stream, self.spec.shards)
        listing = list_all_shards(self.kinesis, self.stream)
        shards = {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in listing}
        self.shard_ids = sorted(shards)
        self.env = {
            **clean_env(),
            **self.spec.env,
            "SHARDLEASE_DYNAMODB_ENDPOINT_URL": self.moto.endpoint_url,
            "SHARDLEASE_CLOUDWATCH_ENDPOINT_URL": self.moto.endpoint_url,
            "SHARDLEASE_KINESIS_ENDPOINT_URL": self.kinesalite.endpoint_url,
            "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
            "PYTHONPATH": str(REPO),
            JOURNAL_DIR_ENV: str(self.journal_dir),
        }
        self.say(
            f"  emulators moto pid {self.moto.pid}, kinesalite pid {self.kinesalite.pid}; app {self.app}, "
            f"{len(self.shard_ids)} shards"
        )
        if self.spec.record_liveness:
            self.record_liveness()
        self.producer = Producer(self.kinesis, self.stream, shards)
        self.producer.start()
        self.start_leader()
        for _ in range(self.spec.workers):
            self.start_worker()

    def record_liveness(self) -> None:
        """``shardlease liveness --set MODE`` on the fresh application, as an operator would before the first
        deploy: without it, workers that start before the leader's first run records the mode would renew (run in
        ``lease`` mode) until their next re-read of the mode, a minute later."""
        assert self.moto is not None
        argv = shardlease_command(
            "liveness", "--app", self.app, "--set", self.spec.liveness, "--endpoint-url", self.moto.endpoint_url
        )
        done = subprocess.run(argv, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"shardlease liveness --set {self.spec.liveness} failed: {done.stderr.strip()}")
        self.say(f"  liveness mode recorded: {self.spec.liveness}")

    def _spawn(self, role: str, name: str, argv: list[str], env: Mapping[str, str]) -> Proc:
        log_path = self.workdir / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv,
                cwd=REPO,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        CHILDREN.add(process)
        proc = Proc(role=role, name=name, process=process, log=log_path, started=time.time())
        self.procs.append(proc)
        return proc

    def start_worker(self) -> Proc:
        self._worker_seq += 1
        wid = f"w{self._worker_seq}"
        argv = worker_command(
            app=self.app, stream=self.stream, processor=SPEC, worker_id=wid, initial_position="TRIM_HORIZON"
        )
        return self._spawn("worker", wid, argv, {**self.env, WORKER_ID_ENV: wid})

    def start_leader(self) -> Proc:
        self._leader_seq += 1
        if self.spec.host == "cli":
            name = f"leader-{self._leader_seq}"
            argv = leader_command(app=self.app, stream=self.stream, leader_id=name, initial_position="TRIM_HORIZON")
            env = dict(self.env)
        else:
            name = f"lambda-{self._leader_seq}"
            argv = [
                sys.executable,
                "-m",
                "bench.failover_support.lambda_runner",
                "--status",
                str(self.workdir / f"{name}.status"),
                "--period-s",
                str(LAMBDA_PERIOD_S),
                "--timeout-s",
                str(self.spec.lambda_timeout_s),
            ]
            env = {
                **self.env,
                "SHARDLEASE_APP": self.app,
                "SHARDLEASE_STREAM": self.stream,
                "POWERTOOLS_TRACE_DISABLED": "true",
                "POWERTOOLS_METRICS_NAMESPACE": "shardlease-failover",
                "POWERTOOLS_METRICS_DISABLED": "true",
                "POWERTOOLS_LOG_LEVEL": "INFO",
                "POWERTOOLS_SERVICE_NAME": "shardlease-leader",
                "SHARDLEASE_PER_WORKER_METRICS": "false",
            }
        self.leader = self._spawn("leader", name, argv, env)
        return self.leader

    # --- signals ---------------------------------------------------------------------------------------------

    def signal(self, proc: Proc, sig: signal.Signals) -> float:
        """Send ``sig`` to one process (by PID); returns the wall time just before sending."""
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        proc.signals.append((at, sig.name))
        return at

    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.role == "worker" and p.alive()]

    def proc_by_pid(self) -> dict[int, Proc]:
        return {p.pid: p for p in self.procs}

    # --- observations ----------------------------------------------------------------------------------------

    def lease_owners(self) -> dict[str, str | None]:
        """Shard -> the worker really processing it (checkpointOwner during a handoff, else leaseOwner)."""
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": lease_table_name(self.app), "ConsistentRead": True}
        while True:
            reply = self.ddb.scan(**kwargs)
            items.extend(reply.get("Items", []))
            if "LastEvaluatedKey" not in reply:
                break
            kwargs["ExclusiveStartKey"] = reply["LastEvaluatedKey"]
        out: dict[str, str | None] = {}
        for item in items:
            key = item.get("leaseKey", {}).get("S")
            if key is None:
                continue
            owner = item.get("checkpointOwner", {}).get("S") or item.get("leaseOwner", {}).get("S")
            out[key] = owner
        return out

    def lock_owner(self) -> str | None:
        reply = self.ddb.get_item(
            TableName=coordinator_state_table_name(self.app), Key={"key": {"S": "Leader"}}, ConsistentRead=True
        )
        item = reply.get("Item") or {}
        if item.get("isReleased", {}).get("BOOL"):
            return None
        owner = item.get("ownerName", {}).get("S")
        return str(owner) if owner else None

    def stored_liveness(self) -> str | None:
        """The application's stored liveness mode (with its target during a switch); ``None``: none recorded."""
        stored = LivenessModeStore(CoordinatorStateStore(self.app, client=self.ddb)).read()
        return None if stored is None else stored.describe()

    def worker_liveness(self) -> dict[str, str]:
        """Worker id -> the liveness mode its last beat said (``lvm``; ``lease`` when absent) for live workers."""
        names = {p.name for p in self.workers()}
        rows = WorkerMetricsStore(self.app, client=self.ddb).list_all(consistent=True)
        return {
            row.worker_id: row.heartbeat.liveness or "lease"
            for row in rows
            if row.worker_id in names and row.heartbeat is not None
        }

    def invocation_starts(self) -> list[float]:
        """Wall times at which the Lambda runner started invocations (lambda host)."""
        if self.leader is None or self.spec.host != "lambda":
            return []
        path = self.workdir / f"{self.leader.name}.status"
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "START":
                out.append(float(parts[2]))
        return out

    def invocation_lines(self) -> list[str]:
        if self.leader is None or self.spec.host != "lambda":
            return []
        lines: list[str] = []
        for proc in self.procs:
            path = self.workdir / f"{proc.name}.status"
            if proc.role == "leader" and path.exists():
                lines.extend(path.read_text(encoding="utf-8").splitlines())
        return lines

    # --- stop ------------------------------------------------------------------------------------------------

    def stop(self, *, drain_s: float) -> tuple[int, list[str]]:
        """Stop producing, let the fleet drain (until every produced id is in a journal, at most ``drain_s``),
        SIGTERM every worker, then kill the leader. Returns (records still unprocessed after the drain, notes)."""
        notes: list[str] = []
        missing = 0
        if self.producer is not None:
            self.producer.stop()
            deadline = time.monotonic() + drain_s
            while True:
                self.journal.refresh()
                seen = {r.record_id for r in self.journal.records}
                missing = len(set(self.producer.snapshot()) - seen)
                if missing == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        for proc in self.workers():
            self.signal(proc, signal.SIGTERM)
        for proc in [p for p in self.procs if p.role == "worker"]:
            try:
                proc.process.wait(timeout=35)
            except subprocess.TimeoutExpired:
                notes.append(f"{proc.name} did not exit within 35 s of SIGTERM at the end: killed")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in [p for p in self.procs if p.role == "leader" and p.alive()]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.process.wait(timeout=10)
        self.journal.refresh()
        return missing, notes

    def close(self) -> None:
        """Kill whatever of this fleet still runs and stop the emulators (idempotent)."""
        if self.producer is not None:
            self.producer.stop()
        for proc in self.procs:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.process.wait(timeout=10)
        for emulator in (self.kinesalite, self.moto):
            if emulator is not None:
                emulator.stop()
