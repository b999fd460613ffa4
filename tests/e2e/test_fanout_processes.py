"""Enhanced fan-out with real worker processes on kinesis-local (behind FanOutProxy; leases on moto).

Three `shardlease worker --retrieval fanout` processes of one application on an 8-shard stream, with a split and a
merge, a SIGKILL and a SIGTERM, while two other applications read the same stream, one polling and one fanning
out: every application reads every record; the first application's journal satisfies the chaos suite's
invariants (every record processed, in order per shard within a session, duplicates only after an ownership
change, children after their parents).
"""

from __future__ import annotations

import functools
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos_fleet import ChaosFleet
from tests.support.journal_processor import PROCESSOR as JOURNAL_PROCESSOR
from tests.support.journal_processor import read_journal
from tests.support.processes import (
    EMBEDDED_LEADER_ENV,
    KILL_FAILOVER_S,
    eventually_showing,
    first_read_s,
    fleet_start_s,
)
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import create_stream, list_all_shards, merge_shards, split_shard

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(300)]

SHARDS = 8
PROCESSES = 5  # three workers of the application, one of each other application
# Liveness bounds (tests/support/stalls.py) from the test timings (tests/support/processes.py): the fleet starts and
# reads every shard; after the chaos, the restarted workers start and the killed one's shards fail over
START_BOUND_S = hang_bound_s(first_read_s(PROCESSES))
RECOVERY_BOUND_S = hang_bound_s(fleet_start_s(2) + KILL_FAILOVER_S)


def read_everything(journal: Path, produced: list[str]) -> bool:
    return {record[4] for record in read_journal(journal)} >= set(produced)


def open_shards(kinesis: Any, stream: str) -> list[dict[str, Any]]:
    shards = [s for s in list_all_shards(kinesis, stream) if not s["SequenceNumberRange"].get("EndingSequenceNumber")]
    return sorted(shards, key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))


def test_three_fanout_workers_through_a_split_a_merge_a_kill_and_a_term_beside_two_other_applications(
    kinesis_local_endpoint: str, moto_endpoint: str, moto_aws: AwsConfig, app_name: str, tmp_path: Path
) -> None:
    kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesis_local_endpoint, max_attempts=3))
    ddb = aws.client("dynamodb", moto_aws)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, SHARDS)
    polling_app, fanout_app = f"{app_name}-p", f"{app_name}-f"
    for app in (app_name, polling_app, fanout_app):
        ensure_tables(app, ddb)
    journal = tmp_path / "journal.txt"
    journal.touch()
    other_journals = {polling_app: tmp_path / "polling.txt", fanout_app: tmp_path / "fanout.txt"}
    for path in other_journals.values():
        path.touch()
    env = {
        **EMBEDDED_LEADER_ENV,
        "SHARDLEASE_CHAOS_JOURNAL": str(journal),
        "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesis_local_endpoint,
        "SHARDLEASE_RETRIEVAL": "fanout",
    }
    args = ["--app", app_name, "--stream", stream, "--endpoint-url", moto_endpoint]
    with ChaosFleet(tmp_path, args=args, env=env, journal=journal) as fleet:
        # GIVEN three fan-out workers of one application, and two other applications on the same stream: one
        # polling, one fanning out through a consumer of its own
        for worker_id in ("w1", "w2", "w3"):
            fleet.start_chaos_worker(worker_id)
        for app, mode in ((polling_app, "polling"), (fanout_app, "fanout")):
            fleet.start_shardlease(
                app,
                "worker",
                *("--app", app, "--stream", stream, "--endpoint-url", moto_endpoint),
                *("--processor", JOURNAL_PROCESSOR, "--worker-id", app, "--retrieval", mode),
                env={"SHARDLEASE_TEST_JOURNAL": str(other_journals[app])},
            )
        with Producer(kinesis, stream, per_tick=5, tick_s=0.1) as producer:
            eventually_showing(
                lambda: fleet.shards_processed() == SHARDS,
                bound_s=START_BOUND_S,
                what="every shard read",
                detail=lambda: fleet.log("w1")[-2000:],
            )
            # WHEN a shard is split and two adjacent shards are merged while records keep coming
            split_shard(kinesis, stream, open_shards(kinesis, stream)[0]["ShardId"])
            time.sleep(2.0)  # records keep coming across the split (not a bound)
            shards = open_shards(kinesis, stream)
            merge_shards(kinesis, stream, shards[-2]["ShardId"], shards[-1]["ShardId"])
            time.sleep(2.0)  # and across the merge
            # AND a busy worker is killed (and started again), another stopped with SIGTERM (and started again)
            victim = fleet.busy()[0]
            fleet.signal(fleet.latest[victim], signal.SIGKILL)
            fleet.start_chaos_worker(victim)
            stopped = next(w for w in fleet.busy() if w != victim)
            term_codes = fleet.stop_workers([stopped])
            fleet.start_chaos_worker(stopped)
            time.sleep(3.0)  # records keep coming across the restarts (not a bound)
            producer.stop()
        produced = producer.produced
        # THEN every application reads every record
        eventually(lambda: fleet.processed_all(produced), bound_s=RECOVERY_BOUND_S, what="the fleet read every record")
        for app, path in other_journals.items():
            eventually(
                functools.partial(read_everything, path, produced), bound_s=RECOVERY_BOUND_S, what=f"{app} read all"
            )
        codes = fleet.stop_workers()
    # AND the SIGTERM'd worker and every worker at the end exited 0
    assert term_codes == {stopped: 0} and all(code == 0 for code in codes.values()), (term_codes, codes)
    # AND the fleet's journal holds every invariant: no loss, order per shard, duplicates only after the kill,
    # children after their parents, two processes' sessions of a shard overlapping by no more than the lease time
    parents = {
        s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p]
        for s in list_all_shards(kinesis, stream)
    }
    verdict = fleet.verdict(produced, parents=parents)
    assert not verdict.violations, verdict.violations[:10]
    assert verdict.lost == 0
