"""A multi-stream application run by real `shardlease worker` processes (issue "KCL parity", point 3): two streams
on kinesalite (resharding moves data correctly there), leases on moto, three workers each with an embedded leader;
one stream is resharded while both are written to and one worker is killed. Every record of both streams is
processed, each from its own stream, and a split shard's children only after their parent ended."""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.journal_processor import PROCESSOR, read_journal, read_lines_with_kinds
from tests.support.processes import (
    EMBEDDED_LEADER_ENV,
    GRACEFUL_STOP_S,
    KILL_FAILOVER_S,
    PARENT_POLL_S,
    SHARD_SYNC_S,
    eventually_showing,
    first_read_s,
    process_group,
)
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.streams import split_lease_key
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import create_stream, list_all_shards, split_shard

pytestmark = [pytest.mark.kinesalite, pytest.mark.heavy]

# Liveness bounds (tests/support/stalls.py) from the test timings (tests/support/processes.py): three workers start
# and read every shard; after the kill, the victim's shards fail over, and the split's children (a shard sync makes
# their leases) start once their parent ended
START_BOUND_S = hang_bound_s(first_read_s(3))
RECOVERY_BOUND_S = hang_bound_s(KILL_FAILOVER_S + SHARD_SYNC_S + PARENT_POLL_S)
STOP_BOUND_S = hang_bound_s(GRACEFUL_STOP_S)


def test_two_streams_one_resharded_three_workers_one_killed(
    kinesalite_endpoint: str, moto_aws: AwsConfig, moto_endpoint: str, app_name: str, tmp_path: Path
) -> None:
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesalite_endpoint, max_attempts=3))
    streams = (f"{app_name}-orders", f"{app_name}-clicks")
    for stream in streams:
        create_stream(kinesis, stream, 2)
    journal = tmp_path / "journal.txt"
    journal.touch()
    env = {
        "SHARDLEASE_TEST_JOURNAL": str(journal),
        "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesalite_endpoint,
        **EMBEDDED_LEADER_ENV,
    }
    args = ["--app", app_name, "--stream", streams[0], "--stream", streams[1], "--endpoint-url", moto_endpoint]
    with process_group(tmp_path) as group, ExitStack() as producing:
        # GIVEN three workers of one application consuming two streams while both are written to
        pids = {
            name: group.start_shardlease(
                name, "worker", *args, "--processor", PROCESSOR, "--worker-id", name, env=env
            ).pid
            for name in ("w1", "w2", "w3")
        }
        producers = [
            producing.enter_context(Producer(kinesis, stream, per_tick=5, tick_s=0.1, prefix=f"{stream[-6:]}-"))
            for stream in streams
        ]

        def labels() -> set[str]:
            """``stream/shard`` of every record so far."""
            return {r[1] for r in read_journal(journal)}

        eventually_showing(
            lambda: len(labels()) == 4, bound_s=START_BOUND_S, what="the 4 shards of both streams read", detail=labels
        )
        # WHEN one stream's shard is split
        parent = sorted(s["ShardId"] for s in list_all_shards(kinesis, streams[0]))[0]
        split_shard(kinesis, streams[0], parent)
        split_label = f"{streams[0]}/{parent}"

        def reading(name: str) -> set[str]:
            """What a worker has read, but the split shard (which ends: nobody reads it after the split)."""
            return {r[1] for r in read_journal(journal) if r[0] == pids[name]} - {split_label}

        # AND a worker that reads a shard that goes on is killed
        eventually(lambda: bool(reading("w2") or reading("w3")), bound_s=START_BOUND_S, what="w2 or w3 reads")
        victim = "w2" if reading("w2") else "w3"
        survivors = sorted(set(pids) - {victim})
        time.sleep(1.0)  # it reads on a moment (not a bound)
        group.signal(victim, signal.SIGKILL)
        killed_at = len(read_journal(journal))
        time.sleep(3.0)  # records keep coming after the kill (not a bound)
        for producer in producers:
            producer.stop()
        produced = {data for producer in producers for data in producer.produced}
        # THEN every record of both streams is processed by the workers left
        eventually_showing(
            lambda: {r[4] for r in read_journal(journal)} >= produced,
            bound_s=RECOVERY_BOUND_S,
            what="every record of both streams processed",
            detail=lambda: f"{len(produced - {r[4] for r in read_journal(journal)})} records never processed",
        )
        for name in survivors:
            group.signal(name, signal.SIGTERM)
        for name in survivors:
            assert group.wait(name, timeout_s=STOP_BOUND_S) == 0, group.log(name)[-2000:]
    records = read_journal(journal)
    # AND what the killed worker was reading (but the ended split shard) was taken over by the others
    victims = {r[1] for r in records[:killed_at] if r[0] == pids[victim]} - {split_label}
    assert victims & {r[1] for r in records[killed_at:] if r[0] != pids[victim]}, victims
    # AND each record came from its own stream
    for _, label, _, _, data in records:
        stream = label.split("/")[0]
        assert data.startswith(f"{stream[-6:]}-"), (label, data)
    # AND the split shard's children started only after the parent's shard ended
    children = {s["ShardId"] for s in list_all_shards(kinesis, streams[0]) if s.get("ParentShardId") == parent}
    assert len(children) == 2
    lines = read_lines_with_kinds(journal)
    ended = [n for n, (kind, label) in enumerate(lines) if kind == "END" and label == f"{streams[0]}/{parent}"]
    first_child = [n for n, (kind, label) in enumerate(lines) if kind == "REC" and label.split("/")[1] in children]
    assert ended and first_child and ended[0] < min(first_child)
    # AND the lease table holds KCL multi-stream leases of both streams, the children included
    store = DynamoDBLeaseStore(app_name, client=ddb)
    keys = [split_lease_key(lease.lease_key) for lease in store.list_leases()]
    assert all(stream is not None for stream, _ in keys)
    assert {(stream.stream_name, shard) for stream, shard in keys if stream} >= {(streams[0], c) for c in children}
    assert {stream.stream_name for stream, _ in keys if stream} == set(streams)
