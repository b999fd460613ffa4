"""The leader Lambda handler, called as Lambda would (event + context), against a moto server.

The handler reads its configuration from the environment like in Lambda; short cycle and deadline settings keep
each invocation to a couple of seconds. The handler runs on the system clock (it takes no clock: Lambda's context is
its only source of time), so its deadline is checked exactly where it is decided — no cycle starts within the
margin before the invocation's deadline, and the loop leads until then — and how long it took is a liveness bound
(tests/support/stalls.py); that the loop stops at deadline − margin is also proved on a fake clock in
tests/unit/test_leader_loop.py.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from functions.leader import handler as leader_handler
from tests.support.leader_reports import assignment_report
from tests.support.stalls import hang_bound_s, stall_note
from worker_lib.core import aws
from worker_lib.core.clock import SystemClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import ConfigError
from worker_lib.leader import lambda_handler
from worker_lib.leader.config import LeaderLockConfig
from worker_lib.leader.cycle_metrics import cycle_metrics, run_outcome, worker_metrics
from worker_lib.leader.leader import CycleReport, Leader
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.shardsync.syncer import ShardSyncResult
from worker_lib.tables.admin import ensure_tables
from worker_lib.telemetry.names import LeaderMetric, WorkerMetric
from worker_lib.testing.streams import create_stream

SCHEDULED_EVENT = {"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}
SHARDS = 3
NAMESPACE = "ShardleaseTest"
CYCLE_MS = 300
# The margin must cover one cycle on a loaded machine (a 0.9 s cycle once ran 0.4 s past a 6 s deadline at 500 ms);
# a deployed leader keeps 10 s.
MARGIN_MS = 1_500
BUDGET_S = 6.0  # the invocation's time left when it starts
ONE_READ_BOUND_S = hang_bound_s(CYCLE_MS / 1000)  # liveness: an invocation that finds the lock held and returns


class FakeContext:
    """The parts of a Lambda context the handler reads."""

    def __init__(self, budget_ms: int) -> None:
        self.deadline = time.monotonic() + budget_ms / 1000
        self.function_name = "shardlease-leader"
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = 256
        self.invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:shardlease-leader"
        self.aws_request_id = str(uuid.uuid4())

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


@pytest.fixture
def deployment(moto_endpoint: str, app_name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Tables + a 3-shard stream on moto, and the environment the CDK construct gives the function."""
    aws_config = AwsConfig(endpoint_url=moto_endpoint, max_attempts=2)
    ddb = aws.client("dynamodb", aws_config)
    kinesis = aws.client("kinesis", aws_config)
    stream = f"{app_name}-stream"
    create_stream(kinesis, stream, SHARDS)
    ensure_tables(app_name, ddb)
    for name, value in {
        "SHARDLEASE_APP": app_name,
        "SHARDLEASE_STREAM": stream,
        "SHARDLEASE_ENDPOINT_URL": moto_endpoint,
        "SHARDLEASE_AWS_MAX_ATTEMPTS": "2",
        "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
        "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": str(CYCLE_MS),
        "SHARDLEASE_LEADER_DEADLINE_MARGIN_MS": str(MARGIN_MS),
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_METRICS_NAMESPACE": NAMESPACE,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SHARDLEASE_LEADER_ID", raising=False)
    monkeypatch.delenv("POWERTOOLS_SERVICE_NAME", raising=False)
    return {"app": app_name, "stream": stream, "ddb": ddb, "aws": aws_config}


def _emf_documents(stdout: str) -> list[dict[str, Any]]:
    docs = []
    for line in stdout.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            docs.append(json.loads(line))
    return docs


def cycle_starts(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The system-clock reading on which the leader's loop decided to start each cycle from now on: the last reading
    its thread took before the cycle (the loop's deadline check), not a later one a busy machine could delay."""
    starts: list[float] = []
    last = threading.local()
    monotonic, run_cycle = SystemClock.monotonic, Leader.run_cycle

    def reading(clock: SystemClock) -> float:
        last.value = monotonic(clock)
        return float(last.value)

    def spy(leader: Leader) -> CycleReport:
        starts.append(last.value)
        return run_cycle(leader)

    monkeypatch.setattr(SystemClock, "monotonic", reading)
    monkeypatch.setattr(Leader, "run_cycle", spy)
    return starts


def _probe_lock(deployment: dict[str, Any]) -> DynamoDBLeaderLock:
    return DynamoDBLeaderLock(
        deployment["app"], f"probe-{uuid.uuid4().hex[:6]}", config=LeaderLockConfig(), client=deployment["ddb"]
    )


def test_given_tables_and_stream_when_invoked_then_it_leads_creates_leases_and_releases_the_lock(
    deployment: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN empty tables and a 3-shard stream
    store = DynamoDBLeaseStore(deployment["app"], client=deployment["ddb"])
    assert store.list_leases() == []
    starts = cycle_starts(monkeypatch)
    # WHEN EventBridge invokes the handler with 6 s left (the first cycle makes the clients, checks the tables and
    # syncs the shards: under CI's load it took 2.5 s, then 4 s)
    started = time.monotonic()
    context = FakeContext(int(BUDGET_S * 1000))
    result = leader_handler.handler(SCHEDULED_EVENT, context)
    returned = time.monotonic()
    # THEN it led, synced the shards into leases, and ran no cycle in error
    assert result["leader"] is True
    assert result["leader_cycles"] == len(starts) >= 1
    assert result["failed_cycles"] == 0
    assert result["leases_created"] == SHARDS
    assert len(store.list_leases()) == SHARDS
    # AND it started no cycle within the margin before its deadline, and led until then (the context's time left is
    # read in whole milliseconds: the handler's deadline is up to 1 ms earlier than the context's, on the same clock)
    stop_at = context.deadline - MARGIN_MS / 1000
    assert all(at < stop_at for at in starts), [round(at - stop_at, 3) for at in starts]
    assert returned >= stop_at - 0.001, round(returned - stop_at, 3)
    # AND it returned (a liveness bound: a handler that ignored its deadline would lead for its 65 s term; how far
    # past the deadline the last cycle ran is the machine's speed, printed)
    assert returned - started < hang_bound_s(BUDGET_S), stall_note(started)
    print(f"figure: {len(starts)} cycles, returned {returned - context.deadline:+.2f} s from the invocation's deadline")
    json.dumps(result)  # JSON-able, as Lambda requires
    # AND the lock is free: another contender acquires it at once
    assert _probe_lock(deployment).try_acquire() is True
    # AND each cycle published its metrics as EMF in the configured namespace with the Application dimension
    docs = _emf_documents(capsys.readouterr().out)
    cycle_docs = [d for d in docs if LeaderMetric.CYCLES in d]
    assert len(cycle_docs) == result["leader_cycles"]
    first = cycle_docs[0]
    assert first["_aws"]["CloudWatchMetrics"][0]["Namespace"] == NAMESPACE
    assert first["Application"] == deployment["app"]
    assert first[LeaderMetric.LEASES_CREATED] in (SHARDS, [SHARDS])  # Powertools writes one value or a list
    assert LeaderMetric.CYCLE_TIME in first


def test_given_two_concurrent_invocations_then_only_one_leads_and_the_other_returns_quickly(
    deployment: dict[str, Any],
) -> None:
    began = time.monotonic()
    # GIVEN a duplicate EventBridge delivery: two invocations start together
    barrier = threading.Barrier(2)

    def invoke() -> tuple[dict[str, Any], float]:
        barrier.wait()
        started = time.monotonic()
        result = leader_handler.handler(SCHEDULED_EVENT, FakeContext(3_000))
        return result, time.monotonic() - started

    # WHEN both run
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda _: invoke(), range(2)))
    # THEN exactly one led; the other found the lock held and exited after one cycle (waiting for the lock, or
    # leading, would have run more), well before its deadline
    leaders = [r for r, _ in outcomes if r["leader"]]
    followers = [(r, t) for r, t in outcomes if not r["leader"]]
    assert len(leaders) == 1
    assert len(followers) == 1
    follower, follower_s = followers[0]
    assert follower["cycles_run"] == 1
    assert follower["current_leader"] == leaders[0]["owner"]
    assert follower_s < ONE_READ_BOUND_S, stall_note(began)  # liveness
    assert leaders[0]["leases_created"] == SHARDS
    # AND the lock is free afterwards
    assert _probe_lock(deployment).try_acquire() is True


def test_given_the_lock_held_elsewhere_when_invoked_then_it_returns_leader_false_and_changes_nothing(
    deployment: dict[str, Any],
) -> None:
    # GIVEN an embedded leader (or a still-running invocation) holding the lock
    holder = _probe_lock(deployment)
    assert holder.try_acquire() is True
    # WHEN a scheduled invocation arrives
    started = time.monotonic()
    result = leader_handler.handler(SCHEDULED_EVENT, FakeContext(5_000))
    # THEN it returns after one cycle (one lock read) without touching the lease table, and the holder keeps the lock
    assert time.monotonic() - started < ONE_READ_BOUND_S, stall_note(started)  # liveness
    assert result["leader"] is False
    assert result["cycles_run"] == 1
    assert result["current_leader"] == holder.owner
    assert result["leases_created"] == 0
    assert DynamoDBLeaseStore(deployment["app"], client=deployment["ddb"]).list_leases() == []
    assert holder.is_leader() is True
    holder.release()


def test_given_warm_invocations_then_clients_are_created_once_and_reused(
    deployment: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a cold container: no clients yet
    monkeypatch.setattr(lambda_handler.warm_clients, "current", None)
    # WHEN invoked twice in the same "container"
    leader_handler.handler(SCHEDULED_EVENT, FakeContext(1_200))
    first = lambda_handler.warm_clients.current
    leader_handler.handler(SCHEDULED_EVENT, FakeContext(1_200))
    # THEN the second invocation reused the first one's boto3 clients
    assert first is not None
    assert lambda_handler.warm_clients.current is first
    # AND functions/leader/handler.py is the packaged handler, not a copy
    assert leader_handler.handler is lambda_handler.handler
    assert leader_handler.warm_clients is lambda_handler.warm_clients


def test_given_no_application_in_the_environment_then_the_handler_fails_with_one_clear_error(
    deployment: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHARDLEASE_APP")
    with pytest.raises(ConfigError, match="SHARDLEASE_APP"):
        leader_handler.handler(SCHEDULED_EVENT, FakeContext(1_000))


def test_given_typed_cycle_reports_then_metrics_come_from_their_fields() -> None:
    # GIVEN a leader cycle with a shard sync and an assignment, a failed cycle, and a cycle without the lock
    full = CycleReport(
        cycle=1,
        owner="o",
        leader=True,
        shard_sync=ShardSyncResult(shards_seen=4, open_shards=4, leases_before=2, created=("a", "b")),
        assignment=assignment_report(),
        duration_ms=42,
    )
    failed = CycleReport(cycle=2, owner="o", leader=True, error="throttled", duration_ms=7)
    not_leader = CycleReport(cycle=3, owner="o", leader=False, current_leader="other")
    # WHEN turned into metrics
    by_name = {m.name: m.value for m in cycle_metrics(full)}
    # THEN each count is read from its field (lists of lease keys are counted)
    assert by_name[LeaderMetric.CYCLES] == 1
    assert by_name[LeaderMetric.CYCLE_FAILURES] == 0
    assert by_name[LeaderMetric.CYCLE_TIME] == 42
    assert by_name[LeaderMetric.SHARDS] == 4
    assert by_name[LeaderMetric.LEASES_CREATED] == 2
    assert by_name[LeaderMetric.LEASES_DELETED] == 0
    assert by_name[LeaderMetric.EXPIRED_LEASES] == 1
    assert by_name[LeaderMetric.LEASE_MOVES] == 2
    assert by_name[LeaderMetric.HANDOFFS_FORCED] == 0
    assert by_name[LeaderMetric.WORKERS] == 2
    assert by_name[LeaderMetric.LOAD_MAX_OVER_MEAN] == 1.05
    per_worker = {(m.worker, m.name): m.value for m in worker_metrics(full)}
    assert per_worker == {
        ("w1", WorkerMetric.LEASES): 2,
        ("w2", WorkerMetric.LEASES): 2,
        ("w1", WorkerMetric.THROUGHPUT_KBPS): 10.5,
        ("w2", WorkerMetric.THROUGHPUT_KBPS): 3.0,
    }
    # AND a failed cycle counts as a failure with its time, with nothing else invented
    assert {m.name: m.value for m in cycle_metrics(failed)} == {
        LeaderMetric.CYCLES: 0.0,
        LeaderMetric.CYCLE_FAILURES: 1.0,
        LeaderMetric.CYCLE_TIME: 7.0,
    }
    assert worker_metrics(failed) == []
    # AND a host without the lock reports only that, and whether the holder is foreign (a KCL worker): here not
    assert {m.name: m.value for m in cycle_metrics(not_leader)} == {
        LeaderMetric.NOT_LEADER: 1.0,
        LeaderMetric.FOREIGN_LOCK_HOLDER: 0.0,
    }
    # AND the run's outcome sums the led cycles and names the last holder seen
    outcome = run_outcome([full, failed, not_leader], owner="o")
    assert outcome.headline() == {
        "leader": True,
        "owner": "o",
        "current_leader": "other",
        "cycles_run": 3,
        "leader_cycles": 2,
        "failed_cycles": 1,
        "leases_created": 2,
        "leases_deleted": 0,
    }
    assert json.loads(json.dumps(outcome.to_dict()))["cycles"][0]["shard_sync"]["created"] == ["a", "b"]
