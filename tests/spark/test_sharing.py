"""Two Spark applications (separate processes, local[2] each) and one plain worker share an 8-shard stream with
equal traffic per shard (50 records/s each): the leader's variance decider splits the shards by the applications'
load metric — all three within one shard of even — and the split stays put; a stopped query hands
its shards over like a worker's SIGTERM and logs no error; nothing is lost or reordered within a shard."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.journal_processor import PROCESSOR, read_journal
from tests.support.processes import process_group
from tests.support.recording import owners
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.processes import ProcessFleet
from worker_lib.testing.producers import Producer, shard_hash_keys
from worker_lib.testing.streams import create_stream
from worker_lib.testing.waiting import wait_until

pytestmark = pytest.mark.slow

SHARDS = 8
ERROR_MARKS = ("ERROR", "Exception", "Error:", "Traceback", "StackOverflow")


def spark_rows(out: Path, worker_id: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted((out / worker_id).glob("batch-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def balanced(owned: dict[str, str | None], members: set[str], even: set[str]) -> bool:
    """Every member holds a shard, and the members of ``even`` (equal capacity, same metric) within one of each
    other."""
    counts = Counter(owner for owner in owned.values())
    held = [counts[member] for member in even]
    return len(owned) == SHARDS and set(counts) == members and max(held) - min(held) <= 1


def settle(
    store: DynamoDBLeaseStore,
    members: set[str],
    even: set[str],
    *,
    quiet_s: float,
    timeout_s: float,
    accept: Callable[[dict[str, str | None]], bool] | None = None,
) -> list[str]:
    """Wait until the split is :func:`balanced` (or ``accept``-ed) and no lease has moved for ``quiet_s``; the
    moves seen."""
    history: list[str] = []
    last = owners(store)
    quiet_since = time.monotonic()
    deadline = quiet_since + timeout_s
    while time.monotonic() < deadline:
        time.sleep(1)
        now = owners(store)
        moved = [f"{key[-2:]}:{last.get(key)}->{owner}" for key, owner in now.items() if owner != last.get(key)]
        if moved:
            history.append(f"{time.strftime('%H:%M:%S')} {' '.join(moved)} {dict(Counter(now.values()))}")
            quiet_since = time.monotonic()
        last = now
        good = accept(now) if accept is not None else balanced(now, members, even)
        if good and time.monotonic() - quiet_since >= quiet_s:
            return history
    raise AssertionError("the split did not settle:\n" + "\n".join(history[-30:]))


@pytest.fixture
def shared(moto_endpoint: str, app_name: str, tmp_path: Path) -> dict[str, Any]:
    config = AwsConfig(endpoint_url=moto_endpoint, max_attempts=3, read_timeout_s=20)
    ddb, kinesis = aws.client("dynamodb", config), aws.client("kinesis", config)
    ensure_tables(app_name, ddb)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, SHARDS)
    journal = tmp_path / "journal.txt"
    journal.touch()
    env = {
        "SHARDLEASE_ENDPOINT_URL": moto_endpoint,
        "AWS_REGION": "us-east-1",
        "SHARDLEASE_TEST_JOURNAL": str(journal),
        "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
        "SHARDLEASE_LEADER_MODE": "none",
        "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS": "1000",
        "SHARDLEASE_LEADER_LOCK_DURATION_MS": "3000",
        "SHARDLEASE_LEADER_HEARTBEAT_MS": "1000",
        "SHARDLEASE_MAX_CLOCK_SKEW_MS": "500",
        "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "1000",
        "SHARDLEASE_LEADER_FAST_TICK_MS": "250",  # a departure is acted on within a quarter second of its STOPPED
        "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "2000",
        "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "2000",
        "SHARDLEASE_WORKER_METRICS_FIRST_REPORT_DELAY_MS": "500",
        "SHARDLEASE_CPU_METRIC": "process",
        "SHARDLEASE_SPARK_LOG_LEVEL": "INFO",
    }
    return {
        "app": app_name,
        "stream": stream,
        "kinesis": kinesis,
        "store": DynamoDBLeaseStore(app_name, client=ddb),
        "journal": journal,
        "env": env,
        "out": tmp_path / "spark",
    }


def even_producer(s: dict[str, Any]) -> Producer:
    """10 records into every shard every 0.2 s (50 records/s each)."""
    keys = shard_hash_keys(s["kinesis"], s["stream"])
    return Producer(s["kinesis"], s["stream"], per_tick=10 * len(keys), tick_s=0.2, hash_keys=keys)


def start_leader(group: ProcessFleet, s: dict[str, Any]) -> None:
    group.start_shardlease("leader", "leader", "--app", s["app"], "--stream", s["stream"], env=s["env"])


def start_spark(group: ProcessFleet, worker_id: str, s: dict[str, Any], *, cores: int = 2) -> None:
    args = ["--app", s["app"], "--stream", s["stream"], "--worker-id", worker_id, "--out", str(s["out"])]
    args += ["--cores", str(cores)]
    options = [
        "failover_time_ms=3000",
        "discovery_interval_ms=500",
        "metrics_report_interval_ms=2000",
        "metrics_first_report_delay_ms=500",
    ]
    for option in options:
        args += ["--option", option]
    group.start(worker_id, [sys.executable, "-m", "worker_lib.testing.spark_app", *args], env=s["env"])


def test_two_spark_applications_and_a_worker_share_a_stream(shared: dict[str, Any], tmp_path: Path) -> None:
    s = shared
    members = {"w1", "spark-a", "spark-b"}
    with process_group(tmp_path) as group, even_producer(s) as producer:
        # GIVEN a leader, a plain worker and two Spark applications on 8 equally busy shards
        start_leader(group, s)
        group.start_worker("w1", app=s["app"], stream=s["stream"], processor=PROCESSOR, env=s["env"])
        start_spark(group, "spark-a", s)
        start_spark(group, "spark-b", s)
        # WHEN they run, THEN every member holds shards, all three within one of each other (8 shards: 3/3/2, i.e.
        # within one of even — a fleet this lightly loaded is evened by count inside the band), and the split then
        # stays put
        history = settle(s["store"], members, members, quiet_s=30, timeout_s=240)
        print("lease moves until the split settled:", *history, sep="\n  ")
        # WHEN spark-b's query is stopped (SIGTERM to its application, which calls query.stop())
        b_leases = {key for key, owner in owners(s["store"]).items() if owner == "spark-b"}
        sent = time.monotonic()
        group.signal("spark-b", signal.SIGTERM)
        # THEN its shards go to the others within the hand-over targets of a worker's SIGTERM
        assert wait_until(
            lambda: all(owners(s["store"])[key] in {"w1", "spark-a"} for key in b_leases), timeout_s=30, step_s=0.1
        ), owners(s["store"])
        moved_at = time.monotonic()
        assert group.wait("spark-b", timeout_s=60) == 0
        # A worker's SIGTERM hand-over starts when its batch in flight ends; a Spark application's when its query
        # stops, after the micro-batch in flight (3–4.5 s each on a loaded 2-core machine): measured from there.
        stopped_at = float(re.findall(r"query stopped at monotonic ([0-9.]+)", group.log("spark-b"))[-1])
        drained_s, handed_over_s = stopped_at - sent, moved_at - stopped_at
        print(f"query stopped {drained_s:.2f} s after SIGTERM; its leases moved {handed_over_s:.2f} s after that")
        producer.stop()
        produced = set(producer.produced)

        # AND every record produced reaches a sink
        def consumed() -> set[str]:
            rows = spark_rows(s["out"], "spark-a") + spark_rows(s["out"], "spark-b")
            return {row["data"] for row in rows} | {r[4] for r in read_journal(s["journal"])}

        assert wait_until(lambda: consumed() >= produced, timeout_s=90, step_s=1), len(produced - consumed())
    assert drained_s < 30, drained_s  # the micro-batch in flight, bounded by the stop's timeout
    assert handed_over_s < 5, (drained_s, handed_over_s)  # DEPARTING + STOPPED, then the next leader cycle (1 s)
    # AND within each Spark application each shard's records come in sequence order: within a micro-batch, and
    # from one micro-batch to the next
    for worker_id in ("spark-a", "spark-b"):
        last: dict[str, int] = {}
        for row in spark_rows(s["out"], worker_id):
            assert int(row["seq"]) > last.get(row["shard"], -1), (worker_id, row)
            last[row["shard"]] = int(row["seq"])
    # AND the stopped application logged no Java or Python error
    log = group.log("spark-b")
    errors = [line for line in log.splitlines() if any(mark in line for mark in ERROR_MARKS)]
    assert not errors, "\n".join(errors[:20])
    # AND it left as a worker leaves on SIGTERM: the leader read its STOPPED state (not an expiry)
    assert "stopped worker spark-b" in group.log("leader")


def test_an_application_with_half_the_cores_gets_a_third_of_the_shards(shared: dict[str, Any], tmp_path: Path) -> None:
    s = shared
    members = {"spark-a", "spark-b"}

    def a_third(owned: dict[str, str | None]) -> bool:
        counts = Counter(owned.values())
        return len(owned) == SHARDS and counts["spark-a"] == 5 and counts["spark-b"] == 3

    with process_group(tmp_path) as group, even_producer(s):
        # GIVEN a leader and two Spark applications on 8 equally busy shards, spark-b with half the cores (local[1])
        start_leader(group, s)
        start_spark(group, "spark-a", s, cores=2)
        start_spark(group, "spark-b", s, cores=1)
        # WHEN they run (a fleet this lightly loaded is evened by lease count in proportion to the executor slots
        # each application reports), THEN spark-b ends with a third of the shards, 5/3 (shares 5.33 / 2.67), and the
        # split then stays put
        history = settle(s["store"], members, members, quiet_s=30, timeout_s=240, accept=a_third)
        print("lease moves until the split settled:", *history, sep="\n  ")
        # AND neither application has logged a Java or Python error while running
        for worker_id in sorted(members):
            log = group.log(worker_id)
            errors = [line for line in log.splitlines() if any(mark in line for mark in ERROR_MARKS)]
            assert not errors, "\n".join(errors[:20])
