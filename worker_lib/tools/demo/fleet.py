"""The default demo: a whole fleet on one machine — emulators, leader on a schedule, worker processes, a skewed
producer, scripted failures and resharding, a live view and a closing report that proves nothing was lost.

Timeline (fractions of ``--duration``): 0 start · 0.25 ``kill -9`` a worker · 0.40 add a worker · 0.47 deploy one
worker (its replacement starts, then it gets SIGTERM) · 0.55 split the hottest shard · 0.70 merge the two coldest
adjacent shards · 0.85 stop producing, let the fleet drain, stop. The report gives the failover (kill) and
hand-over (SIGTERM) times: from the signal to the first record of each of its shards processed elsewhere.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import ShardleaseError
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.emulators import Emulator, start_kinesalite, start_moto
from worker_lib.testing.streams import create_stream, list_all_shards, merge_shards, split_shard
from worker_lib.tools.demo.processor import JOURNAL_ENV, WORK_ENV
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

log = logging.getLogger("shardlease.demo")

HASH_SPACE = 2**128
Printer = Callable[[str], None]

# Demo timings: everything ~5x faster than production defaults so that a failover is visible in seconds.
DEMO_ENV = {
    "SHARDLEASE_FAILOVER_TIME_MS": "3000",
    "SHARDLEASE_DISCOVERY_INTERVAL_MS": "500",
    "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS": "200",
    "SHARDLEASE_PARENT_POLL_INTERVAL_MS": "500",
    "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "1500",
    "SHARDLEASE_WORKER_METRICS_FIRST_REPORT_DELAY_MS": "500",
    # the leader's activity window is 2 × this: generous, because a 2-core laptop running emulators, a producer
    # and several workers delays reports by seconds; a dead worker is still noticed within 6 s
    "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_S": "3",
    "SHARDLEASE_CPU_METRIC": "process",
    "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "2000",
    "SHARDLEASE_LEADER_DEADLINE_MARGIN_MS": "1500",
    "SHARDLEASE_LEADER_LOCK_DURATION_MS": "6000",
    "SHARDLEASE_LEADER_HEARTBEAT_MS": "2000",
    "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "4000",
    "SHARDLEASE_BALANCING_FREQUENCY": "2",
    "SHARDLEASE_GRACEFUL_HANDOFF_TIMEOUT_MS": "5000",
    "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
    "SHARDLEASE_AWS_MAX_ATTEMPTS": "3",
}


@dataclass
class WorkerProc:
    name: str
    process: subprocess.Popen[bytes]
    started_at: float
    killed_at: float | None = None
    terminated_at: float | None = None  # SIGTERM: a graceful stop, as a deploy or a scale-in sends

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class DemoState:
    """What the live view and the report read; written by the producer, the leader thread and the timeline."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    produced: dict[str, str] = field(default_factory=dict)  # record id -> shard it landed in
    produced_per_shard: Counter[str] = field(default_factory=Counter)
    events: list[tuple[float, str]] = field(default_factory=list)
    decisions: deque[str] = field(default_factory=lambda: deque(maxlen=8))
    leader_reports: list[dict[str, Any]] = field(default_factory=list)
    hot_range: tuple[int, int] = (0, 0)


class _DecisionCapture(logging.Handler):
    def __init__(self, state: DemoState) -> None:
        super().__init__(level=logging.INFO)
        self.state = state

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = json.loads(record.getMessage())
        except ValueError:
            return
        line = (
            f"{fields.get('kind', '?')}: {fields.get('lease', '?')} {fields.get('from') or '-'} → "
            f"{fields.get('to', '?')} ({fields.get('reason', '')})"
        )
        with self.state.lock:
            self.state.decisions.append(line)


# --- producer --------------------------------------------------------------------------------------------------


class Producer:
    """Skewed traffic: 40 % into one hot hash range (the first shard's), 60 % spread over the whole key space."""

    def __init__(self, kinesis: Any, stream: str, state: DemoState, *, rate: int, size: int, seed: int = 7) -> None:
        self.kinesis, self.stream, self.state = kinesis, stream, state
        self.rate, self.size = rate, size
        self.rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-producer", daemon=True)
        self.errors = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _hash_key(self) -> int:
        low, high = self.state.hot_range
        if self.rng.random() < 0.4:
            return self.rng.randrange(low, high + 1)
        return self.rng.randrange(0, HASH_SPACE)

    def _run(self) -> None:
        tick = 0.1
        per_tick = max(1, int(self.rate * tick))
        n = 0
        while not self._stop.wait(tick):
            batch, ids = [], []
            for _ in range(per_tick):
                rid = f"r{n:07d}"
                n += 1
                payload = (rid + "|").encode() + b"x" * max(0, self.size - len(rid) - 1)
                batch.append({"Data": payload, "PartitionKey": rid, "ExplicitHashKey": str(self._hash_key())})
                ids.append(rid)
            try:
                response = self.kinesis.put_records(StreamName=self.stream, Records=batch)
            except Exception as exc:  # the emulator is busy resharding: retry the batch next tick
                self.errors += 1
                log.debug("producer put_records failed: %s", exc)
                n -= per_tick
                continue
            with self.state.lock:
                for rid, result in zip(ids, response["Records"], strict=True):
                    if "ShardId" in result:
                        self.state.produced[rid] = result["ShardId"]
                        self.state.produced_per_shard[result["ShardId"]] += 1


# --- journals --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Processed:
    pid: int
    shard: str
    sequence: int
    record_id: str
    wall: float


def read_journals(directory: Path) -> list[Processed]:
    out: list[Processed] = []
    for path in sorted(directory.glob("*.log")):
        pid = int(path.stem)
        with path.open(encoding="utf-8") as journal:
            for line in journal:
                parts = line.split()
                if len(parts) == 5 and parts[1].isdigit():
                    out.append(Processed(pid, parts[0], int(parts[1]), parts[3], float(parts[4])))
    return out


# --- the fleet -------------------------------------------------------------------------------------------------


class Fleet:
    def __init__(
        self,
        *,
        app: str,
        stream: str,
        moto: Emulator,
        kinesalite: Emulator,
        workdir: Path,
        state: DemoState,
        clock: Clock,
    ) -> None:
        self.app, self.stream = app, stream
        self.moto, self.kinesalite = moto, kinesalite
        self.workdir, self.state, self.clock = workdir, state, clock
        self.journal_dir = workdir / "journal"
        self.journal_dir.mkdir()
        self.workers: list[WorkerProc] = []
        self.env = {
            **DEMO_ENV,
            "SHARDLEASE_APP": app,
            "SHARDLEASE_STREAM": stream,
            "SHARDLEASE_DYNAMODB_ENDPOINT_URL": moto.endpoint_url,
            "SHARDLEASE_CLOUDWATCH_ENDPOINT_URL": moto.endpoint_url,
            "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesalite.endpoint_url,
            JOURNAL_ENV: str(self.journal_dir),
            WORK_ENV: "1500",
        }

    def event(self, text: str) -> None:
        with self.state.lock:
            self.state.events.append((self.clock.wall(), text))

    def add_worker(self) -> WorkerProc:
        name = f"demo-w{len(self.workers) + 1}"
        log_file = (self.workdir / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker_lib.cli",
                "--log-level",
                "INFO",
                "worker",
                "--app",
                self.app,
                "--stream",
                self.stream,
                "--processor",
                "worker_lib.tools.demo.processor:DemoProcessor",
                "--worker-id",
                name,
            ],
            env={**os.environ, **self.env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log_file.close()
        worker = WorkerProc(name=name, process=process, started_at=self.clock.wall())
        self.workers.append(worker)
        self.event(f"started worker {name} (pid {process.pid})")
        return worker

    def kill(self, worker: WorkerProc) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.killed_at = self.clock.wall()
        worker.process.wait(timeout=10)
        self.event(f"kill -9 {worker.name} (pid {worker.pid})")

    def terminate(self, worker: WorkerProc) -> None:
        """A graceful stop (SIGTERM), as every deploy and scale-in sends: the worker announces its departure,
        checkpoints and gives its leases up; the leader hands them over within about a second."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        worker.terminated_at = self.clock.wall()
        self.event(f"SIGTERM {worker.name} (pid {worker.pid}): graceful stop")
        try:
            worker.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.event(f"{worker.name} did not stop within 20 s")

    def stop_all(self, *, graceful: bool) -> None:
        alive = [w for w in self.workers if w.process.poll() is None]
        for worker in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGTERM if graceful else signal.SIGKILL)
        for worker in alive:
            try:
                worker.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGKILL)
                worker.process.wait(timeout=10)


# --- the leader on a schedule ------------------------------------------------------------------------------------


class _FakeLambdaContext:
    """What the handler reads from a Lambda context."""

    def __init__(self, budget_ms: int, clock: Clock) -> None:
        self._deadline = clock.monotonic() + budget_ms / 1000
        self._clock = clock
        self.function_name = "shardlease-demo-leader"
        self.memory_limit_in_mb = 256
        self.invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:shardlease-demo-leader"
        self.aws_request_id = "demo"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self._clock.monotonic()) * 1000))


def _load_lambda_handler() -> Callable[[dict[str, Any], Any], Any] | None:
    """The real Lambda handler from the repository's ``functions/`` (the demo runs from a checkout)."""
    path = Path(__file__).resolve().parents[2] / "functions" / "leader" / "handler.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("shardlease_demo_leader_handler", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses in the module look themselves up there
    spec.loader.exec_module(module)
    handler = getattr(module, "handler", None)
    return handler if callable(handler) else None


class LeaderSchedule:
    """EventBridge, locally: invoke the leader every ``period_s``; each invocation leads until its deadline."""

    def __init__(self, state: DemoState, env: dict[str, str], *, period_s: float, clock: Clock) -> None:
        self.state, self.env, self.period_s, self.clock = state, env, period_s, clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-leader-schedule", daemon=True)
        self.invocations = 0
        self.mode = "?"

    def start(self) -> None:
        os.environ.update(self.env)  # the handler reads its configuration from the environment, as in Lambda
        os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
        os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "shardlease-demo")
        os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")  # the live view shows the leader's decisions
        os.environ.setdefault("SHARDLEASE_PER_WORKER_METRICS", "false")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            handler = _load_lambda_handler()
        except Exception as exc:  # a broken checkout must not stop the demo: run the same Leader in-process
            log.warning("could not load functions/leader/handler.py (%s); running the leader in-process", exc)
            handler = None
        self.mode = "Lambda handler" if handler is not None else "in-process leader"
        while not self._stop.is_set():
            budget_ms = int(self.period_s * 1000)
            try:
                if handler is not None:
                    result = handler(
                        {"source": "aws.events", "detail-type": "Scheduled Event"},
                        _FakeLambdaContext(budget_ms, self.clock),
                    )
                else:
                    result = _run_in_process_leader(budget_ms, self.clock)
                self.invocations += 1
                if isinstance(result, dict):
                    with self.state.lock:
                        self.state.leader_reports.append(result)
            except ShardleaseError as exc:
                log.warning("leader invocation failed: %s", exc)
            except Exception:
                log.exception("leader invocation raised")
            self._stop.wait(0.2)


def _run_in_process_leader(budget_ms: int, clock: Clock) -> dict[str, Any]:
    from worker_lib.leader.host import build_leader_from_env

    parts = build_leader_from_env(os.environ)
    deadline = clock.monotonic() + budget_ms / 1000
    reports = parts.leader.run(deadline_monotonic=deadline)
    return {"cycles": [r.to_dict() for r in reports]}


# --- live view -------------------------------------------------------------------------------------------------


@dataclass
class ViewRow:
    worker: str
    pid: int
    status: str
    leases: int
    cpu: float | None
    kbps: float


def fleet_rows(fleet: Fleet, store: DynamoDBLeaseStore, metrics: dict[str, float]) -> tuple[list[ViewRow], list[Any]]:
    leases = store.list_leases()
    per_owner: dict[str, list[Any]] = defaultdict(list)
    for lease in leases:
        if lease.actual_owner and not lease.is_finished:
            per_owner[lease.actual_owner].append(lease)
    rows = []
    for worker in fleet.workers:
        status = "killed" if worker.killed_at else ("running" if worker.process.poll() is None else "exited")
        held = per_owner.get(worker.name, [])
        rows.append(
            ViewRow(
                worker=worker.name,
                pid=worker.pid,
                status=status,
                leases=len(held),
                cpu=metrics.get(worker.name),
                kbps=sum(lease.throughput_kbps or 0.0 for lease in held),
            )
        )
    return rows, leases


def read_worker_cpu(ddb: Any, app: str) -> dict[str, float]:
    """Latest CPU report per worker (the last real value of ``sts.C``), for the live view."""
    out: dict[str, float] = {}
    with contextlib.suppress(ShardleaseError):
        for stats in WorkerMetricsStore(app, client=ddb).list_all():
            values = [v for v in stats.stats.get("C", ()) if v >= 0]
            if values:
                out[stats.worker_id] = values[-1]
    return out


def render_plain(fleet: Fleet, rows: list[ViewRow], leases: list[Any], state: DemoState, elapsed: float) -> str:
    parts = [f"[{elapsed:5.1f}s] produced {len(state.produced)}"]
    for row in rows:
        cpu = f"{row.cpu:4.1f}%" if row.cpu is not None else "  -  "
        parts.append(f"{row.worker}:{row.status[:4]} leases={row.leases} cpu={cpu} {row.kbps:6.1f}KB/s")
    return " | ".join(parts)


def render_rich(fleet: Fleet, rows: list[ViewRow], leases: list[Any], state: DemoState, elapsed: float) -> Any:
    from rich.console import Group
    from rich.table import Table

    workers = Table(title=f"workers — t={elapsed:.0f}s, {len(state.produced)} records produced", expand=True)
    for column in ("worker", "pid", "status", "leases", "CPU %", "KB/s"):
        workers.add_column(column)
    for row in rows:
        workers.add_row(
            row.worker,
            str(row.pid),
            row.status,
            str(row.leases),
            f"{row.cpu:.1f}" if row.cpu is not None else "-",
            f"{row.kbps:.1f}",
        )
    shards = Table(title="shards", expand=True)
    for column in ("lease", "owner", "KB/s", "checkpoint", "produced"):
        shards.add_column(column)
    for lease in sorted(leases, key=lambda x: x.lease_key):
        shards.add_row(
            lease.lease_key,
            lease.actual_owner or "-",
            f"{lease.throughput_kbps or 0:.1f}",
            "SHARD_END" if lease.is_finished else ("…" + str(lease.checkpoint)[-8:]),
            str(state.produced_per_shard.get(lease.lease_key, 0)),
        )
    decisions = Table(title="leader decisions (latest)", expand=True, show_header=False)
    decisions.add_column("decision")
    with state.lock:
        for line in list(state.decisions)[-6:]:
            decisions.add_row(line)
        events = [text for _, text in state.events[-4:]]
    timeline = Table(title="events", expand=True, show_header=False)
    timeline.add_column("event")
    for text in events:
        timeline.add_row(text)
    return Group(workers, shards, decisions, timeline)


# --- report ----------------------------------------------------------------------------------------------------


@dataclass
class Report:
    produced: int
    processed_unique: int
    lost: list[str]
    duplicates: int
    duplicate_reasons: Counter[str]
    failover_s: dict[str, float]
    handover_s: dict[str, float]
    imbalance_before: float | None
    imbalance_after: float | None
    records_per_worker: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.lost

    def lines(self) -> list[str]:
        out = [
            "",
            "closing report",
            f"  records produced   {self.produced}",
            f"  records processed  {self.processed_unique} distinct"
            f" ({'none lost' if not self.lost else f'{len(self.lost)} LOST'})",
            f"  duplicates         {self.duplicates}",
        ]
        for reason, count in sorted(self.duplicate_reasons.items()):
            out.append(f"    {count:>6}  {reason}")
        for name, seconds in self.failover_s.items():
            out.append(f"  failover           {name}: its shards resumed on other workers after {seconds:.1f} s")
        for name, seconds in self.handover_s.items():
            out.append(
                f"  hand-over          {name} (SIGTERM): its shards resumed on other workers after {seconds:.1f} s"
            )
        if self.imbalance_before is not None and self.imbalance_after is not None:
            out.append(
                f"  load max/mean      {self.imbalance_before:.2f} at first balancing → "
                f"{self.imbalance_after:.2f} at the end"
            )
        out.append("  records per worker " + ", ".join(f"{k}={v}" for k, v in sorted(self.records_per_worker.items())))
        return out


def build_report(fleet: Fleet, state: DemoState) -> Report:
    processed = read_journals(fleet.journal_dir)
    with state.lock:
        produced = dict(state.produced)
        leader_reports = list(state.leader_reports)
    seen = Counter(p.record_id for p in processed)
    lost = sorted(set(produced) - set(seen))
    pid_name = {w.pid: w for w in fleet.workers}
    duplicate_reasons: Counter[str] = Counter()
    first_pid: dict[str, int] = {}
    for p in sorted(processed, key=lambda x: x.wall):
        if p.record_id in first_pid and first_pid[p.record_id] != p.pid:
            first = pid_name.get(first_pid[p.record_id])
            if first is not None and first.killed_at is not None:
                duplicate_reasons[f"re-read after {first.name} was killed before checkpointing them"] += 1
            else:
                duplicate_reasons["re-read after a lease moved before its checkpoint"] += 1
        elif p.record_id in first_pid:
            duplicate_reasons["re-read by the same worker (a retried batch)"] += 1
        else:
            first_pid[p.record_id] = p.pid
    failover: dict[str, float] = {}
    handover: dict[str, float] = {}
    for worker in fleet.workers:
        for signalled_at, figures in ((worker.killed_at, failover), (worker.terminated_at, handover)):
            if signalled_at is None:
                continue
            # the shards it was processing when signalled; each one's first record processed elsewhere afterwards
            shards = {p.shard for p in processed if p.pid == worker.pid and p.wall <= signalled_at}
            resumed = []
            for shard in shards:
                after = [
                    p.wall for p in processed if p.shard == shard and p.pid != worker.pid and p.wall > signalled_at
                ]
                if after:
                    resumed.append(min(after) - signalled_at)
            if resumed:
                figures[worker.name] = max(resumed)
    ratios = []
    for report in leader_reports:
        for cycle in report.get("cycles", []):
            assignment = cycle.get("assignment") or {}
            if assignment.get("balancing_ran") and assignment.get("workers_assignable", 0) > 1:
                ratios.append(float(assignment.get("max_over_mean", 1.0)))
    per_worker: Counter[str] = Counter()
    for p in processed:
        name = pid_name[p.pid].name if p.pid in pid_name else str(p.pid)
        per_worker[name] += 1
    return Report(
        produced=len(produced),
        processed_unique=len(set(seen) & set(produced)),
        lost=lost,
        duplicates=sum(n - 1 for n in seen.values() if n > 1),
        duplicate_reasons=duplicate_reasons,
        failover_s=failover,
        handover_s=handover,
        imbalance_before=ratios[0] if ratios else None,
        imbalance_after=ratios[-1] if ratios else None,
        records_per_worker=dict(per_worker),
    )


# --- the scenario ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="shardlease-demo-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_fleet_demo(
    *, workers: int, shards: int, duration_s: float, say: Printer, clock: Clock = SYSTEM_CLOCK, live: bool | None = None
) -> int:
    app = f"demo-{os.getpid()}-{int(clock.wall()) % 100000}"
    stream = f"{app}-stream"
    state = DemoState()
    use_rich = sys.stdout.isatty() if live is None else live
    capture = _DecisionCapture(state)
    decisions = logging.getLogger("shardlease.leader.decisions")
    decisions.addHandler(capture)
    decisions.setLevel(logging.INFO)
    decisions.propagate = False  # shown in the live view, not as raw log lines
    with _workdir() as workdir:
        moto = start_moto(log_path=workdir / "moto.log")
        try:
            kinesalite = start_kinesalite(log_path=workdir / "kinesalite.log")
        except BaseException:
            moto.stop()
            raise
        fleet: Fleet | None = None
        schedule: LeaderSchedule | None = None
        producer: Producer | None = None
        try:
            say(
                f"emulators: moto pid {moto.pid} ({moto.endpoint_url}), kinesalite pid {kinesalite.pid} "
                f"({kinesalite.endpoint_url})"
            )
            ddb = aws.client("dynamodb", AwsConfig(endpoint_url=moto.endpoint_url))
            kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesalite.endpoint_url, read_timeout_s=30))
            ensure_tables(app, ddb)
            create_stream(kinesis, stream, shards, clock=clock)
            first = min(list_all_shards(kinesis, stream), key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
            state.hot_range = (
                int(first["HashKeyRange"]["StartingHashKey"]),
                int(first["HashKeyRange"]["EndingHashKey"]),
            )
            say(f"app {app}: tables created, stream with {shards} shards (40 % of traffic into {first['ShardId']})")
            fleet = Fleet(
                app=app, stream=stream, moto=moto, kinesalite=kinesalite, workdir=workdir, state=state, clock=clock
            )
            store = DynamoDBLeaseStore(app, client=ddb)
            schedule = LeaderSchedule(state, fleet.env, period_s=10.0, clock=clock)
            schedule.start()
            for _ in range(workers):
                fleet.add_worker()
            producer = Producer(kinesis, stream, state, rate=150, size=1024)
            producer.start()
            _timeline(fleet, kinesis, stream, store, ddb, state, producer, duration_s, say, use_rich, clock)
            producer.stop()
            _drain(fleet, state, say, clock)
            fleet.stop_all(graceful=True)
            schedule.stop()
            report = build_report(fleet, state)
            say(f"leader ran as: {schedule.mode}, {schedule.invocations} invocations")
            for line in report.lines():
                say(line)
            return 0 if report.ok else 1
        finally:
            decisions.removeHandler(capture)
            decisions.propagate = True
            if producer is not None:
                producer.stop()
            if fleet is not None:
                fleet.stop_all(graceful=False)
            if schedule is not None:
                schedule.stop()
            kinesalite.stop()
            moto.stop()
            say(f"stopped emulators (pids {moto.pid}, {kinesalite.pid}) and every worker process")


def _drain(fleet: Fleet, state: DemoState, say: Printer, clock: Clock) -> None:
    deadline = clock.monotonic() + 60
    while clock.monotonic() < deadline:
        seen = {p.record_id for p in read_journals(fleet.journal_dir)}
        with state.lock:
            missing = len(set(state.produced) - seen)
        if missing == 0:
            return
        clock.sleep(1.0)
    say("drain: some records were still unprocessed after 60 s")


def _timeline(  # noqa: PLR0917 - one private call site
    fleet: Fleet,
    kinesis: Any,
    stream: str,
    store: DynamoDBLeaseStore,
    ddb: Any,
    state: DemoState,
    producer: Producer,
    duration_s: float,
    say: Printer,
    use_rich: bool,
    clock: Clock,
) -> None:
    start = clock.monotonic()
    steps: list[tuple[float, str, Callable[[], None]]] = [
        (0.25, "kill", lambda: fleet.kill(next(w for w in fleet.workers if w.process.poll() is None))),
        (0.40, "add", lambda: (fleet.add_worker(), None)[1]),
        (0.47, "deploy", lambda: _replace_one(fleet)),
        (0.55, "split", lambda: _split_hot(fleet, kinesis, stream, state, clock)),
        (0.70, "merge", lambda: _merge_cold(fleet, kinesis, stream, state, clock)),
    ]
    pending = list(steps)
    last_plain = -10.0

    def tick(display: Callable[[Any], None] | None) -> None:
        nonlocal last_plain
        elapsed = clock.monotonic() - start
        while pending and elapsed >= pending[0][0] * duration_s:
            _, _, action = pending.pop(0)
            try:
                action()
            except ShardleaseError as exc:
                fleet.event(f"event failed: {exc}")
        try:
            rows, leases = fleet_rows(fleet, store, read_worker_cpu(ddb, fleet.app))
        except ShardleaseError:
            return
        if display is not None:
            display(render_rich(fleet, rows, leases, state, elapsed))
        elif elapsed - last_plain >= 5:
            last_plain = elapsed
            say(render_plain(fleet, rows, leases, state, elapsed))

    if use_rich:
        from rich.live import Live

        with Live(refresh_per_second=2, transient=False) as view:
            while clock.monotonic() - start < 0.85 * duration_s:
                tick(view.update)
                clock.sleep(0.5)
    else:
        printed = 0
        while clock.monotonic() - start < 0.85 * duration_s:
            tick(None)
            with state.lock:
                new_events = state.events[printed:]
                printed = len(state.events)
            for _, text in new_events:
                say(f"  event: {text}")
            clock.sleep(0.5)


def _replace_one(fleet: Fleet) -> None:
    """A deploy of one worker: its replacement starts, then it is stopped gracefully."""
    victim = next(w for w in fleet.workers if w.process.poll() is None)
    fleet.add_worker()
    fleet.terminate(victim)


def _split_hot(fleet: Fleet, kinesis: Any, stream: str, state: DemoState, clock: Clock) -> None:
    with state.lock:
        counts = Counter(state.produced_per_shard)
    open_shards = [
        s["ShardId"]
        for s in list_all_shards(kinesis, stream)
        if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})
    ]
    hottest = max(open_shards, key=lambda s: counts.get(s, 0))
    split_shard(kinesis, stream, hottest, clock=clock)
    fleet.event(f"split hot shard {hottest}")


def _merge_cold(fleet: Fleet, kinesis: Any, stream: str, state: DemoState, clock: Clock) -> None:
    with state.lock:
        counts = Counter(state.produced_per_shard)
    shards = sorted(
        (s for s in list_all_shards(kinesis, stream) if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})),
        key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]),
    )
    pairs = [
        (a, b)
        for a, b in itertools.pairwise(shards)
        if int(a["HashKeyRange"]["EndingHashKey"]) + 1 == int(b["HashKeyRange"]["StartingHashKey"])
    ]
    if not pairs:
        fleet.event("no adjacent open shards to merge")
        return
    lower, upper = min(pairs, key=lambda p: counts.get(p[0]["ShardId"], 0) + counts.get(p[1]["ShardId"], 0))
    merge_shards(kinesis, stream, lower["ShardId"], upper["ShardId"], clock=clock)
    fleet.event(f"merged cold shards {lower['ShardId']} + {upper['ShardId']}")
