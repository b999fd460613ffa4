"""What the leader keeps between assignment runs and tidies after them, apart from the eight steps of a run of
:class:`~worker_lib.leader.assigner.LeaseAssigner`:

* :class:`WorkerRowSweeper` — deletes worker-metrics items nobody needs any more: those not updated for a day (as
  KCL does, at most once an hour) and those of workers that said STOPPED and own nothing. The leader reads every
  item every second in ``worker`` mode, so items left behind by each deploy would cost on every read.
* :class:`KeptObservations` — the lease-expiry observations that outlive a leader (docs/failover.md): saved after
  each full run, restored when a new term starts, so the next leader need not give every owner a full failover
  time again; forgotten before a switch back to ``lease`` mode completes (docs/liveness-modes.md).
* :class:`Suspects` — workers that let all their leases expire, left out of the fleet until they report again
  (docs/assignment.md, "suspect").

Each is small and takes only what it touches, so the run reads as its steps and these rules are tested on their own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.snapshot import AssignmentSnapshot, ExpiryTracker
from worker_lib.assignment.state import suspect_workers
from worker_lib.core.clock import Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Lease, WorkerMetricStats, WorkerState

log = logging.getLogger(__name__)

STALE_WORKER_METRICS_S = 24 * 3600
"""KCL deletes worker-metrics entries not updated for a day."""


class WorkerRowCleaner(Protocol):
    """The conditional deletes of the worker-metrics store (a row that changed since it was read is kept)."""

    def delete_if_unchanged(self, worker_id: str, last_update_epoch_s: float) -> bool: ...

    def delete_if_heartbeat_unchanged(self, worker_id: str, heartbeat_counter: int) -> bool: ...


class ObservationKeeper(Protocol):
    """Where expiry observations outlive a leader (:class:`~worker_lib.tables.state_store.ExpiryObservationStore`)."""

    skew_s: float

    def save(self, entries: list[tuple[str, int, float]]) -> bool: ...

    def load(self) -> list[tuple[str, int, float]]: ...


class WorkerRowSweeper:
    """Deletes stale and stopped workers' items after a full run (never in a fast pass: it is housekeeping)."""

    def __init__(self, rows: WorkerRowCleaner) -> None:
        self._rows = rows
        self._last_stale_sweep: float | None = None

    def sweep_stale(self, workers: Sequence[WorkerMetricStats], now_wall: float, now_mono: float) -> None:
        """Items not updated for a day, checked at most once an hour of this leader's monotonic clock."""
        if self._last_stale_sweep is not None and now_mono - self._last_stale_sweep < 3600:
            return
        self._last_stale_sweep = now_mono
        for worker in workers:
            if now_wall - worker.last_update_epoch_s > STALE_WORKER_METRICS_S:
                try:
                    if self._rows.delete_if_unchanged(worker.worker_id, worker.last_update_epoch_s):
                        log.info("deleted stale worker metrics wid=%s", worker.worker_id)
                except DependencyError as exc:
                    log.warning("could not delete stale worker metrics wid=%s: %s", worker.worker_id, exc)

    def sweep_stopped(self, workers: Sequence[WorkerMetricStats], live: Sequence[Lease]) -> None:
        """Delete the items of workers that said STOPPED and own nothing any more (conditional on their heartbeat
        counter, so a restart under the same id keeps its item): every deploy with fresh worker ids would otherwise
        leave items behind for a day, and the leader reads them all every second."""
        owners = {lease.actual_owner for lease in live} | {lease.lease_owner for lease in live}
        for worker in workers:
            beat = worker.heartbeat
            if beat is None or beat.state is not WorkerState.STOPPED or worker.worker_id in owners:
                continue
            try:
                if self._rows.delete_if_heartbeat_unchanged(worker.worker_id, beat.counter):
                    log.info("deleted the item of stopped worker %s", worker.worker_id)
            except DependencyError as exc:
                log.warning("could not delete the item of stopped worker %s: %s", worker.worker_id, exc)


class KeptObservations:
    """The expiry observations of ``expiry`` (the assigner's tracker), kept in ``store`` for the next leader.

    Without a store every method does nothing: a leader that keeps nothing gives every owner a full failover time
    in each new term, which is safe, only slower to move a dead worker's leases."""

    def __init__(self, expiry: ExpiryTracker, store: ObservationKeeper | None, *, clock: Clock) -> None:
        self._expiry = expiry
        self._store = store
        self._clock = clock

    def restore(self) -> None:
        """At the start of a term: the previous leader's observations, dated and trusted up to the skew bound."""
        if self._store is None:
            return
        try:
            entries = self._store.load()
        except DependencyError as exc:
            log.warning("could not read the previous leader's expiry observations: %s", exc)
            return
        if entries:
            now_mono, now_wall = self._clock.monotonic(), self._clock.wall()
            self._expiry.restore(entries, now_mono, now_wall, self._store.skew_s)
            log.info("restored %d lease-expiry observations of the previous leader", len(entries))

    def keep(self, now_mono: float, now_wall: float) -> None:
        """After a full run; a failed save only costs the next leader a full failover time."""
        if self._store is None:
            return
        try:
            self._store.save(self._expiry.export(now_mono, now_wall))
        except DependencyError as exc:
            log.warning("could not keep the expiry observations: %s", exc)

    def forget(self, now_mono: float, now_wall: float) -> None:
        """Before completing a switch back to ``lease`` mode: every lease gets a full failover time from now."""
        self._expiry.reset()
        self.keep(now_mono, now_wall)


class Suspects:
    """Workers that let all their leases expire, with the metrics report (lut) seen then. Until they report again
    they are left out of the fleet: otherwise, once their leases have moved, a dead worker holds nothing and looks
    exactly like a worker that just joined for up to two report intervals."""

    def __init__(self, config: AssignmentConfig) -> None:
        self._config = config
        self._seen: dict[str, int] = {}

    def clear(self) -> None:
        """A new term judges every worker afresh."""
        self._seen.clear()

    def without_silent(
        self, workers: list[WorkerMetricStats], *, alive: frozenset[str] = frozenset()
    ) -> list[WorkerMetricStats]:
        """``workers`` less the suspects with no new report since; a report (or a live heartbeat) clears one."""
        kept = []
        for worker in workers:
            seen = self._seen.get(worker.worker_id)
            if seen is not None and worker.last_update_epoch_s <= seen and worker.worker_id not in alive:
                continue  # still no new report since it let its leases expire
            self._seen.pop(worker.worker_id, None)
            kept.append(worker)
        return kept

    def remember(self, snapshot: AssignmentSnapshot, workers: Sequence[WorkerMetricStats]) -> None:
        """The suspects of this run's snapshot (:func:`~worker_lib.assignment.state.suspect_workers`)."""
        assignable = [w.worker_id for w in snapshot.assignable_workers(self._config.worker_report_interval_s)]
        lut = {w.worker_id: w.last_update_epoch_s for w in workers}
        for worker_id in suspect_workers(snapshot, assignable):
            if worker_id not in self._seen:
                log.info("worker %s let all its leases expire: left out until it reports again", worker_id)
            self._seen[worker_id] = lut[worker_id]
