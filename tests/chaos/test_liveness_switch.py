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
order, nothing after a session's LOST line, one owner at a time, and — as no process dies — no duplicate unless its
first session lost its lease. A switch must not cost a lease at all, so no LOST line either. Every wait is a liveness
bound derived from the fleet's configured timings (``ChaosFleet.timings``); the switches' seconds are figures.
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
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.mode import LivenessMode, StoredMode
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import list_all_shards
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(240)]

SHARDS = 4
WORKERS = ("w1", "w2", "w3")
NEWCOMER = "w4"
FAILOVER_S = 3.0  # SHARDLEASE_FAILOVER_TIME_MS in tests/support/processes.py FAST_ENV
RENEW_S = FAILOVER_S / 3  # a worker renews every failover / 3 − ε in lease mode
WINDOW_S = 4 * RENEW_S  # the watch of worker mode: long enough for a renewing owner to renew three times or more
RENEWALS = 2  # renewals of the idle lease that show its owner renews


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


def renewed(store: DynamoDBLeaseStore, key: str, times: int, *, bound_s: float, what: str) -> float:
    """Wait until the lease was renewed ``times`` times by one owner (a move restarts the count), polling every
    0.1 s, at most ``bound_s``; how long it took."""
    before = store.get_lease(key)
    renewals = 0

    def enough() -> bool:
        nonlocal before, renewals
        now = store.get_lease(key)
        if (
            before is None
            or now is None
            or (now.lease_owner, now.checkpoint_owner) != (before.lease_owner, before.checkpoint_owner)
        ):
            renewals = 0  # moved (or unreadable): a renewal after that is the new owner's
        elif now.lease_counter != before.lease_counter and now.checkpoint == before.checkpoint:
            renewals += 1
        before = now
        return renewals >= times

    return eventually(enough, bound_s=bound_s, what=what)


def renewed_s(store: DynamoDBLeaseStore, key: str, *, what: str) -> float:
    """:func:`renewed` ``RENEWALS`` times, within the liveness bound of that many renewals; how long it took, to
    0.1 s (a figure)."""
    return round(renewed(store, key, RENEWALS, bound_s=hang_bound_s(RENEWALS * RENEW_S), what=what), 1)


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
        t = fleet.timings
        # A switch: the workers read the stored mode (or target), say so with their next beat, and the leader's next
        # full run completes it (or, to worker mode, starts it; the workers follow at their next read).
        switch_bound_s = hang_bound_s(t.mode_check_s + t.heartbeat_s + t.cycle_s)
        # GIVEN three workers and a leader process, all following the stored liveness mode (none stored yet: the
        # leader records lease), 4 shards of which 3 get records from a steady producer and one stays idle
        for worker_id in WORKERS:
            fleet.start_chaos_worker(worker_id)
        fleet.start_leader_process("L1")
        with Producer(app.kinesis, app.stream, hash_keys=busy_keys) as producer:
            eventually(
                lambda: fleet.shards_processed() == SHARDS - 1,
                bound_s=hang_bound_s(t.start_s),
                what="the busy shards processed",
            )
            eventually(
                lambda: any(x.shard == idle and x.kind == "INIT" for x in fleet.lines()),
                bound_s=hang_bound_s(t.start_s),
                what=f"a session on the idle {idle}",
            )
            assert modes.read() == LEASE
            eventually(lambda: _all_say(rows, "lease"), bound_s=hang_bound_s(t.heartbeat_s), what="all say lease")
            # (in lease mode the idle shard's owner renews it)
            figures["renewed_lease_before_s"] = renewed_s(
                store, idle, what=f"lease mode: the idle {idle} not renewed {RENEWALS} times by one owner"
            )

            # WHEN the operator switches the application to worker mode while records flow
            asked = time.monotonic()
            shardlease_liveness(app.name, app.endpoint, target="worker")
            # THEN the leader completes the switch, every worker follows it, and renewals stop
            eventually(lambda: modes.read() == WORKER, bound_s=switch_bound_s, what="the switch to worker mode")
            eventually(lambda: _all_say(rows, "worker"), bound_s=switch_bound_s, what="all say worker")
            figures["to_worker_s"] = round(time.monotonic() - asked, 1)
            window_start = time.monotonic()
            during = steady_window(store, idle, WINDOW_S)
            assert during.renewals == 0, f"worker mode: {during.renewals} renewals of the idle {idle}"
            # AND records keep flowing meanwhile (still in worker mode: nothing switches it back before the next WHEN)
            eventually(
                lambda: records_between(app.journal, window_start, time.monotonic()) > 0,
                bound_s=hang_bound_s(t.idle_s),
                what="nothing processed in worker mode",
            )
            # (and the summary the operator sees says the same)
            summary = shardlease_liveness(app.name, app.endpoint)
            assert summary["mode"] == "worker" and summary["target"] is None, summary
            assert set(summary["workers"].values()) == {"worker"}, summary

            # WHEN a fourth worker joins in worker mode: the leader asks an owner to hand a lease over to it (at its
            # next full run, on the owner's heartbeat item; the owner lets go at its next beat, the newcomer notices)
            fleet.start_chaos_worker(NEWCOMER)
            eventually(
                lambda: bool(fleet.holding(NEWCOMER)),
                bound_s=hang_bound_s(t.start_s + t.cycle_s + 2 * t.heartbeat_s),
                what=f"{NEWCOMER} got no lease in worker mode",
            )
            # AND the operator switches back to lease mode while records flow
            asked = time.monotonic()
            shardlease_liveness(app.name, app.endpoint, target="lease")
            # THEN every worker starts renewing again, the leader completes the switch, and the idle lease's counter
            # moves again
            eventually(lambda: modes.read() == LEASE, bound_s=switch_bound_s, what="the switch back to lease mode")
            eventually(lambda: _all_say(rows, "lease", all_workers), bound_s=switch_bound_s, what="all say lease")
            figures["to_lease_s"] = round(time.monotonic() - asked, 1)
            window_start = time.monotonic()
            figures["renewed_lease_after_s"] = renewed_s(
                store, idle, what=f"lease mode again: the idle {idle} not renewed {RENEWALS} times by one owner"
            )
            eventually(
                lambda: records_between(app.journal, window_start, time.monotonic()) > 0,
                bound_s=hang_bound_s(t.idle_s),
                what="nothing processed after switching back",
            )
            producer.stop()
        produced = producer.produced
        # THEN every produced record is processed
        eventually(
            lambda: fleet.processed_all(produced),
            bound_s=hang_bound_s(t.idle_s + t.notice_s),
            what="records still missing",
        )
        codes = fleet.stop(list(all_workers), timeout_s=fleet.stop_bound_s())
        # (the leader CLI releases its lock on SIGINT, between two waits: nothing configured to wait for)
        codes.update(fleet.stop(["L1"], sig=signal.SIGINT, timeout_s=hang_bound_s(t.lock_beat_s)))
    lines = fleet.lines()
    assert not fleet.abnormal_pids()  # no process was killed: a duplicate is allowed only after a LOST line
    verdict = fleet.verdict(produced)
    lost_leases = [x for x in lines if x.kind == "LOST"]
    fleet.record(
        "liveness-switch",
        verdict,
        producer,
        **figures,
        renewals_worker=during.renewals,
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
