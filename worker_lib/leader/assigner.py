"""The leader's assignment step: read the tables, decide (pure), write conditionally, report.

One run (KCL's LeaseAssignmentManager, docs/kcl-compatibility.md):

1. scan leases (parallel segments once the table is large) and worker metrics;
2. expiry by counter observation on the leader's monotonic clock (:class:`ExpiryTracker`, reset when a new
   leadership term starts, so a new leader gives every owner a full lease duration before judging it — except for
   the observations the previous leader kept, :class:`~worker_lib.leader.housekeeping.KeptObservations`);
3. force graceful handoffs that outlived their deadline (handoff timeout + failover time;
   :class:`~worker_lib.leader.handoffs.HandoffTracker`, which also dates the hand-offs step 5 starts);
4. run the decider on a snapshot of the unfinished leases (finished SHARD_END leases have nothing to read);
5. write: ``assignLease`` conditioned on the observed owner *and counter* for unassigned and expired leases (an
   owner that renewed meanwhile wins), ``initiateGracefulHandoff`` for rebalancing moves; a lost condition is
   counted, never retried in the same run (the next run sees the new state);
6. delete worker-metrics entries not updated for a day (conditional on the ``lut`` seen) and those of stopped workers
   that own nothing (:class:`~worker_lib.leader.housekeeping.WorkerRowSweeper`).

Workers that let all their leases expire are left out of the fleet until they report again
(:class:`~worker_lib.leader.housekeeping.Suspects`). This module keeps the order of the steps and their decisions;
the state each of those helpers keeps between runs lives in its own module, so each rule can be read on its own.

With worker heartbeats (docs/failover.md) every run also asks the :class:`LivenessJudge`: departing and gone workers
get nothing, and the leases of a gone worker — confirmed by a consistent read of its heartbeat taken after the
lease scan — count as expired at once. The leader's *fast* passes (``run(fast=True)``, between full cycles, when a
worker left or changed something) are the same run without rebalancing. After writing, every worker that received
leases gets a notice (``asv``/``asl``) that its next heartbeat brings back, so it starts them within a beat.

In ``worker`` liveness mode (docs/liveness-modes.md; :class:`~worker_lib.leader.mode_keeper.LeaderModeKeeper` reads
the mode at every full run) a heartbeating worker's leases are never expired by their counters — they are not
renewed — only when the worker is gone; graceful hand-offs away from a heartbeating owner are requested on its own
item (``hrq``, :mod:`worker_lib.leader.handoffs`), and forced only the hand-off timeout plus the failover time after
that request landed. A lease whose owner does not heartbeat is judged by its counter as before, and reported as a
*foreign owner*.

Every decision is logged as one structured line with its reason and the load before/after; the run returns an
:class:`AssignmentReport` whose fields are the leader's per-cycle metrics.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.deciders import make_decider
from worker_lib.assignment.heartbeats import LivenessView
from worker_lib.assignment.plan import AssignmentPlan, Decider, Decision
from worker_lib.assignment.snapshot import AssignmentSnapshot, ExpiryTracker, owners_lags
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Lease, WorkerMetricStats
from worker_lib.leader.assignment_report import AssignmentReport  # the report it returns
from worker_lib.leader.handoffs import HandoffRequester, HandoffTracker, StartedHandoff
from worker_lib.leader.housekeeping import (
    KeptObservations,
    ObservationKeeper,
    Suspects,
    WorkerRowCleaner,
    WorkerRowSweeper,
)
from worker_lib.leader.mode_keeper import LeaderModeKeeper
from worker_lib.leader.sizing import FleetSizer
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.store import LeaseStore

DECISION_LOGGER = f"{__name__}.decisions"
"""One JSON line per decision the leader writes (lease, from, to, kind, reason, load before and after)."""

log = logging.getLogger(__name__)
decision_log = logging.getLogger(DECISION_LOGGER)

PARALLEL_SCAN_THRESHOLD = 1_000
"""Above this many leases the leader scans in parallel segments."""

PARALLEL_SCAN_SEGMENTS = 4
"""How many (bench/cost_model extrapolates the scan's cost from these two constants)."""


class WorkerMetricsSource(WorkerRowCleaner, Protocol):
    """The worker-metrics items: read at every run, stale and stopped ones deleted after full runs."""

    def list_all(self) -> list[WorkerMetricStats]: ...


class LivenessJudge(Protocol):
    """The leader's view of heartbeating workers (:class:`~worker_lib.leader.fast_path.LivenessWatch`)."""

    def observe(self, workers: Sequence[WorkerMetricStats]) -> LivenessView: ...

    def confirm_gone(self, worker_id: str) -> bool:
        """A consistent read of the worker's heartbeat, taken now: is it still gone?"""


class AssignmentNotifier(HandoffRequester, Protocol):
    """The workers' own items: assignment notices (``asv``/``asl``) and, in ``worker`` mode, hand-off requests."""

    def notify_assigned(self, worker_id: str, lease_keys: Sequence[str]) -> bool: ...


class CapRecorder(Protocol):
    """Where the effective per-worker cap is published (the ``MaxLeasesPerWorker`` item), for ``shardlease status``."""

    def record(self, cap: int | None, *, shards: int, workers: int) -> None: ...


class DecisionSink(Protocol):
    """Where the decisions of a run are kept for operators (``shardlease status``)."""

    def record(self, decisions: Sequence[Decision]) -> None: ...


class LeaseAssigner:
    """The assignment step of :class:`~worker_lib.leader.leader.Leader`."""

    def __init__(
        self,
        lease_store: LeaseStore,
        worker_metrics: WorkerMetricsSource,
        *,
        config: AssignmentConfig | None = None,
        lease_config: LeaseConfig | None = None,
        decider: Decider | None = None,
        cap_recorder: CapRecorder | None = None,
        decision_recorder: DecisionSink | None = None,
        liveness: LivenessJudge | None = None,
        notifier: AssignmentNotifier | None = None,
        observations: ObservationKeeper | None = None,
        modes: LeaderModeKeeper | None = None,
        sizer: FleetSizer | None = None,
        clock: Clock = SYSTEM_CLOCK,
        seed: int | None = None,
        max_parallel_writes: int = 16,
    ) -> None:
        self._store = lease_store
        self._metrics = worker_metrics
        self._config = config or AssignmentConfig()
        self._lease_config = lease_config or LeaseConfig()
        self._decider = decider or make_decider(self._config)
        self._cap_recorder = cap_recorder
        self._decision_recorder = decision_recorder
        self._liveness = liveness
        self._notifier = notifier
        self._modes = modes or LeaderModeKeeper(None, setting="lease")
        self._sizer = sizer
        self._warned_foreign: set[str] = set()
        self._clock = clock
        self._rng = random.Random(seed)
        self._expiry = ExpiryTracker(self._lease_config.failover_s)
        self._kept = KeptObservations(self._expiry, observations, clock=clock)
        self._handoffs = HandoffTracker(
            lease_store, notifier, config=self._lease_config, clock=clock, decisions=decision_log
        )
        self._sweeper = WorkerRowSweeper(worker_metrics)
        self._suspects = Suspects(self._config)
        self._last_lease_count = 0
        self._max_parallel = max(1, max_parallel_writes)

    # --- one run --------------------------------------------------------------------------------------------

    def run(self, *, run_number: int, fast: bool = False) -> AssignmentReport:
        """One run. ``fast``: a pass between full cycles (no rebalancing, no term reset, no housekeeping).

        The worker rows are read after the lease scan, never before (not even the fast tick's fresh read): a worker
        that says DEPARTING and then gives its leases up must not be seen active beside its given-up leases, or they
        would go straight back to it."""
        started = self._clock.monotonic()
        if run_number == 1 and not fast:
            self._modes.new_term()
            self._expiry.reset()  # a new term: never judge with another term's observations …
            self._handoffs.reset()
            self._suspects.clear()
            self._kept.restore()  # … except those kept in the table, dated and trusted up to the skew bound
        # The mode is read before the scan: a switch requested after it is judged by the next run.
        liveness = self._modes.begin_run() if not fast else self._modes.judging
        per_owner = liveness.leader_judges_per_owner
        segments = PARALLEL_SCAN_SEGMENTS if self._last_lease_count > PARALLEL_SCAN_THRESHOLD else 1
        all_leases = self._store.list_leases(segments=segments)
        self._last_lease_count = len(all_leases)
        all_workers = self._metrics.list_all()
        now_mono, now_wall = self._clock.monotonic(), self._clock.wall()

        # A shard stopped by its failure policy (stop-shard) is assigned to nobody until resumed.
        live = [lease for lease in all_leases if not lease.is_finished and not lease.is_stopped]
        expired = self._expiry.observe(live, now_mono)
        view = self._liveness.observe(all_workers) if self._liveness is not None else LivenessView()
        foreign: tuple[str, ...] = ()
        if per_owner:
            # Heartbeating owners do not renew: only their heartbeat (below) can expire their leases.
            by_key = {lease.lease_key: lease for lease in live}
            expired = frozenset(k for k in expired if by_key[k].actual_owner not in view.heartbeating)
            foreign = self._foreign_owners(live, view)
        gone = self._confirmed_gone(live, view)
        if gone:
            expired = expired | {lease.lease_key for lease in live if lease.actual_owner in gone}
        forced = self._handoffs.force_overdue(live, now_mono, requested_from=view.heartbeating if per_owner else None)
        if forced:
            forced_keys = {lease.lease_key for lease in forced}
            live = [lease for lease in live if lease.lease_key not in forced_keys] + forced

        workers = self._suspects.without_silent(
            [w for w in all_workers if w.worker_id not in view.excluded], alive=view.heartbeating - view.gone
        )
        snapshot = AssignmentSnapshot(
            leases=tuple(live),
            workers=tuple(workers),
            now_epoch_s=now_wall,
            expired_lease_keys=expired,
            last_counter_increment=self._expiry.last_increments(),
            run_number=run_number,
            balance=False if fast else None,
            draining=self._sizer.draining if self._sizer is not None else frozenset(),
        )
        decide_started = self._clock.monotonic()
        plan = self._decider.decide(snapshot, rng=self._rng)
        decide_ms = (self._clock.monotonic() - decide_started) * 1000
        self._suspects.remember(snapshot, workers)
        conflicts, received, handoffs = self._write(plan, {lease.lease_key: lease for lease in live})
        self._handoffs.started(handoffs, requested_from=view.heartbeating if per_owner else None)
        for lease in forced:
            if lease.lease_owner is not None:
                received.setdefault(lease.lease_owner, []).append(lease.lease_key)
        notices = self._notify({w: keys for w, keys in received.items() if w in view.heartbeating})
        if self._decision_recorder is not None and plan.decisions:  # after the notices: hand-over waits for nothing
            try:
                self._decision_recorder.record(plan.decisions)
            except DependencyError as exc:
                log.warning("could not record the decisions for status: %s", exc)
        if not fast:
            if self._cap_recorder is not None:
                assignable = len(snapshot.assignable_workers(self._config.worker_report_interval_s))
                try:
                    self._cap_recorder.record(plan.effective_cap, shards=len(live), workers=assignable)
                except DependencyError as exc:
                    log.warning("could not publish the lease cap: %s", exc)
            self._sweeper.sweep_stale(all_workers, now_wall, now_mono)
            self._sweeper.sweep_stopped(all_workers, live)
            self._kept.keep(now_mono, now_wall)
            self._modes.after_run(all_workers, view.gone, forget=lambda: self._kept.forget(now_mono, now_wall))

        report = self._report(
            run_number=run_number,
            plan=plan,
            all_leases=all_leases,
            live=live,
            workers=workers,
            snapshot=snapshot,
            expired=expired,
            forced=len(forced),
            conflicts=conflicts,
            decide_ms=decide_ms,
            duration_ms=(self._clock.monotonic() - started) * 1000,
            view=view,
            notices=notices,
            fast=fast,
            liveness=liveness.describe(),
            foreign=foreign,
        )
        if not fast and self._sizer is not None:
            report = self._size_fleet(self._sizer, report, snapshot, live, now_wall)
        log.info(report.summary())
        return report

    def _size_fleet(
        self,
        sizer: FleetSizer,
        report: AssignmentReport,
        snapshot: AssignmentSnapshot,
        live: Sequence[Lease],
        now_wall: float,
    ) -> AssignmentReport:
        """DesiredWorkers from this full run's picture (docs/autoscaling.md); a failure to read it is logged."""
        try:
            desired = sizer.size(
                workers=snapshot.assignable_workers(self._config.worker_report_interval_s),
                leases=live,
                max_lag_ms=report.max_millis_behind,
                now_epoch_s=now_wall,
            )
        except DependencyError as exc:
            log.warning("could not size the fleet: %s", exc)
            return report
        return dataclasses.replace(
            report,
            desired_workers=desired.desired,
            desired_reason=desired.reason,
            workers_to_remove=sizer.remove,
        )

    def _foreign_owners(self, live: Sequence[Lease], view: LivenessView) -> tuple[str, ...]:
        owners = {lease.actual_owner for lease in live if lease.actual_owner is not None}
        foreign = tuple(sorted(o for o in owners if o is not None and o not in view.heartbeating))
        for owner in sorted(set(foreign) - self._warned_foreign):
            log.warning(
                "lease owner %s does not heartbeat in worker liveness mode (a KCL worker, or heartbeats off): its "
                "leases are judged by their counters, and it cannot judge the other workers' leases",
                owner,
            )
        self._warned_foreign = set(foreign)
        return foreign

    # --- liveness (docs/failover.md) ------------------------------------------------------------------------

    def _confirmed_gone(self, live: Sequence[Lease], view: LivenessView) -> frozenset[str]:
        """Gone workers that still own (or checkpoint-own) a lease, each confirmed by a consistent read taken now —
        after the lease scan, which is what makes moving their leases safe (the argument in docs/failover.md)."""
        if self._liveness is None or not view.gone:
            return frozenset()
        owners = {lease.actual_owner for lease in live if lease.actual_owner in view.gone}
        confirmed: set[str] = set()
        for worker_id in sorted(o for o in owners if o is not None):
            try:
                if self._liveness.confirm_gone(worker_id):
                    confirmed.add(worker_id)
            except DependencyError as exc:
                log.warning("could not confirm that worker %s is gone: %s", worker_id, exc)
        if confirmed:
            log.info("workers gone (heartbeat): %s; their leases move now", ", ".join(sorted(confirmed)))
        return frozenset(confirmed)

    def _notify(self, received: Mapping[str, list[str]]) -> int:
        """Tell each heartbeating worker which leases it received (its next heartbeat brings the notice back)."""
        if self._notifier is None:
            return 0
        sent = 0
        for worker_id, keys in sorted(received.items()):
            try:
                if self._notifier.notify_assigned(worker_id, keys):
                    sent += 1
            except DependencyError as exc:  # the worker's periodic discovery finds the leases anyway
                log.warning("could not notify worker %s of %d lease(s): %s", worker_id, len(keys), exc)
        return sent

    # --- writes ---------------------------------------------------------------------------------------------

    def _write_one(self, decision: Decision, lease: Lease) -> tuple[bool, bool]:
        """Write one decision; returns (written, as a graceful handoff)."""
        graceful = (
            decision.kind == "rebalance"
            and self._lease_config.graceful_handoff_enabled
            and lease.lease_owner is not None
            and lease.checkpoint_owner is None
        )
        try:
            if graceful:
                written = self._store.initiate_graceful_handoff(lease, decision.to_worker) is not None
            else:
                written = (
                    self._store.assign_lease(lease, decision.to_worker, expected_counter=lease.lease_counter)
                    is not None
                )
        except DependencyError as exc:
            log.warning("write for lease %s failed: %s", lease.lease_key, exc)
            written = False
        fields: dict[str, Any] = decision.to_log()
        fields["write"] = "graceful_handoff" if graceful else "assign_lease"
        fields["written"] = written
        decision_log.info(json.dumps(fields, sort_keys=True))
        return written, graceful

    def _write(
        self, plan: AssignmentPlan, leases: Mapping[str, Lease]
    ) -> tuple[int, dict[str, list[str]], list[StartedHandoff]]:
        """Write every decision; returns the number of lost conditions, per worker the leases it received outright
        (a graceful handoff's receiver is notified by the old owner when it lets go), and the hand-offs started
        ``(lease, new owner, old owner)``."""
        pairs = [(d, leases[d.lease_key]) for d in plan.decisions if d.lease_key in leases]
        if len(pairs) <= 2 or self._max_parallel == 1:
            results = [self._write_one(d, lease) for d, lease in pairs]
        else:
            with ThreadPoolExecutor(max_workers=min(self._max_parallel, len(pairs))) as pool:
                results = list(pool.map(lambda pair: self._write_one(*pair), pairs))
        received: dict[str, list[str]] = {}
        handoffs: list[StartedHandoff] = []
        for (decision, lease), (written, graceful) in zip(pairs, results, strict=True):
            if written and graceful:  # the handoff deadline runs from when we started it, not when we next see it
                handoffs.append((lease.lease_key, decision.to_worker, lease.lease_owner))
            elif written:
                received.setdefault(decision.to_worker, []).append(lease.lease_key)
        return sum(1 for written, _ in results if not written), received, handoffs

    def _report(
        self,
        *,
        run_number: int,
        plan: AssignmentPlan,
        all_leases: Sequence[Lease],
        live: Sequence[Lease],
        workers: Sequence[WorkerMetricStats],
        snapshot: AssignmentSnapshot,
        expired: frozenset[str],
        forced: int,
        conflicts: int,
        decide_ms: float,
        duration_ms: float,
        view: LivenessView,
        notices: int,
        fast: bool = False,
        liveness: str = "lease",
        foreign: tuple[str, ...] = (),
    ) -> AssignmentReport:
        return AssignmentReport(
            run_number=run_number,
            strategy=plan.strategy,
            leases=len(live),
            finished_leases=sum(1 for lease in all_leases if lease.is_finished),
            stopped_shards=tuple(
                sorted(lease.lease_key for lease in all_leases if lease.is_stopped and not lease.is_finished)
            ),
            blocked_shards=sum(1 for lease in all_leases if lease.block is not None and not lease.is_finished),
            workers_total=len(workers),
            workers_assignable=len(snapshot.assignable_workers(self._config.worker_report_interval_s)),
            expired=sum(1 for lease in live if lease.lease_key in expired and lease.actual_owner is not None),
            assigned=plan.assigned,
            reassigned_expired=plan.reassigned_expired,
            moved=plan.moved,
            handoffs_forced=forced,
            unassigned=len(plan.unassigned_lease_keys),
            write_conflicts=conflicts,
            balancing_ran=plan.balancing_ran,
            effective_cap=plan.effective_cap,
            metric=plan.metric,
            max_over_mean=round(plan.load_ratio(), 4),
            leases_per_worker=dict(plan.projected_leases),
            load_per_worker={k: round(v, 4) for k, v in plan.projected_load.items()},
            throughput_per_worker_kbps={k: round(v, 3) for k, v in plan.projected_throughput_kbps.items()},
            decide_ms=round(decide_ms, 3),
            duration_ms=round(duration_ms, 3),
            fast=fast,
            workers_gone=tuple(sorted(view.gone)),
            workers_departing=tuple(sorted(view.departing)),
            notices=notices,
            liveness_mode=liveness,
            max_millis_behind=max((ms for _, _, ms in owners_lags(live, workers)), default=None),
            foreign_owners=foreign,
        )
