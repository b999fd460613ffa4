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
from tests.support.processes import (
    EMBEDDED_LEADER_ENV,
    GRACEFUL_STOP_S,
    KILL_FAILOVER_S,
    first_read_s,
    process_group,
)
from tests.support.recording import owners
from tests.support.stalls import eventually, hang_bound_s, stall_note
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.processes import ProcessFleet
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import create_stream

# Liveness bounds (tests/support/stalls.py), from the test timings the processes run with (tests/support/processes.py)
START_BOUND_S = hang_bound_s(first_read_s(1))
FLEET_START_BOUND_S = hang_bound_s(first_read_s(2))
FAILOVER_BOUND_S = hang_bound_s(KILL_FAILOVER_S)
STOP_BOUND_S = hang_bound_s(GRACEFUL_STOP_S)
SLOW_SHUTDOWN_S = 2 * STOP_BOUND_S  # a processor's flush at shutdown that outlasts any bound of this module


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


@pytest.mark.heavy
def test_sigkill_of_a_worker_loses_no_record(setup: dict[str, Any], tmp_path: Path) -> None:
    s = setup
    with process_group(tmp_path) as group:
        # GIVEN two worker processes (each with an embedded leader) sharing 4 shards while a producer writes
        start_worker(group, "w1", s)
        start_worker(group, "w2", s)
        with Producer(s["kinesis"], s["stream"], tick_s=0.05) as producer:
            eventually(
                lambda: len({r[0] for r in read_journal(s["journal"])}) == 2,
                bound_s=FLEET_START_BOUND_S,
                what="both workers process records",
            )
            # WHEN w1 is killed with SIGKILL
            w1_pid, w2_pid = group.processes["w1"].pid, group.processes["w2"].pid
            w1_shards = {r[1] for r in read_journal(s["journal"]) if r[0] == w1_pid}
            group.signal("w1", signal.SIGKILL)
            # THEN (while records keep coming) w2 takes over every shard w1 had: within a liveness bound derived from
            # leader takeover + lease expiry + a cycle (the speed is bench/failover.py's; printed below)
            failover_s = eventually(
                lambda: {r[1] for r in read_journal(s["journal"]) if r[0] == w2_pid} >= w1_shards,
                bound_s=FAILOVER_BOUND_S,
                what="w2 took over every shard of the killed w1",
            )
            producer.stop()
        produced = producer.produced
        # AND every produced record is processed
        eventually(
            lambda: {r[4] for r in read_journal(s["journal"])} >= set(produced),
            bound_s=FAILOVER_BOUND_S,
            what="every produced record processed",
        )
        eventually(
            lambda: all(owner == "w2" for owner in lease_owners(s["store"])),
            bound_s=FAILOVER_BOUND_S,
            what="w2 owns every lease",
        )
        group.signal("w2", signal.SIGTERM)
        assert group.wait("w2", timeout_s=STOP_BOUND_S) == 0, group.log("w2")[-2000:]
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
    print(f"figure: SIGKILL to w2 reading every shard of w1: {failover_s:.1f} s (bench/failover.py measures it)")


@pytest.mark.busy  # one worker process (and its embedded leader) under a producer
def test_sigterm_gives_every_lease_up_before_the_worker_exits(setup: dict[str, Any], tmp_path: Path) -> None:
    s = setup
    with process_group(tmp_path) as group:
        # GIVEN one worker holding all 4 leases (assigned by its embedded leader)
        start_worker(group, "w1", s)
        eventually(lambda: lease_owners(s["store"]) == ["w1"] * 4, bound_s=START_BOUND_S, what="w1 owns 4 leases")
        eventually(lambda: s["journal"].read_text().count("INIT") == 4, bound_s=START_BOUND_S, what="w1 reads 4 shards")
        # WHEN it receives SIGTERM
        group.signal("w1", signal.SIGTERM)
        # THEN it gives every lease up itself (nobody else is there to do it: its embedded leader goes with it, and
        # an expired lease keeps its owner) and exits 0
        freed_after = eventually(
            lambda: all(owner is None for owner in lease_owners(s["store"])),
            bound_s=STOP_BOUND_S,
            what="w1 gave its leases up on SIGTERM",
        )
        assert group.wait("w1", timeout_s=STOP_BOUND_S) == 0, group.log("w1")[-2000:]
    assert all(owner is None for owner in lease_owners(s["store"]))
    assert s["journal"].read_text().count("SHUTDOWN") == 4
    print(f"figure: SIGTERM to every lease unowned: {freed_after:.1f} s (bench/failover.py `term` measures hand-overs)")


@pytest.mark.busy
def test_a_second_sigterm_exits_at_once_keeping_checkpoints(setup: dict[str, Any], tmp_path: Path) -> None:
    s = setup
    with process_group(tmp_path) as group, Producer(s["kinesis"], s["stream"], tick_s=0.05) as producer:
        # GIVEN a worker processing and checkpointing a steady stream, whose processor flushes slowly at shutdown
        s["env"]["SHARDLEASE_TEST_SLOW_SHUTDOWN_S"] = str(SLOW_SHUTDOWN_S)
        start_worker(group, "w1", s)
        eventually(lambda: len(read_journal(s["journal"])) > 50, bound_s=START_BOUND_S, what="w1 processes records")
        before = {lease.lease_key: lease.checkpoint for lease in s["store"].list_leases()}
        # WHEN it gets SIGTERM, starts its graceful shutdown, and gets SIGTERM again
        group.signal("w1", signal.SIGTERM)
        eventually(lambda: "SHUTDOWN" in s["journal"].read_text(), bound_s=STOP_BOUND_S, what="shutdown started")
        sent = time.monotonic()
        group.signal("w1", signal.SIGTERM)
        # THEN it exits with 128 + SIGTERM instead of waiting for the slow flush (which outlasts the bound: the code
        # says which way it ended, a graceful exit would be 0)
        assert group.wait("w1", timeout_s=STOP_BOUND_S) == 128 + signal.SIGTERM, stall_note(sent)
        producer.stop()
    # AND every checkpoint already written is still there (none went backwards)
    after = {lease.lease_key: lease.checkpoint for lease in s["store"].list_leases()}
    for key, checkpoint in before.items():
        if checkpoint.is_real:
            assert not checkpoint.is_after(after[key]), key
