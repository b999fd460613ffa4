"""The leader's ``DesiredWorkers`` step (docs/autoscaling.md): after each full assignment run, the fleet size the
load needs (:func:`~worker_lib.scaling.desired.decide_desired`, pure), kept in ``<app>-CoordinatorState`` under
``DesiredWorkers`` — written only when the number changes, so a steady fleet costs nothing, and read back by a new
leader so that cool-downs survive a change of leader. The item also names the workers a shrinking fleet should
lose (the least loaded: ``remove``), for a scaler that can choose (``worker_lib.testing.scaler``) and for
``shardlease status``."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Lease, WorkerMetricStats
from worker_lib.scaling.config import ScalingConfig
from worker_lib.scaling.desired import DesiredWorkers, FleetLoad, decide_desired, removal_candidates
from worker_lib.tables.coordinator_items import DESIRED_WORKERS_KEY
from worker_lib.tables.state_store import CoordinatorStateStore

log = logging.getLogger(__name__)
CPU = "C"


def latest_utilization(worker: WorkerMetricStats) -> float | None:
    """The worker's latest CPU window as a percentage of its operating range; None if it reports none."""
    latest = worker.latest(CPU)
    if latest is None:
        return None
    ceiling = (worker.operating_range.get(CPU) or (100.0,))[0] or 100.0
    return 100.0 * latest / ceiling


class FleetSizer:
    def __init__(
        self,
        store: CoordinatorStateStore | None,
        config: ScalingConfig,
        *,
        max_throughput_per_host_kbps: float | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._max_tp = max_throughput_per_host_kbps
        self._previous: DesiredWorkers | None = None
        self._loaded = False
        self.remove: tuple[str, ...] = ()

    @property
    def draining(self) -> frozenset[str]:
        """The workers the assigner should give nothing (``drain_least_loaded``): the last full run's removal list."""
        return frozenset(self.remove) if self._config.drain_least_loaded else frozenset()

    def _load(self) -> None:
        if self._loaded or self._store is None:
            return
        item = self._store.get(DESIRED_WORKERS_KEY)
        self._previous = DesiredWorkers.from_attrs(item) if item else None
        if item and self._previous is None:
            log.warning("ignoring the %s item: not one of ours (%s)", DESIRED_WORKERS_KEY, sorted(item))
        self._loaded = True

    def size(
        self,
        *,
        workers: Sequence[WorkerMetricStats],
        leases: Sequence[Lease],
        max_lag_ms: int | None,
        now_epoch_s: float,
    ) -> DesiredWorkers:
        """The next decision from a full run's assignable workers and unfinished leases; stored if it changed."""
        self._load()
        utilization = {w.worker_id: latest_utilization(w) for w in workers}
        load = FleetLoad(
            workers=len(workers),
            leases=len(leases),
            utilization_pct=[u for u in utilization.values() if u is not None],
            throughput_kbps=sum(lease.throughput_kbps or 0.0 for lease in leases),
            max_throughput_per_host_kbps=self._max_tp,
            max_lag_ms=max_lag_ms,
            now_epoch_s=now_epoch_s,
        )
        decision = decide_desired(self._config, load, self._previous)
        # Least loaded by CPU; by the throughput of the leases it owns where a worker reports no CPU.
        throughput: dict[str, float] = {}
        for lease in leases:
            owner = lease.actual_owner
            if owner is not None:
                throughput[owner] = throughput.get(owner, 0.0) + (lease.throughput_kbps or 0.0)
        cpu_known = all(u is not None for u in utilization.values())
        loads = {w: (u if cpu_known and u is not None else throughput.get(w, 0.0)) for w, u in utilization.items()}
        remove = removal_candidates(loads, decision.desired)
        if decision.changed or remove != self.remove:
            log.info(
                "DesiredWorkers %d (was %s; %d workers now): %s%s",
                decision.desired,
                self._previous.desired if self._previous else "-",
                len(workers),
                decision.reason,
                f"; to remove: {', '.join(remove)}" if remove else "",
            )
            if self._store is not None:
                try:
                    self._store.put(DESIRED_WORKERS_KEY, {**decision.to_attrs(), "remove": list(remove)})
                except DependencyError as exc:  # kept in memory; the next change writes again
                    log.warning("could not store DesiredWorkers: %s", exc)
        self._previous, self.remove = decision, remove
        return decision
