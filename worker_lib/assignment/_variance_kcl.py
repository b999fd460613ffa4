"""KCL 3.x's variance decider exactly (``kcl_compatible``): receivers by spare capacity, donors from the metric with
the most to move, KCL's quirks included (the scenarios of docs/kcl-compatibility.md). Ours is
:class:`worker_lib.assignment.variance.OursVarianceRun`; both extend
:class:`worker_lib.assignment._variance_run.VarianceRun`.
"""

from __future__ import annotations

import math

from worker_lib.assignment._variance_run import VarianceRun
from worker_lib.core.models import Lease


class KCLVarianceRun(VarianceRun):
    """KCL 3.x exactly: receivers by spare capacity; donors from the metric with the most to move."""

    def capacity(self, worker: str) -> float:
        """KCL: min over metrics of (fleet avg − value) / value (1 when the value is 0); larger = more room."""
        best = math.inf
        for m, v in self.values[worker].items():
            ratio = 1.0 if v == 0 else (self.fleet_avg[m] - v) / v
            best = min(best, ratio)
        return best

    def priority(self, worker: str) -> tuple[float, ...]:
        return (-self.capacity(worker),)

    def donors_for(self, metric: str) -> dict[str, float]:
        """Workers to take from for ``metric`` and the throughput to take from each (empty: no trigger)."""
        avg = self.fleet_avg[metric]
        threshold = self.config.rebalance_threshold_pct / 100.0
        upper = avg * (1.0 + threshold)
        lower = avg * (1.0 - threshold)
        trigger = False
        donors: list[str] = []
        most: str | None = None
        for worker in self.worker_ids:
            values = self.values[worker]
            if metric not in values:
                continue
            v = values[metric]
            above_range = v > self.opr[worker].get(metric, math.inf)
            if v > upper or v < lower or above_range:
                trigger = True
            if v >= upper or above_range:
                donors.append(worker)
            if most is None or self.values[most][metric] < v:
                most = worker
        if not trigger:
            return {}
        if not donors and most is not None:
            donors.append(most)
        damp = self.config.dampening_pct / 100.0
        amounts: dict[str, float] = {}
        for worker in donors:
            v = self.values[worker][metric]
            share = (v - avg) / v if v != 0 else 0.0
            amounts[worker] = self.owner_tp.get(worker, 0.0) * share * damp
        return amounts

    def balance(self) -> None:
        best_metric: str | None = None
        best_total = -1.0
        best: dict[str, float] = {}
        for metric in self.fleet_avg:
            amounts = self.donors_for(metric)
            total = sum(amounts.values())
            if best_total < total:
                best_metric, best_total, best = metric, total, amounts
        if best_metric is None or not best:
            return
        self.acted_metric = best_metric
        order = sorted(best.items(), key=lambda item: (-item[1], item[0]))
        for donor, amount in order:
            self._balance_donor(donor, amount, best_metric)

    def _balance_donor(self, donor: str, amount: float, metric: str) -> None:
        existing = list(self.owner_leases.get(donor, {}).values())
        if not existing:
            return
        reason = self.balance_reason(donor, amount, metric)
        chosen: list[Lease]
        if self.owner_tp.get(donor, 0.0) == 0.0:
            chosen = [existing[0]]
        else:
            self.rng.shuffle(existing)
            chosen = []
            remaining = amount
            for lease in existing:
                tp = self.tp[lease.lease_key]
                if remaining - tp <= 0:
                    continue
                remaining -= tp
                chosen.append(lease)
            if not chosen and self.config.allow_throughput_overshoot:
                chosen = [min(existing, key=lambda lease: self.tp[lease.lease_key])]
        for lease in chosen:
            receiver = self.queue.pop()
            if receiver is not None and self.will_go_above(receiver, self.tp[lease.lease_key]):
                break  # KCL: the polled receiver is not put back for the rest of this run
            if receiver is None:
                continue
            if self.owner_of[lease.lease_key] == receiver:
                self.queue.push(receiver, self.priority(receiver))
                continue
            self.record(lease, receiver, "rebalance", reason, project_donor=False)
            self.push_if_eligible(receiver)
