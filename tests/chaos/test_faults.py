"""Faults at the botocore layer (event hooks, no emulator changes) under in-process Workers with embedded leaders.

DynamoDB: throttling, 5xx, read timeouts, lost replies (applied, reply dropped) and timeouts of writes that landed,
aimed at one write at a time — the worker's renewals (``lease`` liveness mode only: ``worker`` mode has none) or
heartbeats, its checkpoints, the leader's assignments — for a window shorter than the lease. Kinesis: throttled and
expired-iterator GetRecords. Each time: nothing lost, no lease lost (the fault implies no loss of ownership), no
duplicate, and processing continues once the fault stops. Then the heartbeat writes of one worker fail for longer
than the failover time — landing with every reply timed out, or throttled — in both liveness modes: the worker's
leases are suspended once its fence ran out, it gives up exactly the shards the leader declared it gone for and moved
(none while its beats kept landing in lease mode), nothing is lost or processed twice by two workers, and its shards
are served again once its heartbeats work again.

The fault windows are real time (fixed sleeps: the leader and the workers run on their own threads); every wait is a
liveness bound derived from the rig's configured timings (``Rig.timings``, tests/support/stalls.py), and how soon the
shards were served again is a recorded figure, not a bound.
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
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.tables.schema import lease_table_name, worker_metrics_table_name
from worker_lib.testing.producers import Producer

FAULT_WINDOW_S = 2.0
FAILOVER_S = FAILOVER_MS / 1000
INJECTED_READ_FAILURES = 6
# The fetcher's waits after 1, 2, … consecutive throttled reads of a shard (the rig's workers run with the default
# backoff): at worst every injected failure falls on one shard.
THROTTLE_WAITS_S = [RetrievalConfig().throttle_backoff_s(n) for n in range(1, INJECTED_READ_FAILURES + 1)]

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
    t = rig.timings
    with dynamodb_fault(rig.ddb, fault, lease_table_name(rig.app), metrics_table=metrics_table):
        if write == "assign":
            # GIVEN the leader's assignments fail (or lose their replies) from the start, for a window
            fault.active.set()
            produced += put(rig.kinesis, rig.stream, 0, 100)
            rig.start()
            eventually(lambda: fault.hits > 0, bound_s=hang_bound_s(t.start_s), what="the fault never hit")
            time.sleep(FAULT_WINDOW_S)  # the fault's duration is real time: the leader runs on its own thread
            fault.active.clear()
        else:
            # GIVEN both workers processing, then the fault on their renewals / heartbeats / checkpoints for a window
            rig.start()
            produced += put(rig.kinesis, rig.stream, 0, 100)
            eventually(lambda: len(rig.processed()) >= 100, bound_s=hang_bound_s(t.start_s), what="the first records")
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
        # THEN everything is processed (an assignment that failed is made again by the next cycle)
        eventually(
            lambda: set(rig.processed()) >= set(produced),
            bound_s=hang_bound_s(t.assignment_s),
            what=f"{kind}/{write}: records missing after the fault",
        )
    assert fault.hits > 0, "the fault never hit"
    assert rig.stop()
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
        "throttle",  # no beat lands: the leader sees the counter stand still, may declare w1 gone and move its leases
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
        t = rig.timings
        with Producer(rig.kinesis, rig.stream) as producer:
            eventually(
                lambda: len({x.shard for x in lines() if x.kind == "REC"}) == 2,
                bound_s=hang_bound_s(t.start_s),
                what="both shards processed",
            )
            eventually(
                lambda: bool(holding(lines(), 1)), bound_s=hang_bound_s(t.start_s), what="w1 never processed a shard"
            )
            held = holding(lines(), 1)
            # WHEN every heartbeat of w1 fails for longer than the failover time: it lands but its reply times out
            # (on every retry), or it is throttled
            fault_at = time.monotonic()
            fault.active.set()
            time.sleep(max(0.0, fault_at + FAILOVER_S + 2.0 - time.monotonic()))  # the fault's window: real time
            fault.active.clear()
            healed_at = time.monotonic()
            # THEN once its beats get replies again every shard is served again: by w1 if the leader declared nothing
            # (its beats kept landing), by w2 if the leader declared w1 gone and moved them (how soon is the figure
            # resumed_after_fault_s)
            resumed_s = eventually(
                lambda: _all_served_after(lines(), held, healed_at),
                bound_s=hang_bound_s(t.silent_worker_s + t.verdict_s),
                what=f"{rig.liveness}/{kind}: shards {sorted(held)} not served again after w1's heartbeats healed",
            )
            producer.stop()
        produced = producer.produced
        eventually(
            lambda: {x.c for x in lines() if x.kind == "REC"} >= set(produced),
            bound_s=hang_bound_s(t.silent_worker_s + t.verdict_s),
            what=f"{rig.liveness}: records still missing",
        )
        # AND w1 has learned of every shard the leader moved (its first answered beat shows the declaration)
        eventually(
            lambda: _lost(lines(), 1, after=fault_at) >= _taken(lines(), held, after=fault_at),
            bound_s=hang_bound_s(t.heartbeat_s + t.verdict_s),
            what=f"{rig.liveness}/{kind}: w1 never learned that its shards moved",
        )
    assert rig.stop()
    journal = lines()
    taken, lost = _taken(journal, held, after=fault_at), _lost(journal, 1, after=fault_at)
    # (no process died: every duplicate must come from a session that ended with LOST)
    verdict = check_journal(journal, produced, abnormal_pids=set())
    record_figures(
        f"heartbeat-{kind}-past-failover-{rig.liveness}",
        {
            "held": len(held),
            "moved": len(taken),
            "fault_hits": fault.hits,
            "resumed_after_fault_s": round(resumed_s, 1),
            "runtime_s": round(time.monotonic() - started, 1),
            **verdict.figures(),
        },
    )
    # AND w1 gave up exactly the shards the leader moved: a slow or silent heartbeat alone costs no lease (issue 36)
    assert lost == taken, f"{rig.liveness}/{kind}: w1 reported {sorted(lost)} lost, the leader moved {sorted(taken)}"
    if kind == "landed-timeout" and rig.liveness == "lease":
        # AND beats that land keep the counter moving: in lease mode (no quiet period) nothing can be declared
        assert taken == set(), f"w1's shards {sorted(taken)} moved although every beat landed"
    # AND nothing is lost, order holds per session, duplicates only after a LOST; and w1 processed nothing on a shard
    # once another worker had started on it (but the batch it had been handed before)
    assert not verdict.violations, f"{rig.liveness}: {verdict.violations[:10]}"
    assert not fenced_after_stop(journal, 1, fault_at), fenced_after_stop(journal, 1, fault_at)[:5]


def _taken(lines: list[Line], shards: set[str], *, after: float) -> set[str]:
    """The shards of ``shards`` another worker (w2, tag 2) started a session on after ``after``."""
    return {x.shard for x in lines if x.pid == 2 and x.kind == "INIT" and x.t >= after and x.shard in shards}


def _lost(lines: list[Line], tag: int, *, after: float) -> set[str]:
    return {x.shard for x in lines if x.pid == tag and x.kind == "LOST" and x.t >= after}


def _all_served_after(lines: list[Line], shards: set[str], at: float) -> bool:
    return all(any(x.shard == s and x.kind == "REC" and x.t >= at for x in lines) for s in shards)


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ExpiredIteratorException"])
def test_kinesis_throttling_and_expired_iterators_lose_and_repeat_nothing(rig: Rig, code: str) -> None:
    # GIVEN two workers processing a 2-shard stream
    t = rig.timings
    rig.start()
    produced = put(rig.kinesis, rig.stream, 0, 100)
    eventually(lambda: len(rig.processed()) >= 100, bound_s=hang_bound_s(t.start_s), what="the first records")
    # WHEN GetRecords fails with `code` several times while records arrive (throttling retried inside the
    # fetcher; an expired iterator renewed from the last delivered record)
    with fail_calls(rig.kinesis, "GetRecords", code, times=INJECTED_READ_FAILURES) as injected:
        produced += put(rig.kinesis, rig.stream, 100, 100)
        eventually(
            lambda: injected.failed >= INJECTED_READ_FAILURES,
            bound_s=hang_bound_s(sum(THROTTLE_WAITS_S[:-1]) + INJECTED_READ_FAILURES * t.idle_s),
            what="the injected read failures",
        )
    produced += put(rig.kinesis, rig.stream, 200, 100)
    # THEN every record is processed once, and no lease was lost
    eventually(
        lambda: set(rig.processed()) >= set(produced),
        bound_s=hang_bound_s(THROTTLE_WAITS_S[-1] + t.idle_s),
        what="every record processed",
    )
    assert rig.stop()
    assert sorted(rig.processed()) == sorted(produced)
    assert rig.lost() == []
