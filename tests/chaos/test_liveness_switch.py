"""Switching a running fleet's liveness mode (docs/liveness-modes.md) with records flowing: lease → worker → lease.

Real `shardlease worker` processes (no embedded leader) and a `shardlease leader` process on moto, all configured
``SHARDLEASE_LIVENESS_MODE=auto`` (follow the stored mode) and re-reading it every second; the switch is asked for
with `shardlease liveness --set`, as an operator would, and completed by the leader. Three of the four shards get
records; the fourth stays idle, so that its lease counter moves only when its owner renews it (a checkpoint moves
it too, and an idle shard has none) — that is how the test sees renewals stop and start again. The leader balances
by lease count (the CPU-based default keeps moving the idle lease, the cheapest to move, between workers on one
machine); a fourth worker joins in worker mode, so that a lease is handed over by the leader's request on the old
owner's heartbeat item, and the fleet switches back to lease mode right after.

Invariants (tests/support/chaos.py, ``check_journal``), as in the rest of the chaos suite: nothing lost, per-session
order, nothing after a session's LOST line, and — as no process dies — no duplicate unless its first session lost its
lease. A switch must not cost a lease at all, so no LOST line either.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.conftest import App
from tests.support.chaos import read_lines, worker_liveness
from tests.support.processes import LEADER_TIMINGS, shardlease_liveness
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.mode import LivenessMode, StoredMode
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import list_all_shards
from worker_lib.testing.waiting import wait_until
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SHARDS = 4
WORKERS = ("w1", "w2", "w3")
NEWCOMER = "w4"
FAILOVER_S = 3.0  # SHARDLEASE_FAILOVER_TIME_MS in tests/support/processes.py FAST_ENV
RENEW_S = FAILOVER_S / 3  # a worker renews every failover / 3 − ε in lease mode
WINDOW_S = 4 * RENEW_S  # long enough for a renewing owner to renew three times or more
SWITCH_TIMEOUT_S = 30.0  # a second to notice the target, a beat, a leader run, a second to follow: a few seconds


def env_for(journal: Path) -> dict[str, str]:
    return {
        **LEADER_TIMINGS,
        "SHARDLEASE_CHAOS_JOURNAL": str(journal),
        "SHARDLEASE_LIVENESS_MODE": "auto",
        "SHARDLEASE_LIVENESS_MODE_CHECK_MS": "1000",
        "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "1000",  # the leader reads the mode at every full run
        "SHARDLEASE_ASSIGNMENT_STRATEGY": "count",
    }


@dataclass(frozen=True)
class Window:
    """What one lease's item did over a watched window."""

    renewals: int  # counter moved with owner, checkpoint owner and checkpoint unchanged: only a renewal does that
    owner_changed: bool  # a move in the window (a take after it looks like a renewal): the window proves nothing


def watch(store: DynamoDBLeaseStore, key: str, seconds: float) -> Window:
    """Poll the lease item every 0.1 s for ``seconds`` and count the renewals seen (real time: other processes
    renew on their own clocks)."""
    renewals = 0
    owner_changed = False
    before = store.get_lease(key)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = store.get_lease(key)
        if (
            before is None
            or now is None
            or (now.lease_owner, now.checkpoint_owner) != (before.lease_owner, before.checkpoint_owner)
        ):
            owner_changed = True
        elif now.lease_counter != before.lease_counter and now.checkpoint == before.checkpoint:
            renewals += 1
        before = now
    return Window(renewals, owner_changed)


def steady_window(store: DynamoDBLeaseStore, key: str, seconds: float, *, tries: int = 3) -> Window:
    """A window in which the lease kept its owner (a rebalancing move in the middle proves nothing), bounded."""
    window = watch(store, key, seconds)
    for _ in range(tries - 1):
        if not window.owner_changed:
            break
        window = watch(store, key, seconds)
    assert not window.owner_changed, f"{key} changed owner in each of {tries} windows of {seconds:.0f} s"
    return window


LEASE = StoredMode(mode=LivenessMode.LEASE)
WORKER = StoredMode(mode=LivenessMode.WORKER)


def records_between(lines_path: Path, start: float, end: float) -> int:
    return sum(1 for x in read_lines(lines_path) if x.kind == "REC" and start <= x.t <= end)


def test_switching_a_running_fleet_to_worker_mode_and_back_loses_nothing(app: App, tmp_path: Path) -> None:
    modes = LivenessModeStore(CoordinatorStateStore(app.name, client=app.ddb))
    rows, store = app.rows, app.store
    app.create_stream(SHARDS)
    shards = sorted(list_all_shards(app.kinesis, app.stream), key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
    idle = shards[-1]["ShardId"]
    busy_keys = [s["HashKeyRange"]["StartingHashKey"] for s in shards[:-1]]
    figures: dict[str, Any] = {}
    all_workers = (*WORKERS, NEWCOMER)
    with app.fleet(tmp_path, env_for(app.journal), worker_env={"SHARDLEASE_LEADER_MODE": "none"}) as fleet:
        # GIVEN three workers and a leader process, all following the stored liveness mode (none stored yet: the
        # leader records lease), 4 shards of which 3 get records from a steady producer and one stays idle
        for worker_id in WORKERS:
            fleet.start_chaos_worker(worker_id)
        fleet.start_leader_process("L1")
        with Producer(app.kinesis, app.stream, hash_keys=busy_keys) as producer:
            assert wait_until(lambda: fleet.shards_processed() == SHARDS - 1, timeout_s=60)
            assert wait_until(lambda: any(x.shard == idle and x.kind == "INIT" for x in fleet.lines()), timeout_s=30)
            assert modes.read() == LEASE
            assert wait_until(lambda: _all_say(rows, "lease"), timeout_s=10), _said(rows)
            # (in lease mode the idle shard's owner renews it)
            before = steady_window(store, idle, WINDOW_S)
            assert before.renewals >= 2, f"lease mode: {before.renewals} renewals of the idle {idle} in {WINDOW_S} s"

            # WHEN the operator switches the application to worker mode while records flow
            asked = time.monotonic()
            shardlease_liveness(app.name, app.endpoint, target="worker")
            # THEN the leader completes the switch, every worker follows it, and renewals stop
            assert wait_until(lambda: modes.read() == WORKER, timeout_s=SWITCH_TIMEOUT_S), modes.read()
            assert wait_until(lambda: _all_say(rows, "worker"), timeout_s=SWITCH_TIMEOUT_S), _said(rows)
            figures["to_worker_s"] = round(time.monotonic() - asked, 1)
            window_start = time.monotonic()
            during = steady_window(store, idle, WINDOW_S)
            window_end = time.monotonic()
            assert during.renewals == 0, f"worker mode: {during.renewals} renewals of the idle {idle}"
            # AND records keep flowing meanwhile
            assert records_between(app.journal, window_start, window_end) > 0, "nothing processed in worker mode"
            # (and the summary the operator sees says the same)
            summary = shardlease_liveness(app.name, app.endpoint)
            assert summary["mode"] == "worker" and summary["target"] is None, summary
            assert set(summary["workers"].values()) == {"worker"}, summary

            # WHEN a fourth worker joins in worker mode: the leader asks an owner to hand a lease over to it
            fleet.start_chaos_worker(NEWCOMER)
            assert wait_until(lambda: bool(fleet.holding(NEWCOMER)), timeout_s=SWITCH_TIMEOUT_S), (
                f"{NEWCOMER} got no lease in worker mode"
            )
            # AND the operator switches back to lease mode while records flow
            asked = time.monotonic()
            shardlease_liveness(app.name, app.endpoint, target="lease")
            # THEN every worker starts renewing again, the leader completes the switch, and the idle lease's counter
            # moves again
            assert wait_until(lambda: modes.read() == LEASE, timeout_s=SWITCH_TIMEOUT_S), modes.read()
            assert wait_until(lambda: _all_say(rows, "lease", all_workers), timeout_s=SWITCH_TIMEOUT_S), _said(
                rows, all_workers
            )
            figures["to_lease_s"] = round(time.monotonic() - asked, 1)
            window_start = time.monotonic()
            after = steady_window(store, idle, WINDOW_S)
            window_end = time.monotonic()
            assert after.renewals >= 2, f"lease mode again: {after.renewals} renewals of the idle {idle}"
            assert records_between(app.journal, window_start, window_end) > 0, "nothing processed after switching back"
            producer.stop()
        produced = producer.produced
        # THEN every produced record is processed
        assert wait_until(lambda: fleet.processed_all(produced), timeout_s=60), "records still missing"
        codes = fleet.stop(list(all_workers))
        codes.update(fleet.stop(["L1"], sig=signal.SIGINT))  # the leader CLI releases its lock on SIGINT
    lines = fleet.lines()
    assert not fleet.abnormal_pids()  # no process was killed: a duplicate is allowed only after a LOST line
    verdict = fleet.verdict(produced, lease_bound_s=FAILOVER_S)
    lost_leases = [x for x in lines if x.kind == "LOST"]
    fleet.record(
        "liveness-switch",
        verdict,
        producer,
        **figures,
        renewals_lease_before=before.renewals,
        renewals_worker=during.renewals,
        renewals_lease_after=after.renewals,
        lost_leases=len(lost_leases),
    )
    # AND the journal satisfies every invariant of the chaos suite, and no lease was lost on the way
    assert not verdict.violations, verdict.violations[:10]
    assert not lost_leases, f"leases lost during the switches: {lost_leases[:5]}"
    assert all(code == 0 for code in codes.values()), f"exit codes {codes}"


def _said(rows: WorkerMetricsStore, workers: tuple[str, ...] = WORKERS) -> dict[str, str | None]:
    return worker_liveness(rows, workers)


def _all_say(rows: WorkerMetricsStore, mode: str, workers: tuple[str, ...] = WORKERS) -> bool:
    return set(_said(rows, workers).values()) == {mode}
