"""`shardlease multilang` runs third-party KCL MultiLang applications unchanged, without Java.

* kclpy's own ``samples/sample_kclpy_app.py`` (amazon-kclpy from PyPI at its pinned version: no JARs, no Java),
  with kclpy's own ``sample.properties`` edited as a user would (stream, application, endpoints);
* a record processor on the ``aws-kcl`` Node client (npm, pinned in package-lock.json).

Each against moto (and kclpy's also with Kinesis on kinesalite): every record processed, checkpoints in the lease
table where KCL puts them, a killed child replaced from the last checkpoint with one log line, a SIGTERM'd daemon
that lets every child checkpoint, hands its leases over and exits 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kpl import put_aggregate
from tests.support.multilang import NODE_CONSUMER, child_pids, edit_properties, fetch_kclpy, kclpy_sample_records
from tests.support.processes import (
    DISCOVERY_S,
    EMBEDDED_CYCLE_S,
    EMBEDDED_LEADER_ENV,
    GRACEFUL_STOP_S,
    PROCESS_START_S,
    READ_S,
    REPO,
    eventually_showing,
    first_read_s,
    process_group,
)
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.testing.processes import ProcessFleet
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import create_stream

pytestmark = pytest.mark.heavy  # a daemon and a child process per shard

SHARDS = 2
PER_TICK, TICK_S = 5, 0.1  # the producer's pace: 50 records a second
# Liveness bounds (tests/support/stalls.py) from the test timings (tests/support/processes.py): the daemon and its
# children start and read every shard; a dead child is noticed (its pipe closes) and replaced; a SIGTERM'd daemon
# has every child checkpoint and gives its leases up
START_BOUND_S = hang_bound_s(first_read_s(1 + SHARDS))
NOTICE_BOUND_S = hang_bound_s(READ_S)
REPLACE_BOUND_S = hang_bound_s(PROCESS_START_S + EMBEDDED_CYCLE_S + DISCOVERY_S + READ_S)
STOP_BOUND_S = hang_bound_s(GRACEFUL_STOP_S)


@pytest.fixture(scope="session")
def kclpy_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fetch_kclpy(tmp_path_factory.mktemp("kclpy"))


@pytest.fixture(params=["moto", pytest.param("kinesalite", marks=pytest.mark.kinesalite)])
def kinesis_endpoint(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_endpoint"))


def daemon_env(extra: dict[str, str]) -> dict[str, str]:
    """A test's short timings (lease 3 s, leader cycle 0.5 s), the leader embedded as the daemon's default."""
    return {**EMBEDDED_LEADER_ENV, **extra}


def lease_items(ddb: Any, app: str) -> dict[str, dict[str, Any]]:
    items = ddb.scan(TableName=app, ConsistentRead=True)["Items"]
    return {item["leaseKey"]["S"]: item for item in items}


def produce(kinesis: Any, stream: str, *, prefix: str, records: int) -> list[str]:
    """Write at least ``records`` records with ids ``<prefix><n>`` (a real producer's pace), then stop."""
    with Producer(kinesis, stream, per_tick=PER_TICK, tick_s=TICK_S, prefix=prefix) as producer:
        eventually(
            lambda: len(producer.produced) >= records,
            bound_s=hang_bound_s(records / PER_TICK * TICK_S),
            what=f"the producer wrote {records} records",
        )
    return producer.produced


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[ProcessFleet]:
    with process_group(tmp_path) as group:
        yield group


def test_kclpy_sample_app_runs_unchanged(
    *,
    kclpy_root: Path,
    kinesis_endpoint: str,
    moto_endpoint: str,
    moto_aws: AwsConfig,
    app_name: str,
    daemon: ProcessFleet,
) -> None:
    # GIVEN kclpy's sample app as PyPI ships it, and kclpy's sample.properties edited for this stream and emulators
    samples = kclpy_root / "samples"
    (samples / "sample_kclpy_app.py").chmod(0o755)  # pip would install it as a script
    stream = f"{app_name}-s"
    kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesis_endpoint, max_attempts=3))
    create_stream(kinesis, stream, SHARDS)
    properties = samples / f"{app_name}.properties"
    properties.write_text(
        edit_properties(
            (samples / "sample.properties").read_text(),
            {
                "streamArn": f"arn:aws:kinesis:us-east-1:000000000000:stream/{stream}",
                "streamName": stream,
                "applicationName": app_name,
                "regionName": "us-east-1",
                "kinesisEndpoint": kinesis_endpoint,
                "dynamoDBEndpoint": moto_endpoint,
            },
        )
    )
    env = daemon_env(
        {
            "PYTHONPATH": f"{REPO}{os.pathsep}{kclpy_root}",  # kclpy's modules for the child, no install
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # its `env python`
        }
    )
    started = time.monotonic()
    d1 = daemon.start_shardlease("d1", "multilang", "--properties", str(properties), env=env)

    def processed() -> dict[str, list[tuple[str, int]]]:
        return kclpy_sample_records(daemon.log("d1"))

    def missing(produced: list[str]) -> set[str]:
        seen = {key for records in processed().values() for key, _ in records}
        return set(produced) - seen

    # WHEN records are written  THEN the sample app processes each of them
    produced = produce(kinesis, stream, prefix="a", records=100)
    eventually_showing(
        lambda: not missing(produced),
        bound_s=START_BOUND_S,
        what="the sample app processed every record",
        detail=lambda: daemon.log("d1")[-3000:],
    )
    first_hundred_s = time.monotonic() - started
    # WHEN one child is killed, and more records are written
    victims = child_pids(d1.pid)
    assert len(victims) == SHARDS, victims
    os.kill(victims[0], signal.SIGKILL)
    produced += produce(kinesis, stream, prefix="b", records=100)
    # THEN its shard's processing ends with one line naming the shard and how the child ended, and a new child
    # resumes from the last checkpoint: nothing is lost
    eventually_showing(
        lambda: "was killed by SIGKILL" in daemon.log("d1"),
        bound_s=NOTICE_BOUND_S,
        what="the daemon noticed the killed child",
        detail=lambda: daemon.log("d1")[-3000:],
    )
    eventually_showing(
        lambda: not missing(produced),
        bound_s=REPLACE_BOUND_S,
        what="a new child processed the rest",
        detail=lambda: sorted(missing(produced))[:10],
    )
    assert victims[0] not in child_pids(d1.pid) and len(child_pids(d1.pid)) == SHARDS
    log = daemon.log("d1")
    failures = [line for line in log.splitlines() if " ERROR " in line and "was killed by SIGKILL" in line]
    assert len(failures) == 1 and re.search(r"multilang child for shardId-\d+ \(pid \d+\)", failures[0]), failures
    # WHEN the daemon gets SIGTERM
    sigterm_at = time.monotonic()
    assert daemon.stop(["d1"], timeout_s=STOP_BOUND_S) == {"d1": 0}, daemon.log("d1")[-3000:]
    stop_s = time.monotonic() - sigterm_at
    # THEN every child checkpointed its last record (kclpy's sample does at shutdownRequested), where KCL keeps
    # checkpoints, and every lease was handed back
    ddb = aws.client("dynamodb", moto_aws)
    items = lease_items(ddb, app_name)
    last = {shard: max(seq for _, seq in records) for shard, records in processed().items()}
    assert set(items) == set(last)
    for shard, item in items.items():
        assert item["checkpoint"] == {"S": str(last[shard])}, (shard, item)
        assert item["checkpointSubSequenceNumber"] == {"N": "0"}
        assert "leaseOwner" not in item, (shard, item)
    assert "Traceback" not in daemon.log("d1")
    print(
        json.dumps({"start_to_first_100_processed_s": round(first_hundred_s, 1), "sigterm_to_exit_s": round(stop_s, 1)})
    )


def test_an_aws_kcl_node_processor_runs_unchanged(
    moto_endpoint: str, moto_aws: AwsConfig, app_name: str, daemon: ProcessFleet, tmp_path: Path
) -> None:
    node = shutil.which("node")
    assert node is not None, "node is installed by .ci/bootstrap"
    assert (REPO / "node_modules" / "aws-kcl" / "package.json").is_file(), "aws-kcl is installed by npm ci"
    # GIVEN a processor on the aws-kcl Node client, and a properties file as aws-kcl's sample has it
    stream = f"{app_name}-s"
    kinesis = aws.client("kinesis", moto_aws)
    create_stream(kinesis, stream, SHARDS)
    journal = tmp_path / "node-journal.jsonl"
    journal.touch()
    properties = tmp_path / "sample.properties"
    properties.write_text(
        f"executableName = {node} {NODE_CONSUMER}\n"
        f"streamName = {stream}\n"
        f"applicationName = {app_name}\n"
        "AwsCredentialsProvider = DefaultCredentialsProvider\n"
        "processingLanguage = nodejs/0.10\n"
        "initialPositionInStream = TRIM_HORIZON\n"
        "regionName = us-east-1\n"
    )
    env = daemon_env({"MULTILANG_JOURNAL": str(journal)})
    daemon.start_shardlease(
        "d1", "multilang", "--properties", str(properties), "--endpoint-url", moto_endpoint, env=env
    )

    def entries() -> list[dict[str, Any]]:
        return [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]

    def missing(produced: list[str]) -> set[str]:
        return set(produced) - {e["data"] for e in entries() if e["kind"] == "record"}

    # WHEN records are written
    aggregate = put_aggregate(kinesis, stream, [b"agg-0", b"agg-1", b"agg-2"])  # a KPL aggregate among them
    produced = [*produce(kinesis, stream, prefix="r", records=100), "agg-0", "agg-1", "agg-2"]
    # THEN the Node processor sees every record, and its checkpoints after each batch are accepted
    eventually_showing(
        lambda: not missing(produced),
        bound_s=START_BOUND_S,
        what="the Node processor saw every record",
        detail=lambda: daemon.log("d1")[-3000:],
    )
    # AND the aggregate reached it de-aggregated, as KCL delivers it: one record per user record
    parts = sorted((e["sequence"], e["sub"], e["data"]) for e in entries() if e.get("data", "").startswith("agg-"))
    assert parts == [(aggregate, 0, "agg-0"), (aggregate, 1, "agg-1"), (aggregate, 2, "agg-2")]
    checkpoints = [e for e in entries() if e["kind"] == "checkpoint"]
    assert checkpoints and all(e["error"] is None for e in checkpoints), checkpoints
    # WHEN the daemon gets SIGTERM  THEN it exits 0, each lease handed back at the last record checkpointed
    assert daemon.stop(["d1"], timeout_s=STOP_BOUND_S) == {"d1": 0}, daemon.log("d1")[-3000:]
    items = lease_items(aws.client("dynamodb", moto_aws), app_name)
    last: dict[str, int] = {}
    for e in entries():
        if e["kind"] == "record":
            last[e["shard"]] = max(last.get(e["shard"], 0), int(e["sequence"]))
    assert {shard: item["checkpoint"]["S"] for shard, item in items.items()} == {s: str(q) for s, q in last.items()}
    assert all("leaseOwner" not in item for item in items.values())
    actions = [e["action"] for e in entries() if e["kind"] == "message"]
    assert actions.count("initialize") == SHARDS and actions.count("leaseLost") == SHARDS
