"""Bad inputs while the system runs: corrupt and foreign lease-table items, a processor that raises (policy
skip, policy stop with a transient failure), a 1 MiB record, invalid configuration values for `shardlease worker`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.conftest import Rig, put
from tests.support.chaos import wait_for
from tests.support.processes import REPO
from tests.support.recording import RecordingProcessor
from worker_lib.processing.config import ConsumerConfig, ProcessorFailurePolicy
from worker_lib.processing.processor import ProcessRecordsInput
from worker_lib.tables.schema import lease_table_name

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kcl3_lease_items.json"

pytestmark = pytest.mark.slow


def test_corrupt_and_foreign_lease_items_are_left_alone_while_workers_run(rig: Rig) -> None:
    # GIVEN the lease table holds KCL's foreign entities and corrupt items next to our leases
    fixture = json.loads(FIXTURE.read_text())
    table = lease_table_name(rig.app)
    odd = fixture["foreign"] + fixture["corrupt"]
    for item in odd:
        rig.ddb.put_item(TableName=table, Item=item)
    # WHEN two workers with embedded leaders run and records arrive
    rig.start()
    produced = put(rig.kinesis, rig.stream, 0, 200)
    # THEN every record is processed once, by workers that never crash on those items
    assert wait_for(lambda: set(rig.processed()) >= set(produced), timeout_s=30)
    assert all(worker.shutdown(timeout_s=10) for worker in rig.workers)
    assert sorted(rig.processed()) == sorted(produced)
    # AND the odd items are exactly as they were (nobody assigned, renewed or deleted them)
    for item in odd:
        stored = rig.ddb.get_item(TableName=table, Key={"leaseKey": item["leaseKey"]}, ConsistentRead=True)
        assert stored.get("Item") == item


def test_policy_skip_logs_and_skips_the_poison_batch_and_processes_the_rest(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    class Poisoned(RecordingProcessor):
        def process_records(self, input: ProcessRecordsInput) -> None:
            if any(r.data.startswith(b"poison") for r in input.records):
                raise ValueError("cannot parse")
            super().process_records(input)

    rig.consumer = ConsumerConfig(
        processor_retries=1, processor_retry_backoff_ms=10, failure_policy=ProcessorFailurePolicy.SKIP
    )
    rig.processor = Poisoned
    # GIVEN a poison record among good ones, and policy skip
    rig.start()
    good = put(rig.kinesis, rig.stream, 0, 50)
    assert wait_for(lambda: set(rig.processed()) >= set(good), timeout_s=30)
    rig.kinesis.put_record(StreamName=rig.stream, Data=b"poison", PartitionKey="f000000")
    # WHEN its batch has failed 1 + 1 times and more good records follow
    assert wait_for(lambda: any("policy skip" in r.getMessage() for r in caplog.records), timeout_s=30)
    later = put(rig.kinesis, rig.stream, 50, 50)
    # THEN the poison batch (the whole batch: at-most-once for it) was skipped with a line giving its range, the
    # later records are processed, and no lease was lost
    assert wait_for(lambda: set(rig.processed()) >= set(later), timeout_s=30)
    assert any("policy skip" in r.getMessage() for r in caplog.records)
    assert b"poison" not in rig.processed()
    assert rig.lost() == []


def test_policy_stop_with_a_transient_failure_retries_the_batch_from_the_checkpoint(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    failures = [0]

    class Flaky(RecordingProcessor):
        def process_records(self, input: ProcessRecordsInput) -> None:
            if any(r.data.startswith(b"flaky") for r in input.records) and failures[0] < 2:
                failures[0] += 1
                raise ConnectionError("downstream unavailable")
            super().process_records(input)

    rig.consumer = ConsumerConfig(processor_retries=1, processor_retry_backoff_ms=10)  # policy stop (default)
    rig.processor = Flaky
    # GIVEN a processor whose downstream fails twice on one batch, then recovers
    rig.start()
    produced = put(rig.kinesis, rig.stream, 0, 20)
    assert wait_for(lambda: set(rig.processed()) >= set(produced), timeout_s=30)
    rig.kinesis.put_record(StreamName=rig.stream, Data=b"flaky", PartitionKey="f000000")
    produced.append(b"flaky")
    produced += put(rig.kinesis, rig.stream, 20, 20)
    # THEN the lease is given up with a clear line, reassigned by the leader, and the batch read again: nothing lost
    assert wait_for(lambda: set(rig.processed()) >= set(produced), timeout_s=40)
    assert failures[0] == 2
    assert any("policy stop" in r.getMessage() for r in caplog.records)
    assert all(worker.shutdown(timeout_s=10) for worker in rig.workers)
    assert rig.processed().count(b"flaky") == 1


def test_a_one_mib_record_is_processed_whole(rig: Rig) -> None:
    # GIVEN a record at Kinesis's 1 MiB size limit (data + partition key) between small ones
    big = b"B" * (1024 * 1024 - 1)
    rig.start()
    before = put(rig.kinesis, rig.stream, 0, 10)
    rig.kinesis.put_record(StreamName=rig.stream, Data=big, PartitionKey="k")
    after = put(rig.kinesis, rig.stream, 10, 10)
    # THEN it is delivered whole, in its place, and the small ones around it too
    assert wait_for(lambda: set(rig.processed()) >= {*before, big, *after}, timeout_s=30)
    assert all(worker.shutdown(timeout_s=10) for worker in rig.workers)
    assert sorted(rig.processed()) == sorted([*before, big, *after])


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("SHARDLEASE_FAILOVER_TIME_MS", "ten", "SHARDLEASE_FAILOVER_TIME_MS='ten' is not a whole number"),
        ("SHARDLEASE_FAILOVER_TIME_MS", "10", "failover_time_ms=10 is too short"),
        ("SHARDLEASE_PROCESSOR_FAILURE_POLICY", "sometimes", "expected stop or skip"),
        ("SHARDLEASE_LEADER_MODE", "maybe", "invalid leader_mode 'maybe'"),
        ("SHARDLEASE_INITIAL_POSITION", "YESTERDAY", "invalid initial position"),
        ("SHARDLEASE_KINESIS_ENDPOINT_URL", "localhost:1", "invalid endpoint URL"),
        ("SHARDLEASE_HEARTBEAT_INTERVAL_MS", "5", "heartbeat_interval_ms=5 must be 0 (off) or between 100"),
        ("SHARDLEASE_HEARTBEAT_INTERVAL_MS", "often", "SHARDLEASE_HEARTBEAT_INTERVAL_MS='often' is not a whole"),
        ("SHARDLEASE_DISCOVERY_INTERVAL_MS", "1", "discovery_interval_ms must be at least 100"),
    ],
)
def test_an_invalid_configuration_value_is_one_line_and_exit_2(name: str, value: str, fragment: str) -> None:
    # GIVEN one invalid SHARDLEASE_* value WHEN `shardlease worker` starts
    args = ["worker", "--app", "app-x", "--stream", "s", "--processor", "tests.support.chaos:ChaosProcessor"]
    if name != "SHARDLEASE_INITIAL_POSITION":
        args += ["--endpoint-url", "http://127.0.0.1:9"]
    # THEN it exits 2 before any I/O with exactly one line naming the problem, no traceback
    assert_one_line_usage_error(args, name, value, fragment)


def assert_one_line_usage_error(args: list[str], name: str, value: str, fragment: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), name: value}
    result = subprocess.run(
        [sys.executable, "-m", "worker_lib.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("SHARDLEASE_LEADER_FAST_TICK_MS", "50", "fast_tick_ms=50 must be 0 (off) or between 100"),
        ("SHARDLEASE_LEADER_TAKEOVER_WAIT_MS", "-1", "takeover_wait_ms=-1 must not be negative"),
        ("SHARDLEASE_LEADER_TERM_MS", "10", "term_ms=10 must be at least 1000"),
        ("SHARDLEASE_LEADER_LOCK_DURATION_MS", "6000", "heartbeat_interval_ms must be positive and at most a third"),
    ],
)
def test_an_invalid_leader_value_is_one_line_and_exit_2(name: str, value: str, fragment: str) -> None:
    # GIVEN one invalid leader setting WHEN `shardlease leader` starts
    args = ["leader", "--app", "app-x", "--stream", "s", "--once", "--endpoint-url", "http://127.0.0.1:9"]
    # THEN it exits 2 before any I/O with exactly one line naming the problem, no traceback
    assert_one_line_usage_error(args, name, value, fragment)
