"""Real `shardlease worker` processes on a moto server, each also contending for leadership (embedded leader):
SIGKILL of a worker — possibly the leader — loses nothing; SIGTERM frees its leases at once."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.journal_processor import PROCESSOR, read_journal
from tests.support.processes import EMBEDDED_LEADER_ENV, process_group
from tests.support.recording import owners
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.processes import ProcessFleet
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import create_stream
from worker_lib.testing.waiting import wait_until


@pytest.fixture
def setup(moto_aws: AwsConfig, moto_endpoint: str, app_name: str, tmp_path: Path) -> dict[str, Any]:
    ddb = aws.client("dynamodb", moto_aws)
    kinesis = aws.client("kinesis", moto_aws)
    ensure_tables(app_name, ddb)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 4)
    store = DynamoDBLeaseStore(app_name, client=ddb)
    journal = tmp_path / "journal.txt"
    journal.touch()
    return {
        "store": store,
        "kinesis": kinesis,
        "stream": stream,
        "journal": journal,
        "env": {
            "SHARDLEASE_TEST_JOURNAL": str(journal),
            **EMBEDDED_LEADER_ENV,
        },
        "args": ["--app", app_name, "--stream", stream, "--endpoint-url", moto_endpoint],
    }


def start_worker(group: ProcessFleet, name: str, s: dict[str, Any]) -> None:
    group.start_shardlease(name, "worker", *s["args"], "--processor", PROCESSOR, "--worker-id", name, env=s["env"])


def lease_owners(store: DynamoDBLeaseStore) -> list[str | None]:
    return list(owners(store).values())


def test_sigkill_of_a_worker_loses_no_record(setup: dict[str, Any], tmp_path: Path) -> None:
    s = setup
    with process_group(tmp_path) as group:
        # GIVEN two worker processes (each with an embedded leader) sharing 4 shards while a producer writes
        start_worker(group, "w1", s)
        start_worker(group, "w2", s)
        with Producer(s["kinesis"], s["stream"], tick_s=0.05) as producer:
            assert wait_until(lambda: len({r[0] for r in read_journal(s["journal"])}) == 2, timeout_s=60)
            # WHEN w1 is killed with SIGKILL
            w1_pid, w2_pid = group.processes["w1"].pid, group.processes["w2"].pid
            killed_at = time.monotonic()
            w1_shards = {r[1] for r in read_journal(s["journal"]) if r[0] == w1_pid}
            group.signal("w1", signal.SIGKILL)
            # THEN (while records keep coming) w2 takes over every shard w1 had
            assert wait_until(
                lambda: {r[1] for r in read_journal(s["journal"]) if r[0] == w2_pid} >= w1_shards, timeout_s=60
            )
            failover_s = time.monotonic() - killed_at
            producer.stop()
        produced = producer.produced
        # AND every produced record is processed
        assert wait_until(lambda: {r[4] for r in read_journal(s["journal"])} >= set(produced), timeout_s=60)
        assert wait_until(lambda: all(owner == "w2" for owner in lease_owners(s["store"])), timeout_s=30)
        group.signal("w2", signal.SIGTERM)
        assert group.wait("w2", timeout_s=30) == 0
    records = read_journal(s["journal"])
    events = [line.split() for line in s["journal"].read_text().splitlines()]
    lost = {(int(e[0]), e[1]) for e in events if len(e) >= 3 and e[2] == "LOST"}
    # AND a record is processed twice only after an ownership change before its checkpoint landed: its first
    # processor was killed (w1) or lost that shard's lease (a renewal late under load; the fenced checkpoint failed)
    counts = Counter(r[4] for r in records)
    first: dict[str, tuple[int, str]] = {}
    for pid, shard, _, _, data in records:
        first.setdefault(data, (pid, shard))
    for data, n in counts.items():
        if n > 1:
            pid, shard = first[data]
            assert pid == w1_pid or (pid, shard) in lost, (data, pid, shard)
    # AND within each ownership session (from one INIT to the next, per process and shard) order is kept
    last_seq: dict[tuple[int, str], int] = {}
    for e in events:
        key = (int(e[0]), e[1])
        if len(e) >= 3 and e[2] == "INIT":
            last_seq.pop(key, None)
        elif len(e) == 5 and e[2].isdigit():
            assert int(e[2]) > last_seq.get(key, -1), e
            last_seq[key] = int(e[2])
    # AND failover took at most: leader lock takeover (3.5 s) + lease expiry (3 s) + a few cycles
    assert failover_s < 15, failover_s


def test_sigterm_gives_leases_up_within_one_renewal_interval(setup: dict[str, Any], tmp_path: Path) -> None:
    s = setup
    with process_group(tmp_path) as group:
        # GIVEN one worker holding all 4 leases (assigned by its embedded leader)
        start_worker(group, "w1", s)
        assert wait_until(lambda: lease_owners(s["store"]) == ["w1"] * 4, timeout_s=60)
        assert wait_until(lambda: s["journal"].read_text().count("INIT") == 4, timeout_s=30)
        # WHEN it receives SIGTERM
        sent = time.monotonic()
        group.signal("w1", signal.SIGTERM)
        # THEN within one renewal interval (~1 s here) all its leases are unowned, and it exits 0
        assert wait_until(lambda: all(owner is None for owner in lease_owners(s["store"])), timeout_s=5)
        freed_after = time.monotonic() - sent
        assert group.wait("w1", timeout_s=30) == 0
    assert freed_after < 1.0 + 0.5, freed_after
    assert s["journal"].read_text().count("SHUTDOWN") == 4


def test_a_second_sigterm_exits_at_once_keeping_checkpoints(setup: dict[str, Any], tmp_path: Path) -> None:
    s = setup
    with process_group(tmp_path) as group, Producer(s["kinesis"], s["stream"], tick_s=0.05) as producer:
        # GIVEN a worker processing and checkpointing a steady stream, whose processor flushes slowly at shutdown
        s["env"]["SHARDLEASE_TEST_SLOW_SHUTDOWN_S"] = "20"
        start_worker(group, "w1", s)
        assert wait_until(lambda: len(read_journal(s["journal"])) > 50, timeout_s=60)
        before = {lease.lease_key: lease.checkpoint for lease in s["store"].list_leases()}
        # WHEN it gets SIGTERM, starts its graceful shutdown, and gets SIGTERM again
        group.signal("w1", signal.SIGTERM)
        assert wait_until(lambda: "SHUTDOWN" in s["journal"].read_text(), timeout_s=10)
        sent = time.monotonic()
        group.signal("w1", signal.SIGTERM)
        # THEN it exits at once with 128 + SIGTERM instead of waiting for the slow flush
        assert group.wait("w1", timeout_s=10) == 128 + signal.SIGTERM
        assert time.monotonic() - sent < 5
        producer.stop()
    # AND every checkpoint already written is still there (none went backwards)
    after = {lease.lease_key: lease.checkpoint for lease in s["store"].list_leases()}
    for key, checkpoint in before.items():
        if checkpoint.is_real:
            assert not checkpoint.is_after(after[key]), key
