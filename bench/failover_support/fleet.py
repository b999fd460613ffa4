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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import coordinator_state_table_name, lease_table_name
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.commands import leader_command, shardlease_command, worker_command
from worker_lib.testing.emulators import Emulator, start_kinesalite, start_kinesis_local, start_moto
from worker_lib.testing.fanout_proxy import FanOutProxy
from worker_lib.testing.processes import CUTTING_SIGNALS, FleetProcess, ProcessFleet
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import create_stream, list_all_shards
from worker_lib.testing.waiting import wait_until
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
    """Every process fleet and emulator the benchmark started; :meth:`kill_all` SIGKILLs each process group."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fleets: list[ProcessFleet] = []
        self._emulators: list[Emulator] = []

    def add_fleet(self, fleet: ProcessFleet) -> None:
        with self._lock:
            self._fleets.append(fleet)

    def add_emulator(self, emulator: Emulator) -> None:
        with self._lock:
            self._emulators.append(emulator)

    def kill_all(self) -> None:
        with self._lock:
            fleets, emulators = list(self._fleets), list(self._emulators)
        for fleet in fleets:
            fleet.close()
        for emulator in emulators:
            with contextlib.suppress(Exception):
                emulator.stop()


CHILDREN = Children()


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_ENV_PREFIXES) and k not in _DROPPED_ENV}
    env.update(AWS_ENV)
    return env


def cut_signals(proc: FleetProcess) -> list[tuple[float, str]]:
    """(wall time, SIGKILL | SIGSTOP) of each time the benchmark killed or froze ``proc``."""
    return [(t, s) for t, s in proc.signals if s in CUTTING_SIGNALS]


@dataclass
class FleetSpec:
    config: str  # "ours" | "kcl"
    host: str  # "cli" | "lambda"
    env: Mapping[str, str]  # SHARDLEASE_* overrides for every process
    lambda_timeout_s: float
    workers: int = 4
    shards: int = 8
    liveness: str = "lease"  # the application's liveness mode (docs/liveness-modes.md)
    retrieval: str = "polling"  # fanout: Kinesis on kinesis-local behind FanOutProxy, workers subscribe
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
        self.kinesalite: Emulator | None = None  # kinesis-local with --retrieval fanout
        self.proxy: FanOutProxy | None = None
        self.ddb: Any = None
        self.kinesis: Any = None
        self.producer: Producer | None = None
        self.shard_ids: list[str] = []
        self.aimed: dict[str, str] = {}  # hash key the producer aims with -> the shard it starts
        # Every child gets the benchmark's environment only (clean_env), from the repository root; wall times.
        self.processes = ProcessFleet(workdir, env={}, cwd=REPO, wall_times=True)
        CHILDREN.add_fleet(self.processes)
        self.leader: FleetProcess | None = None
        self._worker_seq = 0
        self._leader_seq = 0
        self.env: dict[str, str] = {}

    # --- start ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.moto = start_moto(log_path=self.workdir / "moto.log")
        CHILDREN.add_emulator(self.moto)
        fanout = self.spec.retrieval == "fanout"
        # Fan-out needs SubscribeToShard: kinesis-local is the one emulator that serves it, behind the proxy that
        # makes its subscriptions look as AWS's (worker_lib.testing.fanout_proxy).
        starter = start_kinesis_local if fanout else start_kinesalite
        self.kinesalite = starter(log_path=self.workdir / ("kinesis-local.log" if fanout else "kinesalite.log"))
        CHILDREN.add_emulator(self.kinesalite)
        kinesis_url = self.kinesalite.endpoint_url
        if fanout:
            self.proxy = FanOutProxy(kinesis_url).start()
            kinesis_url = self.proxy.endpoint_url
        os.environ.update(AWS_ENV)  # the benchmark's own clients
        self.ddb = aws.client("dynamodb", AwsConfig(endpoint_url=self.moto.endpoint_url))
        self.kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesis_url, read_timeout_s=30))
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
            "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesis_url,
            "SHARDLEASE_RETRIEVAL": self.spec.retrieval,
            "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
            "PYTHONPATH": str(REPO),
            JOURNAL_DIR_ENV: str(self.journal_dir),
        }
        self.say(
            f"  emulators moto pid {self.moto.pid}, {self.kinesalite.name} pid {self.kinesalite.pid}; app {self.app}, "
            f"{len(self.shard_ids)} shards"
        )
        if self.spec.record_liveness:
            self.record_liveness()
        # one record into each shard every 0.2 s, aimed by the shard's starting hash key
        self.aimed = {key: shard for shard, key in shards.items()}
        keys = [shards[shard] for shard in self.shard_ids]
        self.producer = Producer(
            self.kinesis, self.stream, per_tick=len(keys), tick_s=0.2, hash_keys=keys, name="failover-producer"
        ).start()
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

    @property
    def procs(self) -> list[FleetProcess]:
        return list(self.processes.processes.values())

    def start_worker(self) -> FleetProcess:
        self._worker_seq += 1
        wid = f"w{self._worker_seq}"
        argv = worker_command(
            app=self.app, stream=self.stream, processor=SPEC, worker_id=wid, initial_position="TRIM_HORIZON"
        )
        return self.processes.start(wid, argv, env={**self.env, WORKER_ID_ENV: wid}, role="worker")

    def start_leader(self) -> FleetProcess:
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
        self.leader = self.processes.start(name, argv, env=env, role="leader")
        return self.leader

    # --- signals ---------------------------------------------------------------------------------------------

    def signal(self, proc: FleetProcess, sig: signal.Signals) -> float:
        """Send ``sig`` to one process (by PID); returns the wall time just before sending."""
        return self.processes.signal(proc.name, sig)

    def workers(self) -> list[FleetProcess]:
        return self.processes.live("worker")

    # --- the producer ------------------------------------------------------------------------------------------

    def produced(self) -> dict[str, tuple[str, float]]:
        """Record id -> (the shard it landed in, wall time of its put), for every record Kinesis accepted."""
        placed = self.producer.placed() if self.producer is not None else {}
        return {rid: (put.shard_id, put.wall) for rid, put in placed.items()}

    def misrouted(self) -> int:
        """Records that landed in another shard than the one whose starting hash key aimed them."""
        placed = self.producer.placed() if self.producer is not None else {}
        return sum(1 for put in placed.values() if self.aimed.get(str(put.hash_key)) != put.shard_id)

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
        producer = self.producer
        if producer is not None:
            producer.stop()

            def drained() -> bool:
                nonlocal missing
                self.journal.refresh()
                missing = len(set(producer.produced) - {r.record_id for r in self.journal.records})
                return missing == 0

            wait_until(drained, timeout_s=drain_s, step_s=0.5)
        codes = self.processes.stop([p.name for p in self.workers()], timeout_s=35)
        notes += [
            f"{name} did not exit within 35 s of SIGTERM at the end: killed" for name, c in codes.items() if c is None
        ]
        self.processes.close()  # those, and the leader (not recorded as signals: the trials are over)
        self.journal.refresh()
        return missing, notes

    def close(self) -> None:
        """Kill whatever of this fleet still runs and stop the emulators (idempotent)."""
        if self.producer is not None:
            self.producer.stop()
        self.processes.close()
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        for emulator in (self.kinesalite, self.moto):
            if emulator is not None:
                emulator.stop()
