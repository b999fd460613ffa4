"""Faults at the botocore layer (event hooks, no emulator changes) under in-process Workers with embedded leaders.

DynamoDB: throttling, 5xx, read timeouts, lost replies (applied, reply dropped) and timeouts of writes that landed,
aimed at one write at a time — the worker's renewals (``lease`` liveness mode only: ``worker`` mode has none) or
heartbeats, its checkpoints, the leader's assignments — for a window shorter than the lease. Kinesis: throttled and
expired-iterator GetRecords. Each time: nothing lost, no lease lost (the fault implies no loss of ownership), no
duplicate, and processing continues once the fault stops.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.chaos.conftest import Rig, put
from tests.support.chaos import Fault, dynamodb_fault, wait_for
from tests.support.kinesis_faults import fail_calls
from worker_lib.tables.schema import lease_table_name, worker_metrics_table_name

FAULT_WINDOW_S = 2.0

pytestmark = pytest.mark.slow


KINDS = ["throttle", "5xx", "timeout", "lost-reply"]

# (liveness mode, write, fault kind). Renewals exist in lease mode only; the heartbeat is worker mode's only liveness
# write, so it gets every kind there, and in lease mode the two kinds whose write lands.
CASES = [
    *[("lease", write, kind) for write in ("renew", "checkpoint", "assign") for kind in KINDS],
    ("lease", "heartbeat", "lost-reply"),
    ("lease", "heartbeat", "landed-timeout"),
    *[("worker", write, kind) for write in ("heartbeat", "checkpoint", "assign") for kind in KINDS],
    ("worker", "heartbeat", "landed-timeout"),
]


@pytest.mark.parametrize(("rig", "write", "kind"), CASES, indirect=["rig"], ids=[f"{m}-{k}-{w}" for m, w, k in CASES])
def test_dynamodb_faults_on_one_write_are_ridden_through(rig: Rig, write: str, kind: str) -> None:
    fault = Fault(kind=kind, write=write)
    produced: list[bytes] = []
    metrics_table = worker_metrics_table_name(rig.app)
    with dynamodb_fault(rig.ddb, fault, lease_table_name(rig.app), metrics_table=metrics_table):
        if write == "assign":
            # GIVEN the leader's assignments fail (or lose their replies) from the start, for a window
            fault.active.set()
            produced += put(rig.kinesis, rig.stream, 0, 100)
            rig.start()
            assert wait_for(lambda: fault.hits > 0, timeout_s=20), "the fault never hit"
            time.sleep(FAULT_WINDOW_S)  # the fault's duration is real time: the leader runs on its own thread
            fault.active.clear()
        else:
            # GIVEN both workers processing, then the fault on their renewals / heartbeats / checkpoints for a window
            rig.start()
            produced += put(rig.kinesis, rig.stream, 0, 100)
            assert wait_for(lambda: len(rig.processed()) >= 100, timeout_s=30)
            fault.active.set()
            deadline = time.monotonic() + FAULT_WINDOW_S
            n = 100
            while time.monotonic() < deadline:  # records keep arriving during the fault
                produced += put(rig.kinesis, rig.stream, n, 20)
                n += 20
                time.sleep(0.25)
            fault.active.clear()
        during = set(produced)
        # WHEN the fault stops and more records arrive
        produced += put(rig.kinesis, rig.stream, 10_000, 100)
        # THEN everything is processed
        assert wait_for(lambda: set(rig.processed()) >= set(produced), timeout_s=40), (
            f"{kind}/{write}: {len(set(produced) - set(rig.processed()))} records missing"
        )
    assert fault.hits > 0, "the fault never hit"
    assert all(worker.shutdown(timeout_s=10) for worker in rig.workers)
    # AND no lease was lost: a fault shorter than the lease implies no loss of ownership
    assert rig.lost() == [], f"{kind}/{write}: false lease loss {rig.lost()}"
    duplicates = {d for d, n in Counter(rig.processed()).items() if n > 1}
    if write == "checkpoint" and kind not in ("lost-reply", "landed-timeout"):
        # AND a checkpoint that failed after botocore's retries raised out of the processor's checkpoint() call:
        # the consumer re-delivered that batch (processor retry) — duplicates only of batches read during the fault
        assert duplicates <= during, f"{kind}/{write}: duplicates outside the fault window"
    else:
        # AND nothing was processed twice (lost replies are recognised; renew/heartbeat/assign faults move no
        # checkpoint)
        assert duplicates == set(), f"{kind}/{write}: {len(duplicates)} duplicates"


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ExpiredIteratorException"])
def test_kinesis_throttling_and_expired_iterators_lose_and_repeat_nothing(rig: Rig, code: str) -> None:
    # GIVEN two workers processing a 2-shard stream
    rig.start()
    produced = put(rig.kinesis, rig.stream, 0, 100)
    assert wait_for(lambda: len(rig.processed()) >= 100, timeout_s=30)
    # WHEN GetRecords fails with `code` several times while records arrive (throttling retried inside the
    # fetcher; an expired iterator renewed from the last delivered record)
    with fail_calls(rig.kinesis, "GetRecords", code, times=6) as injected:
        produced += put(rig.kinesis, rig.stream, 100, 100)
        assert wait_for(lambda: injected.failed >= 6, timeout_s=30)
    produced += put(rig.kinesis, rig.stream, 200, 100)
    # THEN every record is processed once, and no lease was lost
    assert wait_for(lambda: set(rig.processed()) >= set(produced), timeout_s=30)
    assert all(worker.shutdown(timeout_s=10) for worker in rig.workers)
    assert sorted(rig.processed()) == sorted(produced)
    assert rig.lost() == []
