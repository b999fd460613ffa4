"""The example job on a real standalone Spark cluster, submitted the way docs/spark.md tells cluster users to.

A master and two workers (one core each, separate JVMs) from PySpark's own ``spark-class``; the job
(examples/spark_pipeline.py) goes in with ``spark-submit --archives env.tar.gz#environment``: a virtualenv built from
the wheel and packed with venv-pack, exactly as docs/spark.md's recipe says — nothing from the checkout is on any
path of the driver or the executors (the job reports where it imported ``worker_lib`` from). Kinesis and DynamoDB
on moto, a ``shardlease leader`` process assigning the leases, a producer writing events meanwhile.

What is checked: both executors read shards (Spark's own event log: the source's tasks ran on executor 0 and 1);
one executor SIGKILLed in the middle of the run (Spark retries its tasks elsewhere or on its replacement); the driver
SIGKILLed and submitted again with the same checkpoint location; in the end the Parquet output holds every event
exactly once (its per-window counts and amounts add up to what was produced), and the leases' checkpoints are at the
stream's tips. Then a second application joins on the same stream: the leader splits the shards between the two by
load (two each); the second is stopped with SIGTERM and the leader hands its leases to the first within seconds of
their release; every event reaches one of the two outputs.

Marked slow: about three minutes (177 s alone) on the 2-core machine (the virtualenv and its pack, two JVM workers,
three drivers, three executors at most); heavy: a cluster of JVMs. Every wait is a liveness bound
(tests/support/stalls.py) on what the configured timings below give; what is asserted — every event exactly once,
the checkpoints at the tips, who holds the leases, a departure seen by the leader — is exact. The hand-over's
seconds are printed, not judged.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark.support import exit_code
from tests.support.processes import REPO, eventually_showing, shardlease_run
from tests.support.stalls import eventually, hang_bound_s
from tests.support.wheel import build_wheel, clean_env, fresh_venv
from worker_lib.assignment.config import AssignmentConfig
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.spark.source import DEPARTURE_TIMEOUT_S
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.producers import Producer
from worker_lib.testing.spark_cluster import SparkCluster
from worker_lib.testing.streams import create_stream, record_positions

SHARDS = 4
EXAMPLE = REPO / "examples" / "spark_pipeline.py"

# --- the configured timings (the example's trigger, the job's options, the leader's environment) and what they give --

TRIGGER_S = 5.0  # examples/spark_pipeline.py --continuous: a processing-time trigger of 5 s
REPORT_S = 1.0  # the job's metrics_report_interval_ms
LEADER_CYCLE_S = 1.0  # the leader's SHARDLEASE_LEADER_CYCLE_INTERVAL_MS
LEADER_FAST_TICK_S = 0.25  # the leader's SHARDLEASE_LEADER_FAST_TICK_MS: a departure is acted on within this
BALANCING_S = AssignmentConfig().balancing_frequency * LEADER_CYCLE_S  # one lease moved per balancing run, at most

APP_START_S = 45.0
"""Not a setting: ``spark-submit`` of the example until its query's tasks have run on its executors — the driver's JVM
and session, an executor per worker fetching and unpacking the packed environment, PySpark's Python daemons and the
source runner (49 s to tasks on both executors at a load average of 9, 2026-11-27)."""
MICRO_BATCH_S = 5.0
"""Not a setting: one micro-batch on the cluster (tasks on the executors, the Parquet write, the commit)."""
APP_STOP_S = 15.0
"""Not a setting: the example on SIGTERM after its query stopped: its closing summary (a Spark job reading the
output), the session's stop, the JVM's exit."""

FIRST_TASKS_BOUND_S = hang_bound_s(APP_START_S + 2 * TRIGGER_S)
"""The first job's tasks on both executors: its start, and a micro-batch or two once both executors registered."""
LAG_BOUND_S = hang_bound_s(TRIGGER_S + REPORT_S)
"""Every shard's lag in `shardlease status`: a micro-batch's reads, then the next report."""
BATCHES_BOUND_S = hang_bound_s(3 * TRIGGER_S)
"""Two more micro-batches after an executor's loss: the batch in flight again (its tasks elsewhere), then two."""
RESTART_BOUND_S = hang_bound_s(APP_START_S + 2 * TRIGGER_S)
"""The resubmitted job writes a micro-batch: its start, the killed one's batch replayed, a new one."""
CATCH_UP_BOUND_S = hang_bound_s(3 * TRIGGER_S)
"""Every event produced in the output once the producer stopped: the batch under way, the next, one replayed."""
COMMIT_BOUND_S = hang_bound_s(2 * TRIGGER_S)
"""The checkpoints at the tips: the last batch commits, and the next trigger writes its checkpoints."""
SPLIT_BOUND_S = hang_bound_s(APP_START_S + REPORT_S + SHARDS * BALANCING_S + 2 * TRIGGER_S)
"""The second job's share: its start and first report, at most every lease moved once (one per balancing run), the
last hand-off completed at its donor's next commit."""
OWN_BATCHES_BOUND_S = hang_bound_s(2 * TRIGGER_S + MICRO_BATCH_S)
"""The second job's first two micro-batches of its own shards."""
HANDOVER_BOUND_S = hang_bound_s(TRIGGER_S + MICRO_BATCH_S + LEADER_FAST_TICK_S + LEADER_CYCLE_S)
"""A SIGTERMed job's leases with the other: the micro-batch in flight ends, the query stops, its source leaves
(DEPARTING, leases given up, STOPPED), and the leader acts at its next tick."""
DEPARTURE_SEEN_BOUND_S = hang_bound_s(2 * LEADER_CYCLE_S)
"""The leader's housekeeping deletes a STOPPED worker's item after its next full cycle."""
STOP_BOUND_S = hang_bound_s(TRIGGER_S + MICRO_BATCH_S + APP_STOP_S)
"""A SIGTERMed job exits: the micro-batch in flight, then APP_STOP_S."""
GIVEN_UP_BOUND_S = hang_bound_s(DEPARTURE_TIMEOUT_S)
"""The source runner leaves on a thread of its own once Spark ends it, and ends by its deadline whatever happens."""

SETUP_S = 90.0
"""Not a setting: the wheel, a virtualenv with it and pyarrow, its pack and unpacking, the cluster's start (41 s at a
load average of 9; each step also has a hang guard of its own, generous for a pip install from the network)."""
SETUP_BOUND_S = hang_bound_s(SETUP_S)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.heavy,
    # the whole test: its setup, and its liveness bounds one after another
    pytest.mark.timeout(
        int(
            SETUP_BOUND_S
            + FIRST_TASKS_BOUND_S
            + LAG_BOUND_S
            + BATCHES_BOUND_S
            + RESTART_BOUND_S
            + COMMIT_BOUND_S
            + SPLIT_BOUND_S
            + OWN_BATCHES_BOUND_S
            + HANDOVER_BOUND_S
            + DEPARTURE_SEEN_BOUND_S
            + 2 * CATCH_UP_BOUND_S  # the first producer's events, then both producers'
            + 2 * STOP_BOUND_S
            + GIVEN_UP_BOUND_S
        )
    ),
]


def packed_env(work: Path) -> tuple[Path, Path]:
    """docs/spark.md's recipe for a cluster without a bootstrap step: the wheel and pyarrow in a virtualenv, packed
    with venv-pack. (the virtualenv's python for the driver, the archive for the executors)"""
    wheel = build_wheel(work / "wheel")
    env_dir = work / "env"
    bin_dir = fresh_venv(env_dir, wheel)
    subprocess.run(
        [
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "pyarrow>=18",
            "venv-pack",
        ],
        check=True,
        capture_output=True,
        timeout=900,
    )
    archive = work / "env.tar.gz"
    subprocess.run(
        [str(bin_dir / "venv-pack"), "-p", str(env_dir), "-o", str(archive)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return bin_dir / "python", archive


KINDS = ("order", "refund", "view")


def event(record_id: str) -> bytes:
    """The example's JSON event for a producer's record id ``e0000042``: kind and amount follow from its number."""
    n = int(record_id[1:])
    return json.dumps({"id": n, "kind": KINDS[n % 3], "amount": float(n % 100), "ts": time.time()}).encode()


def expected(produced: list[str]) -> tuple[int, dict[str, float]]:
    amounts: dict[str, float] = {}
    for record_id in produced:
        n = int(record_id[1:])
        amounts[KINDS[n % 3]] = round(amounts.get(KINDS[n % 3], 0.0) + float(n % 100), 2)
    return len(produced), amounts


def task_executors(event_logs: Path) -> set[str]:
    """The executor ids Spark's event log records for finished tasks (every application in the directory)."""
    found: set[str] = set()
    for path in (p for p in event_logs.rglob("*") if p.is_file()):  # Spark 4's rolling logs: a directory per app
        for line in path.read_text(errors="replace").splitlines():
            if '"SparkListenerTaskEnd"' in line:
                found.add(json.loads(line)["Task Info"]["Executor ID"])
    return found


def lagging_shards(app: str, endpoint: str) -> int:
    """How many shards `shardlease status --json` reports a lag for, owned by the Spark application."""
    status = shardlease_run("status", "--app", app, "--endpoint-url", endpoint, "--json")
    lags = json.loads(status.stdout)["lags"] if status.returncode == 0 else []
    return sum(1 for lag in lags if lag["owner"] == "cluster-a")


def checkpoints_at_tips(kinesis: Any, ddb: Any, app: str, stream: str) -> bool:
    """Every lease's checkpoint is its shard's last record (the producer has stopped)."""
    tips = {shard: positions[1] for shard, positions in _last_per_shard(kinesis, stream).items()}
    leases = DynamoDBLeaseStore(app, client=ddb).list_leases()
    return {lease.lease_key: lease.checkpoint.sequence for lease in leases} == tips


def _last_per_shard(kinesis: Any, stream: str) -> dict[str, tuple[str, str]]:
    last: dict[str, tuple[str, str]] = {}
    for record_id, (shard, sequence) in record_positions(kinesis, stream).items():
        if shard not in last or int(sequence) > int(last[shard][1]):
            last[shard] = (record_id, sequence)
    return last


def aggregated(output: Path) -> tuple[int, dict[str, float]]:
    """The Parquet output's total events and amount per kind (each batch directory counts once: a replayed batch
    overwrote its own)."""
    import pyarrow.parquet as pq

    total, amounts = 0, dict[str, float]()
    for part in output.glob("batch_id=*/*.parquet"):
        table = pq.read_table(part).to_pylist()
        for row in table:
            total += int(row["events"])
            amounts[row["kind"]] = round(amounts.get(row["kind"], 0.0) + float(row["amount"]), 2)
    return total, amounts


def batches_written(output: Path) -> int:
    """Micro-batches the example has written to its Parquet output so far."""
    return len(list(output.glob("batch_id=*")))


def owners(store: DynamoDBLeaseStore) -> dict[str, str | None]:
    return {lease.lease_key: lease.lease_owner for lease in store.list_leases()}


def split(store: DynamoDBLeaseStore) -> dict[str | None, int]:
    counts: dict[str | None, int] = {}
    for owner in owners(store).values():
        counts[owner] = counts.get(owner, 0) + 1
    return counts


def hand_over(store: DynamoDBLeaseStore, leaving: str, staying: str) -> tuple[float, float]:
    """Watch ``leaving``'s leases go to ``staying`` (within HANDOVER_BOUND_S): (when the first was given up, when the
    last was ``staying``'s), monotonic seconds; polled every 0.1 s."""
    keys = {key for key, owner in owners(store).items() if owner == leaving}
    released_at: float | None = None
    moved_at = 0.0

    def moved() -> bool:
        nonlocal released_at, moved_at
        now, found = time.monotonic(), owners(store)
        if released_at is None and any(found[key] != leaving for key in keys):
            released_at = now
        moved_at = now
        return all(found[key] == staying for key in keys)

    eventually_showing(
        moved,
        bound_s=HANDOVER_BOUND_S,
        what=f"{leaving}'s leases {sorted(keys)} all {staying}'s",
        detail=lambda: owners(store),
    )
    return released_at if released_at is not None else moved_at, moved_at


def test_the_example_on_a_standalone_cluster_reads_on_both_executors_survives_kills_and_shares_the_stream(
    moto_endpoint: str, app_name: str, tmp_path: Path
) -> None:
    aws_config = AwsConfig(endpoint_url=moto_endpoint, max_attempts=3)
    kinesis, ddb = aws.client("kinesis", aws_config), aws.client("dynamodb", aws_config)
    ensure_tables(app_name, ddb)
    store = DynamoDBLeaseStore(app_name, client=ddb)
    stream = f"{app_name}-events"
    create_stream(kinesis, stream, SHARDS)
    setting_up = time.monotonic()
    _, archive = packed_env(tmp_path)
    output, checkpoint, events = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "events"
    events.mkdir()
    job_env = clean_env(
        tmp_path / "submit" / "environment" / "bin",
        AWS_ACCESS_KEY_ID="local",
        AWS_SECRET_ACCESS_KEY="local",
        SHARDLEASE_LEADER_TIMINGS="",
        SHARDLEASE_SPARK_LOG_LEVEL="INFO",  # the source runner's departure in the driver's log
    )
    # docs/spark.md's recipe for client mode: the archive unpacked where the job is submitted, as ./environment, the
    # same relative path the executors find it under
    submit_dir = tmp_path / "submit"
    (submit_dir / "environment").mkdir(parents=True)
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(submit_dir / "environment")], check=True, timeout=300)
    conf = {
        "spark.pyspark.python": "./environment/bin/python",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",  # each application one executor per worker (the master spreads them out)
        "spark.executor.memory": "768m",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",  # Spark 4 compresses with zstd by default
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.ui.enabled": "false",
    }

    def job(worker_id: str, out: Path, ckpt: Path) -> list[str]:
        return [
            "--app", app_name, "--stream", stream, "--region", "us-east-1", "--endpoint-url", moto_endpoint,
            "--worker-id", worker_id, "--output", str(out), "--checkpoint", str(ckpt), "--continuous",
            "--option", "metrics_report_interval_ms=1000", "--option", "metrics_first_report_delay_ms=500",
        ]  # fmt: skip

    args = job("cluster-a", output, checkpoint)
    archives = [f"{archive}#environment"]
    # Two workers of two cores and 2 GB: room for two applications of two one-core, 768 MB executors each
    with SparkCluster(
        tmp_path / "cluster", workers=2, cores_per_worker=2, memory="2g", env=job_env, submit_dir=submit_dir
    ) as cluster:
        print(f"the packed environment and the cluster were ready after {time.monotonic() - setting_up:.0f} s")
        leader = cluster.fleet.start(
            "leader",
            [sys.executable, "-m", "worker_lib.cli", "--log-level", "INFO", "leader", "--app", app_name,
             "--stream", stream, "--endpoint-url", moto_endpoint, "--initial-position", "TRIM_HORIZON"],
            env={
                **os.environ,
                "PYTHONPATH": str(REPO),
                "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "1000",
                "SHARDLEASE_LEADER_FAST_TICK_MS": "250",
            },
        )  # fmt: skip
        producer = Producer(kinesis, stream, per_tick=5, tick_s=0.1, prefix="e", data=event)
        with producer:
            # GIVEN the job submitted to the cluster with the packed virtualenv
            first = cluster.submit("driver-1", EXAMPLE, *args, archives=archives, conf=conf)
            started_s = eventually_showing(
                lambda: task_executors(events) >= {"0", "1"},
                bound_s=FIRST_TASKS_BOUND_S,
                what="the job's tasks on both executors",
                detail=lambda: first.log_path.read_text()[-3000:],
            )
            print(f"the job's tasks ran on both executors {started_s:.0f} s after its submission")
            # AND `shardlease status` shows the application's lag per shard, as a worker's
            eventually(
                lambda: lagging_shards(app_name, moto_endpoint) == SHARDS,
                bound_s=LAG_BOUND_S,
                what="a lag per shard in `shardlease status`",
                step_s=1.0,
            )
            # WHEN one executor is killed in the middle of the run
            (victim, *_) = cluster.executor_pids()
            os.kill(victim, signal.SIGKILL)
            # (micro-batches go on meanwhile, so that the driver is killed in the middle of the flow)
            written = batches_written(output)
            eventually(
                lambda: batches_written(output) >= written + 2,
                bound_s=BATCHES_BOUND_S,
                what="two micro-batches after an executor's loss",
            )
            # AND the driver is killed, then submitted again with the same checkpoint location
            cluster.fleet.kill("driver-1")
            second = cluster.submit("driver-2", EXAMPLE, *args, archives=archives, conf=conf)
            written = batches_written(output)
            eventually_showing(
                lambda: batches_written(output) >= written + 1,
                bound_s=RESTART_BOUND_S,
                what="a micro-batch of the resubmitted job",
                detail=lambda: second.log_path.read_text()[-3000:],
            )
        produced = list(producer.produced)
        # THEN every event is in the Parquet output exactly once
        want = expected(produced)
        eventually_showing(
            lambda: aggregated(output) == want,
            bound_s=CATCH_UP_BOUND_S,
            what=f"the output's events and amounts {want}",
            detail=lambda: aggregated(output),
        )
        # AND the driver imported shardlease from the virtualenv built from the wheel, not from the checkout
        for driver in (first, second):
            (where,) = re.findall(r"shardlease from (\S+)", driver.log_path.read_text())
            assert Path(where).is_relative_to(submit_dir / "environment"), where
        # AND the leases' checkpoints are at the stream's tips once the last micro-batch is committed
        eventually(
            lambda: checkpoints_at_tips(kinesis, ddb, app_name, stream),
            bound_s=COMMIT_BOUND_S,
            what="the leases' checkpoints at the stream's tips",
        )

        # WHEN a second application joins on the same stream, the producer writing again
        output_b = tmp_path / "out-b"
        more = Producer(kinesis, stream, per_tick=5, tick_s=0.1, prefix="f", data=event)
        with more:
            other = cluster.submit(
                "driver-b", EXAMPLE, *job("cluster-b", output_b, tmp_path / "checkpoint-b"), archives=archives,
                conf={**conf, "spark.cores.max": "1"},  # one executor: less for the loaded machine to start
            )  # fmt: skip
            # THEN the leader splits the shards between the two by load: two each (equal traffic), and the second
            # reads on executors of its own
            eventually_showing(
                lambda: split(store) == {"cluster-a": 2, "cluster-b": 2},
                bound_s=SPLIT_BOUND_S,
                what="two shards each",
                detail=lambda: f"{split(store)}\n{other.log_path.read_text()[-2000:]}",
            )
            eventually_showing(
                lambda: batches_written(output_b) >= 2,
                bound_s=OWN_BATCHES_BOUND_S,
                what="two micro-batches of the second job",
                detail=lambda: other.log_path.read_text()[-2000:],
            )
            # WHEN the second application is stopped (SIGTERM: its query stops between micro-batches)
            os.kill(cluster.driver_pid("driver-b", EXAMPLE), signal.SIGTERM)
            sent = time.monotonic()
            # THEN its leases go to the first one, after it gave them up
            released_at, moved_at = hand_over(store, "cluster-b", "cluster-a")
            code = exit_code(cluster.fleet, "driver-b", bound_s=STOP_BOUND_S, what="the second job's exit")
            assert code == 0, other.log_path.read_text()[-2000:]
        # (figures: no bench measures a Spark application's hand-over; bench/failover.py's `term` a worker's)
        print(
            f"second application: given up {released_at - sent:.1f} s after its SIGTERM, "
            f"its leases with the first {moved_at - released_at:.1f} s later"
        )
        # AND the leader read its STOPPED state (a departure, DEPARTING, leases given up, STOPPED; not an expiry)
        eventually_showing(
            lambda: "stopped worker cluster-b" in cluster.fleet.log("leader"),
            bound_s=DEPARTURE_SEEN_BOUND_S,
            what="the leader's housekeeping of the stopped cluster-b",
            detail=lambda: cluster.fleet.log("leader")[-2000:],
        )
        # AND every event reached one of the two outputs: at least once across the two applications (the stopped
        # one's last micro-batch may be read again by the next owner, as with KCL), each application reading some
        events_now, amounts_now = expected(produced + list(more.produced))

        def combined() -> tuple[int, dict[str, float]]:
            (total_a, amounts_a), (total_b, amounts_b) = aggregated(output), aggregated(output_b)
            kinds = set(amounts_a) | set(amounts_b)
            return total_a + total_b, {k: round(amounts_a.get(k, 0.0) + amounts_b.get(k, 0.0), 2) for k in kinds}

        def all_there() -> bool:
            total, amounts = combined()
            return total >= events_now and all(amounts.get(k, 0.0) >= v for k, v in amounts_now.items())

        eventually_showing(
            all_there,
            bound_s=CATCH_UP_BOUND_S,
            what=f"{events_now} events and the amounts {amounts_now} across the two outputs",
            detail=combined,
        )
        assert aggregated(output_b)[0] > 0 and aggregated(output)[0] > want[0]
        # AND a SIGTERM to the driver stops the query between micro-batches: the job exits 0, its leases given up
        os.kill(cluster.driver_pid("driver-2", EXAMPLE), signal.SIGTERM)
        stopping = time.monotonic()
        code = exit_code(cluster.fleet, "driver-2", bound_s=STOP_BOUND_S, what="the first job's exit")
        assert code == 0, second.log_path.read_text()[-2000:]
        # (the source runner leaves on a thread of its own once Spark ends it, up to 10 s, and may outlive the driver
        # on a loaded machine; a lease left to expire instead would keep its owner for good, with no application left)
        eventually_showing(
            lambda: all(lease.lease_owner is None for lease in store.list_leases()),
            bound_s=GIVEN_UP_BOUND_S,
            what="every lease given up",
            detail=lambda: (
                f"{owners(store)}\n"
                + "\n".join(
                    line
                    for line in second.log_path.read_text().splitlines()
                    if "shardlease" in line or "spark source" in line
                )[-3000:]
            ),
        )
        print(f"driver stopped and its leases given up {time.monotonic() - stopping:.1f} s after its SIGTERM")
        assert leader.alive()
