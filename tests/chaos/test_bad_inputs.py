"""Bad inputs while the system runs: corrupt and foreign lease-table items, a processor that raises (policy
skip, policy stop with a transient failure), a 1 MiB record, invalid configuration values for `shardlease worker`,
a process configured for the other liveness mode than the application's; and bad command lines (an invalid region,
out-of-range demo sizes, non-finite durations, a closed stdout).

Every wait is a liveness bound: the rig's from its configured timings (``Rig.timings``), a command's run from the floor
of tests/support/stalls.py (such a command ends at once: nothing configured to wait for).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.conftest import Rig, put
from tests.support.processes import REPO, run_command, shardlease_liveness
from tests.support.recording import RecordingProcessor
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.processing.config import FailureConfig
from worker_lib.processing.processor import ProcessRecordsInput
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import lease_table_name
from worker_lib.testing.streams import create_stream

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kcl3_lease_items.json"
# A `shardlease` command that ends at once (a usage error, one read, a closed pipe): no configured timing to wait for,
# so its run is bounded by the liveness floor.
COMMAND_BOUND_S = hang_bound_s(0.0)

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
    eventually(
        lambda: set(rig.processed()) >= set(produced),
        bound_s=hang_bound_s(rig.timings.start_s),
        what="every record processed",
    )
    assert rig.stop()
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

    rig.failures = FailureConfig(on_failure="skip", max_attempts=2, retry_backoff_ms=10)
    rig.processor = Poisoned
    # GIVEN a poison record among good ones, and policy skip
    t = rig.timings
    rig.start()
    good = put(rig.kinesis, rig.stream, 0, 50)
    eventually(lambda: set(rig.processed()) >= set(good), bound_s=hang_bound_s(t.start_s), what="the good records")
    rig.kinesis.put_record(StreamName=rig.stream, Data=b"poison", PartitionKey="f000000")
    # WHEN its batch has failed 1 + 1 times (10 ms apart) and more good records follow
    eventually(
        lambda: any("policy skip" in r.getMessage() for r in caplog.records),
        bound_s=hang_bound_s(t.idle_s + rig.failures.retry_backoff_s(1)),
        what="the poison batch skipped",
    )
    later = put(rig.kinesis, rig.stream, 50, 50)
    # THEN the poison batch (the whole batch: at-most-once for it) was skipped with a line giving its range, the
    # later records are processed, and no lease was lost
    eventually(lambda: set(rig.processed()) >= set(later), bound_s=hang_bound_s(t.idle_s), what="the later records")
    assert any("policy skip" in r.getMessage() for r in caplog.records)
    assert b"poison" not in rig.processed()
    assert rig.lost() == []


def test_policy_retry_with_a_transient_failure_retries_the_batch_from_the_checkpoint(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    failures = [0]

    class Flaky(RecordingProcessor):
        def process_records(self, input: ProcessRecordsInput) -> None:
            if any(r.data.startswith(b"flaky") for r in input.records) and failures[0] < 2:
                failures[0] += 1
                raise ConnectionError("downstream unavailable")
            super().process_records(input)

    rig.failures = FailureConfig(max_attempts=2, retry_backoff_ms=10)  # policy retry (default)
    rig.processor = Flaky
    # GIVEN a processor whose downstream fails twice on one batch, then recovers
    t = rig.timings
    rig.start()
    produced = put(rig.kinesis, rig.stream, 0, 20)
    eventually(lambda: set(rig.processed()) >= set(produced), bound_s=hang_bound_s(t.start_s), what="the first records")
    rig.kinesis.put_record(StreamName=rig.stream, Data=b"flaky", PartitionKey="f000000")
    produced.append(b"flaky")
    produced += put(rig.kinesis, rig.stream, 20, 20)
    # THEN the lease is given up with a clear line, reassigned by the leader, and the batch read again: nothing lost
    eventually(
        lambda: set(rig.processed()) >= set(produced),
        bound_s=hang_bound_s(t.cycle_s + t.notice_s),
        what="every record processed after the lease was given up",
    )
    assert failures[0] == 2
    assert any("policy retry" in r.getMessage() for r in caplog.records)
    assert rig.stop()
    assert rig.processed().count(b"flaky") == 1


def test_a_one_mib_record_is_processed_whole(rig: Rig) -> None:
    # GIVEN a record at Kinesis's 1 MiB size limit (data + partition key) between small ones
    big = b"B" * (1024 * 1024 - 1)
    rig.start()
    before = put(rig.kinesis, rig.stream, 0, 10)
    rig.kinesis.put_record(StreamName=rig.stream, Data=big, PartitionKey="k")
    after = put(rig.kinesis, rig.stream, 10, 10)
    # THEN it is delivered whole, in its place, and the small ones around it too
    eventually(
        lambda: set(rig.processed()) >= {*before, big, *after},
        bound_s=hang_bound_s(rig.timings.start_s),
        what="every record processed",
    )
    assert rig.stop()
    assert sorted(rig.processed()) == sorted([*before, big, *after])


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("SHARDLEASE_FAILOVER_TIME_MS", "ten", "SHARDLEASE_FAILOVER_TIME_MS='ten' is not a whole number"),
        ("SHARDLEASE_FAILOVER_TIME_MS", "10", "failover_time_ms=10 is too short"),
        ("SHARDLEASE_FAILURE_POLICY", "sometimes", "expected retry, skip-and-record, stop-shard or skip"),
        ("SHARDLEASE_FAILURE_POLICY", "skip-and-record", "needs a failure destination"),
        ("SHARDLEASE_FAILURE_DESTINATION", "my-queue", "invalid failure destination 'my-queue'"),
        ("SHARDLEASE_LEADER_MODE", "maybe", "invalid leader_mode 'maybe'"),
        ("SHARDLEASE_INITIAL_POSITION", "YESTERDAY", "invalid initial position"),
        ("SHARDLEASE_KINESIS_ENDPOINT_URL", "localhost:1", "invalid endpoint URL"),
        ("SHARDLEASE_HEARTBEAT_INTERVAL_MS", "5", "heartbeat_interval_ms=5 must be 0 (off) or between 100"),
        ("SHARDLEASE_HEARTBEAT_INTERVAL_MS", "often", "SHARDLEASE_HEARTBEAT_INTERVAL_MS='often' is not a whole"),
        ("SHARDLEASE_DISCOVERY_INTERVAL_MS", "1", "discovery_interval_ms must be at least 100"),
        ("SHARDLEASE_PARALLELISM", "0", "parallelism=0 must be within 1..256"),
        ("SHARDLEASE_PARALLELISM", "many", "SHARDLEASE_PARALLELISM='many' is not a whole number"),
        ("SHARDLEASE_LANE_KEY", "nope", "invalid lane key 'nope'"),
        ("SHARDLEASE_LANE_KEY", "no.such.module:f", "invalid lane key 'no.such.module:f': no module named 'no'"),
    ],
)
def test_an_invalid_configuration_value_is_one_line_and_exit_2(name: str, value: str, fragment: str) -> None:
    # GIVEN one invalid SHARDLEASE_* value WHEN `shardlease worker` starts
    args = ["worker", "--app", "app-x", "--stream", "s", "--processor", "tests.support.chaos:ChaosProcessor"]
    if name != "SHARDLEASE_INITIAL_POSITION":
        args += ["--endpoint-url", "http://127.0.0.1:9"]
    # THEN it exits 2 before any I/O with exactly one line naming the problem, no traceback
    assert_one_line_usage_error(args, name, value, fragment)


def run_cli(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``shardlease <args>`` from this checkout, with ``env`` on top of this process's environment."""
    command = [sys.executable, "-m", "worker_lib.cli", *args]
    return run_command(command, timeout_s=COMMAND_BOUND_S, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env})


def assert_one_line_usage_error(args: list[str], name: str, value: str, fragment: str) -> None:
    result = run_cli(args, **{name: value})
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


@pytest.mark.parametrize(
    ("role", "configured", "stored"),
    [("worker", "lease", "worker"), ("leader", "lease", "worker"), ("worker", "worker", "lease")],
)
def test_a_process_configured_for_the_other_liveness_mode_refuses_to_start_with_one_line(
    moto_aws: AwsConfig, moto_endpoint: str, app_name: str, *, role: str, configured: str, stored: str
) -> None:
    # GIVEN an application whose liveness mode is recorded as `stored` (tables and stream exist)
    ensure_tables(app_name, aws.client("dynamodb", moto_aws))
    create_stream(aws.client("kinesis", moto_aws), f"{app_name}-s", 1)
    shardlease_liveness(app_name, moto_endpoint, target=stored)
    # WHEN a worker (or leader) configured for the other mode starts
    args = [role, "--app", app_name, "--stream", f"{app_name}-s", "--endpoint-url", moto_endpoint]
    args += ["--processor", "tests.support.chaos:ChaosProcessor"] if role == "worker" else ["--once"]
    result = run_cli(args, SHARDLEASE_LIVENESS_MODE=configured, SHARDLEASE_CHAOS_JOURNAL=os.devnull)
    # THEN it exits non-zero (2: a configuration error) with exactly one line naming both modes, no traceback
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"configured for liveness mode {configured!r}" in lines[0], lines[0]
    assert f"the application runs in {stored!r}" in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    # AND the stored mode is left as it was
    assert shardlease_liveness(app_name, moto_endpoint)["mode"] == stored


@pytest.mark.parametrize(
    ("args", "env", "code", "fragment"),
    [
        (["status", "--app", "app-x", "--region", "mars 1"], {}, 2, "invalid region 'mars 1'"),
        (
            ["status", "--app", "app-x", "--endpoint-url", "http://127.0.0.1:9"],
            {"AWS_REGION": "mars 1"},
            2,
            "invalid region 'mars 1'",
        ),
        (["status", "--app", "app-x", "--interval", "inf", "--watch"], {}, 2, "'inf' is not a finite number"),
        (["demo", "--workers", "1000"], {}, 2, "argument --workers: 1000 is out of range 1..16"),
        (["simulate", "--workers", "20000"], {}, 2, "argument --workers: 20000 is out of range 1..2000"),
        (["simulate", "--cycles", "100000"], {}, 2, "argument --cycles: 100000 is out of range 1..200"),
        (["demo", "--workers", "0"], {}, 2, "argument --workers: 0 must be at least 1"),
        (["demo", "--shards", "65"], {}, 2, "argument --shards: 65 is out of range 3..64"),
        (["demo", "--shards", "2"], {}, 2, "argument --shards: 2 is out of range 3..64"),
        (["demo", "--duration", "nan"], {}, 2, "argument --duration: 'nan' is not a finite number"),
        (["demo", "--duration", "10"], {}, 2, "the default scenario needs --duration of at least 30 seconds"),
        (["demo", "--scenario", "everything"], {}, 2, "unknown scenario 'everything'"),
        (["create-tables", "--app", "app-x", "--timeout", "-1"], {}, 2, "argument --timeout: -1.0 must be positive"),
    ],
)
def test_a_bad_command_line_is_one_line_and_the_right_exit_code(
    args: list[str], env: dict[str, str], code: int, fragment: str
) -> None:
    # WHEN the command line holds an invalid value THEN one line names it, before any process or I/O starts
    result = run_cli(args, **env)
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert result.stdout == ""


def test_status_into_a_closed_pipe_exits_1_without_a_traceback(moto_endpoint: str, app_name: str) -> None:
    # GIVEN a fleet's tables
    ensure_tables(app_name, aws.client("dynamodb", AwsConfig(endpoint_url=moto_endpoint)))
    # WHEN `status` writes into a pipe whose reader is gone (what `status | head -4` meets once head has exited)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        process = subprocess.run(
            [sys.executable, "-m", "worker_lib.cli", "status", "--app", app_name, "--endpoint-url", moto_endpoint],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=COMMAND_BOUND_S,
            cwd=REPO,
            check=False,
        )
    finally:
        os.close(write_end)
    # THEN it exits 1 with at most one short line on stderr, and no traceback
    assert process.returncode == 1, process.stderr
    assert len(process.stderr.strip().splitlines()) <= 1 and "Traceback" not in process.stderr


def test_status_watch_piped_into_head_exits_1_without_a_traceback(
    moto_endpoint: str, app_name: str, tmp_path: Path
) -> None:
    ensure_tables(app_name, aws.client("dynamodb", AwsConfig(endpoint_url=moto_endpoint)))
    # GIVEN `status --watch | head -4`, as a user types it: head exits after the first screen, status goes on
    command = (
        f"{sys.executable} -m worker_lib.cli status --app {app_name} --endpoint-url {moto_endpoint} --watch "
        f"--interval 0.2 2>{tmp_path / 'status.err'} | head -4; echo ${{PIPESTATUS[0]}}"
    )
    result = run_command(
        ["bash", "-c", command], timeout_s=COMMAND_BOUND_S, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    *shown, status_code = result.stdout.strip().splitlines()
    # THEN head shows four lines (a piped frame starts with its time), and status exits 1 quietly once it notices
    assert len(shown) == 4 and shown[0].startswith("--- ") and shown[1].startswith(f"app {app_name}")
    assert status_code == "1"
    err = (tmp_path / "status.err").read_text()
    assert len(err.strip().splitlines()) <= 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--failure-policy", "skip-and-record"], "skip-and-record needs a failure destination"),
        (["--failure-destination", "https://example.com/q"], "invalid failure destination"),
        (["--max-attempts", "0"], "max_attempts=0 must be within 1..10000"),
        (["--max-record-age", "60"], "max_record_age_s needs a failure destination"),
        (["--parallelism", "0"], "parallelism=0 must be within 1..256"),
        (["--parallelism", "257"], "parallelism=257 must be within 1..256"),
        (["--parallelism", "x"], "argument --parallelism: 'x' is not a whole number"),
        (["--lane-key", "no.such.module:f"], "invalid lane key 'no.such.module:f': no module named 'no'"),
    ],
)
def test_an_invalid_worker_flag_is_one_line_and_exit_2(flags: list[str], fragment: str) -> None:
    # GIVEN a failure-policy flag that cannot work WHEN `shardlease worker` starts THEN one line, exit 2, no I/O
    args = ["worker", "--app", "app-x", "--stream", "s", "--processor", "tests.support.chaos:ChaosProcessor"]
    assert_one_line_usage_error(
        [*args, *flags, "--endpoint-url", "http://127.0.0.1:9"], "PYTHONDONTWRITEBYTECODE", "1", fragment
    )
