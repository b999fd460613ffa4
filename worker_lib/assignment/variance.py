"""The variance decider: KCL 3.x's worker-utilisation-aware assignment, ours (default) and KCL-exact.

Both variants share :class:`worker_lib.assignment._variance_run.VarianceRun` (fleet averages, projections, the
receiver queue, the assignment phase). :class:`~worker_lib.assignment._variance_kcl.KCLVarianceRun` adds KCL's
receiver priority and balancing and reproduces KCL's decisions, quirks included (the scenarios of
docs/kcl-compatibility.md); :class:`OursVarianceRun`
overrides the hooks listed in that module and balances with a band over the live workers, filling the workers
below it (docs/assignment.md, "Where we differ"). ``config.kcl_compatible`` chooses between them.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from worker_lib.assignment._variance_kcl import KCLVarianceRun
from worker_lib.assignment._variance_run import VarianceRun
from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.plan import AssignmentPlan
from worker_lib.assignment.snapshot import THROUGHPUT_METRIC, AssignmentSnapshot
from worker_lib.assignment.state import fmt, let_expire, suspect_workers
from worker_lib.core.models import Lease

_FILL_TRIES = 16
"""Donors (most loaded first) tried per under-loaded receiver before giving up on it in one run."""


@dataclass(frozen=True, kw_only=True)
class _Band:
    """Ours: one metric's balancing band, computed without suspects and without workers that cannot give."""

    metric: str
    avg: float
    upper: float
    lower: float
    members: tuple[str, ...]
    pinned: frozenset[str]
    triggered: bool
    amounts: Mapping[str, float]
    """Over-band donors (≥ upper or above their operating range) → KBps to take (KCL's dampened formula)."""
    fill_kbps: float
    """Dampened KBps the workers below the band lack (what the fill phase may move)."""


class OursVarianceRun(VarianceRun):
    """Ours: band without stuck workers, over-band donors, then filling the workers below the band."""

    project_donor_on_assign = True
    """A reassigned lease leaves its old owner's projection too: the projection stays consistent."""

    # ---- hooks

    def find_suspects(self) -> frozenset[str]:
        # Workers that look dead (every lease expired) receive nothing and are left out of the band.
        return suspect_workers(self.snapshot, self.worker_ids)

    def increment(self, metric: str, throughput: float) -> float:
        if metric == THROUGHPUT_METRIC and self.target_avg_tp > 0:
            return 100.0 * throughput / self.target_avg_tp  # exact, by the synthetic metric's definition
        return super().increment(metric, throughput)

    def limit_avg(self, metric: str) -> float:
        """The band average (which leaves out workers that cannot give anything) once balancing computed it."""
        return self.band_avg.get(metric, self.fleet_avg[metric])

    def project_handoffs(self) -> None:
        # A lease in graceful handoff is already on its way to leaseOwner: project it there.
        for lease in self.snapshot.leases:
            if lease.checkpoint_owner is not None and lease.lease_owner in self.assignable:
                if lease.lease_key in self.snapshot.expired_lease_keys:
                    continue
                old = self.owner_of[lease.lease_key]
                if lease.lease_owner is not None and old != lease.lease_owner:
                    self.move(lease, lease.lease_owner, project_donor=True)

    def order_pending(self, pending: list[Lease]) -> list[Lease]:
        # LPT: hottest first (ties keep the oldest-first order) gives the greedy placement a better balance.
        pending.sort(key=lambda lease: -self.tp[lease.lease_key])
        return pending

    def receiver_for(self, lease: Lease, best: str) -> str | None:
        if best != let_expire(lease, self.snapshot):
            return best
        # Never hand an expired lease back to the worker that let it expire; take the next best. If nobody else can
        # take it, it stays where it is (no write).
        second = self.queue.pop()
        self.queue.push(best, self.priority(best))
        return second

    def utilisation(self, worker: str) -> float:
        """Max over metrics of value ÷ fleet average (lower = more room); consistent across metrics."""
        worst = 0.0
        for m, v in self.values[worker].items():
            avg = self.fleet_avg[m]
            worst = max(worst, v / avg if avg > 0 else v)
        return worst

    def priority(self, worker: str) -> tuple[float, ...]:
        # Ties on utilisation (an idle fleet: every value and the average 0, so assigning raises nothing) go to
        # the worker with the least projected throughput, then the fewest leases — never the same id forever.
        return (self.utilisation(worker), self.owner_tp.get(worker, 0.0), float(self.count(worker)))

    # ---- the band

    def per_kbps(self, metric: str) -> float:
        """How much one KBps raises ``metric`` (0 when no lease throughput is known)."""
        return self.increment(metric, 1.0) if self.target_avg_tp > 0 else 0.0

    def movable(self, worker: str) -> list[Lease]:
        """The leases ``worker`` may give in balancing — not in handoff, not decided earlier in this run."""
        return [
            lease
            for lease in self.owner_leases.get(worker, {}).values()
            if lease.checkpoint_owner is None and lease.lease_key not in self.decided
        ]

    def cannot_give(self, worker: str, value: float, lowest: float, per_kbps: float) -> bool:
        """Whether ``worker`` has nothing it may give for this metric: it holds a single lease (moving it only moves
        the problem), nothing movable, or its smallest movable lease would leave even the least loaded receiver
        (at ``lowest``) at or above the worker's own value — no move improves the pair."""
        if len(self.owner_leases.get(worker, {})) <= 1:
            return True
        movable = self.movable(worker)
        if not movable:
            return True
        if per_kbps <= 0:
            return False  # throughput unknown: one lease may still move (KCL's fallback)
        smallest = min(self.tp[lease.lease_key] for lease in movable)
        return lowest + per_kbps * smallest >= value

    def band(self, metric: str) -> _Band | None:
        """The balancing band for ``metric`` over the non-suspect workers, leaving out (iteratively) the workers
        above it that cannot give anything — e.g. one holding a single shard hotter than the band: they would
        trigger every run, and they pull the average up so that everyone else looks under-loaded."""
        threshold = self.config.rebalance_threshold_pct / 100.0
        candidates = [w for w in self.worker_ids if w not in self.suspects and metric in self.values[w]]
        if not candidates:
            return None
        k = self.per_kbps(metric)
        pinned: set[str] = set()
        while True:
            members = [w for w in candidates if w not in pinned]
            avg = sum(self.values[w][metric] for w in members) / len(members)
            # Never narrower than the absolute gap: at low utilisation 10 % of the average is noise.
            half_width = max(avg * threshold, self.config.rebalance_min_gap_pct)
            upper = avg + half_width
            lowest = min((self.values[w][metric] for w in members if self.eligible(w)), default=math.inf)
            newly = [
                w
                for w in members
                if (self.values[w][metric] > upper or self.values[w][metric] > self.opr[w].get(metric, math.inf))
                and self.cannot_give(w, self.values[w][metric], lowest, k)
            ]
            if not newly or len(newly) == len(members):
                break
            pinned.update(newly)
        lower = avg - half_width
        damp = self.config.dampening_pct / 100.0
        triggered = False
        amounts: dict[str, float] = {}
        deficit = 0.0
        for w in members:
            v = self.values[w][metric]
            above_range = v > self.opr[w].get(metric, math.inf)
            if v > upper or v < lower or above_range:
                triggered = True
            if v >= upper or above_range:
                share = max(0.0, (v - avg) / v) if v != 0 else 0.0
                amounts[w] = self.owner_tp.get(w, 0.0) * share * damp
            elif v < lower:
                deficit += avg - v
        fill_kbps = damp * deficit / k if k > 0 else 0.0
        return _Band(
            metric=metric,
            avg=avg,
            upper=upper,
            lower=lower,
            members=tuple(members),
            pinned=frozenset(pinned),
            triggered=triggered,
            amounts=amounts,
            fill_kbps=fill_kbps,
        )

    # ---- balancing

    def balance(self) -> None:
        bands = [b for metric in self.fleet_avg if (b := self.band(metric)) is not None]
        for b in bands:
            self.band_avg[b.metric] = b.avg
        chosen: _Band | None = None
        best_total = -1.0
        for b in bands:
            total = sum(b.amounts.values()) + b.fill_kbps
            if b.triggered and best_total < total:
                chosen, best_total = b, total
        if chosen is None:
            self._even_counts(bands)
            return
        metric = chosen.metric
        self.acted_metric = metric
        amounts = dict(chosen.amounts)
        if self.per_kbps(metric) <= 0 and not amounts:
            # No lease throughput known: KCL's fallback, one lease from the most loaded worker that can give.
            most = max(chosen.members, key=lambda w: (self.values[w][metric], w))
            amounts[most] = 0.0
        for donor, amount in sorted(amounts.items(), key=lambda item: (-item[1], item[0])):
            self._balance_donor(donor, amount, metric)
        if self.per_kbps(metric) > 0:
            # Workers still below the band (e.g. workers joined): KCL takes from the over-band donors or, if there
            # are none, from the single most loaded worker — one or two leases per run; ours fills them from every
            # worker above the average.
            self._fill(chosen)

    def _even_counts(self, bands: list[_Band]) -> None:
        """Every worker is inside every band, and each band is at its floor (± ``rebalance_min_gap_pct`` points: a
        lightly loaded fleet, where the metric is mostly each worker's fixed cost and cannot tell the workers
        apart): move one lease, the coolest, from the worker furthest above its share of the leases to the one
        furthest below it, when together they are more than one lease away from their shares and the move keeps
        both inside every band. A worker's share is the leases in proportion to its reported capacity (``cap``:
        cores, executor slots) when every worker reports one, else an equal share — so equal workers with equal
        traffic end within one lease of even and a worker with half the CPUs of another ends with about half its
        leases (one move per balancing run), instead of keeping whatever split they joined with. Each move lowers
        the sum of the distances to the shares, so the evening never cycles. A fleet whose metric discriminates is
        left to the bands."""
        threshold = self.config.rebalance_threshold_pct / 100.0
        if not bands or any(b.avg * threshold > self.config.rebalance_min_gap_pct for b in bands):
            return
        members = set(bands[0].members) - bands[0].pinned
        for b in bands[1:]:
            members &= set(b.members) - b.pinned
        workers = sorted(w for w in members if self.eligible(w) or self.count(w) > 0)
        if len(workers) < 2:
            return
        reported = {w: self.reported_capacity.get(w) for w in workers}
        weights: dict[str, float] = dict.fromkeys(workers, 1.0)
        if all(c is not None for c in reported.values()):
            weights = {w: float(c) for w, c in reported.items() if c is not None}
        total_weight = sum(weights.values())
        total = sum(self.count(w) for w in workers)
        surplus = {w: self.count(w) - total * weights[w] / total_weight for w in workers}

        def load(w: str) -> float:
            return max(self.values[w][b.metric] for b in bands)

        donor = max(workers, key=lambda w: (round(surplus[w], 9), load(w), w))
        receiver = min(
            (w for w in workers if self.eligible(w) and w != donor),
            key=lambda w: (round(surplus[w], 9), load(w), w),
            default=None,
        )
        if receiver is None:
            return
        above, below = surplus[donor], -surplus[receiver]
        if above <= 0 or below <= 0 or above + below <= 1:
            return
        movable = sorted(self.movable(donor), key=lambda lease: (self.tp[lease.lease_key], lease.lease_key))
        if not movable:
            return
        lease = movable[0]
        for b in bands:
            step = self.per_kbps(b.metric) * self.tp[lease.lease_key]
            if self.values[receiver][b.metric] + step > b.upper or self.values[donor][b.metric] - step < b.lower:
                return
        shares = (
            "" if len(set(weights.values())) == 1 else f" (shares by capacity {weights[donor]:g}/{weights[receiver]:g})"
        )
        reason = (
            f"rebalance: every worker inside its band at the floor (± {self.config.rebalance_min_gap_pct:g} points, "
            f"a lightly loaded fleet); evening lease counts{shares}, {donor} holds {self.count(donor)}, "
            f"{receiver} {self.count(receiver)}"
        )
        self.record(lease, receiver, "rebalance", reason, project_donor=True)
        self.push_if_eligible(receiver)
        self.push_if_eligible(donor)

    def _fill(self, band: _Band) -> None:
        """Bring each worker below the band a dampened share of its gap to the band average, taking from the
        workers above the average — always the most loaded one first (so each gives in proportion to its excess,
        water-filling from the top), the largest lease that fits both the receiver's remaining need and what the
        donor can spare without leaving the band: the fewest moves."""
        metric = band.metric
        k = self.per_kbps(metric)
        damp = self.config.dampening_pct / 100.0
        receivers = sorted(
            (w for w in band.members if self.values[w][metric] < band.lower),
            key=lambda w: (self.values[w][metric], w),
        )
        if not receivers:
            return
        heap = [(-self.values[w][metric], w) for w in band.members if self.values[w][metric] > band.avg]
        heapq.heapify(heap)
        stock: dict[str, tuple[list[Lease], list[float]]] = {}

        def leases_of(donor: str) -> tuple[list[Lease], list[float]]:
            if donor not in stock:
                movable = self.movable(donor)
                self.rng.shuffle(movable)  # equal throughputs: the seeded rng chooses
                movable.sort(key=lambda lease: self.tp[lease.lease_key])
                stock[donor] = (movable, [self.tp[lease.lease_key] for lease in movable])
            return stock[donor]

        for receiver in receivers:
            if not self.eligible(receiver):
                continue
            gap = band.avg - self.values[receiver][metric]
            need = min(damp * gap / k, self._headroom_tp(receiver))
            aside: list[tuple[float, str]] = []
            misses = 0
            while need > 0 and heap and misses < _FILL_TRIES:
                key, donor = heapq.heappop(heap)
                value = self.values[donor][metric]
                if -key != value:  # stale entry
                    if value > band.avg:
                        heapq.heappush(heap, (-value, donor))
                    continue
                movable, tps = leases_of(donor)
                spare = (value - band.lower) / k
                index = bisect.bisect_right(tps, min(need, spare)) - 1
                if index < 0:
                    aside.append((key, donor))
                    misses += 1
                    continue
                lease = movable.pop(index)
                tp = tps.pop(index)
                reason = (
                    f"rebalance: {receiver} {metric} {fmt(self.values[receiver][metric])} below the band "
                    f"{fmt(band.lower)}..{fmt(band.upper)} (avg {fmt(band.avg)}); filling "
                    f"{self.config.dampening_pct:g}% of its gap from the most loaded worker above the average, "
                    f"{donor} {metric} {fmt(value)}"
                )
                self.record(lease, receiver, "rebalance", reason, project_donor=True)
                need -= tp
                self.push_if_eligible(receiver)
                self.push_if_eligible(donor)
                if not self.eligible(receiver):
                    need = 0.0
                after = self.values[donor][metric]
                if after > band.avg and movable:
                    heapq.heappush(heap, (-after, donor))
            for item in aside:
                heapq.heappush(heap, item)

    def _headroom_tp(self, worker: str) -> float:
        """Throughput ``worker`` can take before any metric passes the fleet average or its operating range."""
        room = math.inf
        for m, v in self.values[worker].items():
            per_kbps = self.increment(m, 1.0) if self.target_avg_tp > 0 else 0.0
            limit = min(self.limit_avg(m), self.opr[worker].get(m, math.inf))
            if per_kbps > 0:
                room = min(room, (limit - v) / per_kbps)
            elif v > limit:
                room = 0.0
        return room

    def _balance_donor(self, donor: str, amount: float, metric: str) -> None:
        movable = self.movable(donor)
        if not movable:
            return
        reason = self.balance_reason(donor, amount, metric)
        if self.target_avg_tp <= 0 or self.owner_tp.get(donor, 0.0) <= 0:
            # Nothing is known about throughput: move one lease, as KCL does.
            receiver = self._best_receiver(exclude=donor)
            lease = movable[self.rng.randrange(len(movable))]
            if receiver is not None and not self.will_go_above(receiver, self.tp[lease.lease_key]):
                self.record(lease, receiver, "rebalance", reason, project_donor=True)
                self.push_if_eligible(receiver)
            self.push_if_eligible(donor)
            return
        self.rng.shuffle(movable)  # equal-throughput leases: which one moves is the seeded rng's choice
        movable.sort(key=lambda lease: self.tp[lease.lease_key])
        tps = [self.tp[lease.lease_key] for lease in movable]
        remaining = amount
        moved_any = False
        while movable and remaining > 0:
            receiver = self._best_receiver(exclude=donor)
            if receiver is None:
                break
            budget = min(remaining, self._headroom_tp(receiver))
            index = bisect.bisect_right(tps, budget) - 1
            if index < 0:
                if moved_any or not self.config.allow_throughput_overshoot:
                    break
                index = 0
                gain = self.increment(metric, tps[0])
                r_value = self.values[receiver].get(metric, 0.0)
                d_value = self.values[donor][metric]
                if r_value + gain >= d_value:
                    break  # overshooting would not even improve the pair
            lease = movable.pop(index)
            tps.pop(index)
            self.queue.discard(receiver)
            self.record(lease, receiver, "rebalance", reason, project_donor=True)
            remaining -= self.tp[lease.lease_key]
            moved_any = True
            self.push_if_eligible(receiver)
            if index == 0 and budget < self.tp[lease.lease_key]:
                break  # that was the one permitted overshoot
        self.push_if_eligible(donor)

    def _best_receiver(self, *, exclude: str) -> str | None:
        """The eligible worker with the most room, other than ``exclude`` (left in the queue)."""
        head = self.queue.pop()
        if head is None:
            return None
        if head != exclude:
            self.queue.push(head, self.priority(head))
            return head
        second = self.queue.peek()
        self.queue.push(head, self.priority(head))
        return second


class VarianceDecider:
    """KCL 3.x's variance-based decider; ``config.kcl_compatible`` (or ``kcl_compatible=``) for KCL's exact decisions.

    Per run: fleet average per metric (mean of each assignable worker's EMA of ``sts``); expired and unassigned
    leases go, oldest first, to the worker with the most spare capacity, whose projected metrics rise by
    ``lease throughput × fleet avg / target average throughput``; on balancing runs, the metric with the largest
    amount to move picks the donors (outside avg × (1 ± threshold) or above their operating range; else the
    single most loaded), each giving ``(v − avg) / v × dampening × its throughput``.

    Ours (default) also: breaks receiver ties by projected throughput then lease count (idle fleets); never hands
    an expired lease back to the worker that let it expire and gives suspects (every lease expired) nothing;
    centres the band on the live workers that can give, leaving out one holding a single too-hot shard; and fills
    workers below the band from every worker above the average (docs/assignment.md, "Where we differ").

    The dynamic cap, when configured, is a strict count cap here: a worker at the cap receives nothing, even if
    it is the least loaded. It is opt-in because balancing by load deliberately gives a worker with hot shards
    fewer leases and one with cold shards more — see docs/assignment.md, "The dynamic cap".
    """

    def __init__(self, config: AssignmentConfig | None = None, *, kcl_compatible: bool | None = None) -> None:
        config = config or AssignmentConfig()
        if kcl_compatible is not None and kcl_compatible != config.kcl_compatible:
            config = replace(config, kcl_compatible=kcl_compatible)
        self.config = config

    def decide(self, snapshot: AssignmentSnapshot, *, rng: random.Random) -> AssignmentPlan:
        run_type = KCLVarianceRun if self.config.kcl_compatible else OursVarianceRun
        run = run_type(self.config, snapshot, rng)
        run.start()
        unassigned = run.assign_pending()
        balancing = snapshot.is_balancing_run(self.config.balancing_frequency)
        if balancing and run.worker_ids:
            run.balance()
        return run.plan(balancing_ran=balancing, unassigned=unassigned)
