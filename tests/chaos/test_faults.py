"""Faults at the botocore layer (event hooks, no emulator changes) under in-process Workers with embedded leaders.

DynamoDB: throttling, 5xx, read timeouts, lost replies (applied, reply dropped) and timeouts of writes that landed,
aimed at one write at a time — the worker's renewals (``lease`` liveness mode only: ``worker`` mode has none) or
heartbeats, its checkpoints, the leader's assignments — for a window shorter than the lease. Kinesis: throttled and
expired-iterator GetRecords. Each time: nothing lost, no lease lost (the fault implies no loss of ownership), no
duplicate, and processing continues once the fault stops. Then the heartbeat writes of one worker fail for longer
than the failover time — landing with every reply timed out, or throttled — in both liveness modes: the worker stops
processing once its fence ran out (the leader may move its leases), nothing is lost or processed twice by two workers,
and its shards are served again within seconds of its heartbeats working again.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos.conftest import FAILOVER_MS, Rig, put
from tests.support.chaos import (
    Fault,
    Line,
    check_journal,
    dynamodb_fault,
    fenced_after_stop,
    holding,
    read_lines,
    record_figures,
)
from tests.support.kinesis_faults import fail_calls
from tests.support.processes import LIVENESS_MODES
from worker_lib.tables.schema import lease_table_name, worker_metrics_table_name
from worker_lib.testing.producers import Producer
from worker_lib.testing.waiting import wait_until

FAULT_WINDOW_S = 2.0
FAILOVER_S = FAILOVER_MS / 1000

pytestmark = pytest.mark.slow


KINDS = ["throttle", "5xx", "timeout", "lost-reply"]

# (liveness mode, write, fault kind). Renewals exist in lease mode only; the heartbeat is worker mode's only liveness
# write, so it gets every kind there, and in lease mode the two kinds whose write lands. Checkpoints and assignments
# are the same writes in both modes: in worker mode one kind that never lands (throttle, 5xx and timeout look alike
# to the library: retried, then raised) and the lost reply — enough to show the mode changes nothing, at ~5 s each.
CASES = [
    *[("lease", write, kind) for write in ("renew", "checkpoint", "assign") for kind in KINDS],
    ("lease", "heartbeat", "lost-reply"),
    ("lease", "heartbeat", "landed-timeout"),
    *[("worker", "heartbeat", kind) for kind in [*KINDS, "landed-timeout"]],
    *[("worker", write, kind) for write in ("checkpoint", "assign") for kind in ("timeout", "lost-reply")],
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
            assert wait_until(lambda: fault.hits > 0, timeout_s=20), "the fault never hit"
            time.sleep(FAULT_WINDOW_S)  # the fault's duration is real time: the leader runs on its own thread
            fault.active.clear()
        else:
            # GIVEN both workers processing, then the fault on their renewals / heartbeats / checkpoints for a window
            rig.start()
            produced += put(rig.kinesis, rig.stream, 0, 100)
            assert wait_until(lambda: len(rig.processed()) >= 100, timeout_s=30)
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
        assert wait_until(lambda: set(rig.processed()) >= set(produced), timeout_s=40), (
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


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "kind",
    [
        "landed-timeout",  # every beat lands (the leader sees the counter move), every reply times out
        "throttle",  # no beat lands: the leader sees the counter stand still and moves w1's leases
    ],
)
@pytest.mark.parametrize("rig", LIVENESS_MODES, indirect=True)
def test_heartbeats_failing_past_the_failover_time_fence_the_worker_and_lose_nothing(
    rig: Rig, tmp_path: Path, kind: str
) -> None:
    path = rig.chaos_journal = tmp_path / "journal.txt"
    path.touch()

    def lines() -> list[Line]:
        return read_lines(path)

    rig.discovery_interval_ms = None  # the production default: new leases by notice, the index query a safety net
    fault = Fault(kind=kind, write="heartbeat", worker="w1")
    started = time.monotonic()
    with dynamodb_fault(rig.ddb, fault, lease_table_name(rig.app), metrics_table=worker_metrics_table_name(rig.app)):
        # GIVEN two workers (journal tags 1 and 2) sharing a 2-shard stream while a producer writes 100 records/s
        rig.start()
        with Producer(rig.kinesis, rig.stream) as producer:
            assert wait_until(lambda: len({x.shard for x in lines() if x.kind == "REC"}) == 2, timeout_s=60)
            assert wait_until(lambda: bool(holding(lines(), 1)), timeout_s=30), "w1 never processed a shard"
            held = holding(lines(), 1)
            # WHEN every heartbeat of w1 fails for longer than the failover time: it lands but its reply times out
            # (on every retry), or it is throttled
            fault_at = time.monotonic()
            fault.active.set()
            # THEN w1 stops processing what it held once its fence runs out (no reply arrived in time)
            assert wait_until(lambda: held <= _lost(lines(), 1, after=fault_at), timeout_s=FAILOVER_S + 10), (
                f"{rig.liveness}: w1 kept processing {held - _lost(lines(), 1, after=fault_at)} without a heartbeat"
            )
            fenced_s = time.monotonic() - fault_at
            time.sleep(max(0.0, fault_at + FAILOVER_S + 2.0 - time.monotonic()))
            fault.active.clear()
            healed_at = time.monotonic()
            # AND once its beats get replies again, every shard is served again within a few seconds (waited for
            # longer, so that a miss says by how much)
            bound_s = FAILOVER_S + 5.0
            wait_until(lambda: _all_served_after(lines(), held, healed_at), timeout_s=90)
            resumed_s = time.monotonic() - healed_at
            producer.stop()
        produced = producer.produced
        assert wait_until(lambda: {x.c for x in lines() if x.kind == "REC"} >= set(produced), timeout_s=90), (
            f"{rig.liveness}: records still missing"
        )
    assert all(worker.shutdown(timeout_s=10) for worker in rig.workers)
    journal = lines()
    # (no process died: every duplicate must come from a session that ended with LOST)
    verdict = check_journal(journal, produced, abnormal_pids=set(), lease_bound_s=FAILOVER_S)
    record_figures(
        f"heartbeat-{kind}-past-failover-{rig.liveness}",
        {
            "held": len(held),
            "fault_hits": fault.hits,
            "fenced_s": round(fenced_s, 1),
            "resumed_after_fault_s": round(resumed_s, 1),
            "runtime_s": round(time.monotonic() - started, 1),
            **verdict.figures(),
        },
    )
    # AND nothing is lost, order holds per session, duplicates only after a LOST; and w1 processed nothing on a shard
    # once another worker had started on it
    assert not verdict.violations, f"{rig.liveness}: {verdict.violations[:10]}"
    assert not fenced_after_stop(journal, 1, fault_at), fenced_after_stop(journal, 1, fault_at)[:5]
    assert resumed_s < bound_s, (
        f"{rig.liveness}/{kind}: shards {sorted(held)} served again {resumed_s:.1f} s after w1's heartbeats healed "
        f"(bound {bound_s:.0f} s)"
    )


def _lost(lines: list[Line], tag: int, *, after: float) -> set[str]:
    return {x.shard for x in lines if x.pid == tag and x.kind == "LOST" and x.t >= after}


def _all_served_after(lines: list[Line], shards: set[str], at: float) -> bool:
    return all(any(x.shard == s and x.kind == "REC" and x.t >= at for x in lines) for s in shards)


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ExpiredIteratorException"])
def test_kinesis_throttling_and_expired_iterators_lose_and_repeat_nothing(rig: Rig, code: str) -> None:
    # GIVEN two workers processing a 2-shard stream
    rig.start()
    produced = put(rig.kinesis, rig.stream, 0, 100)
    assert wait_until(lambda: len(rig.processed()) >= 100, timeout_s=30)
    # WHEN GetRecords fails with `code` several times while records arrive (throttling retried inside the
    # fetcher; an expired iterator renewed from the last delivered record)
    with fail_calls(rig.kinesis, "GetRecords", code, times=6) as injected:
        produced += put(rig.kinesis, rig.stream, 100, 100)
        assert wait_until(lambda: injected.failed >= 6, timeout_s=30)
    produced += put(rig.kinesis, rig.stream, 200, 100)
    # THEN every record is processed once, and no lease was lost
    assert wait_until(lambda: set(rig.processed()) >= set(produced), timeout_s=30)
    assert all(worker.shutdown(timeout_s=10) for worker in rig.workers)
    assert sorted(rig.processed()) == sorted(produced)
    assert rig.lost() == []
