"""How a simulated run is judged: imbalance ratios (max / min / p95 over mean), the LPT reference, bounds on the
minimum number of lease moves, and convergence. Pure functions of loads and cycle statistics."""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker_lib.tools.simulator.model import CycleStats


def _over_mean(values: Iterable[float], pick: Callable[[list[float]], float]) -> float:
    """``pick(sorted values)`` ÷ mean (1.0 for an empty or idle set)."""
    data = sorted(values)
    if not data:
        return 1.0
    mean = sum(data) / len(data)
    return pick(data) / mean if mean > 0 else 1.0


def max_over_mean(values: Iterable[float]) -> float:
    """max ÷ mean (1.0 for an empty or idle set)."""
    return _over_mean(values, lambda data: data[-1])


def min_over_mean(values: Iterable[float]) -> float:
    """min ÷ mean (1.0 for an empty or idle set)."""
    return _over_mean(values, lambda data: data[0])


def p95_over_mean(values: Iterable[float]) -> float:
    """95th percentile (nearest rank) ÷ mean (1.0 for an empty or idle set)."""
    return _over_mean(values, lambda data: data[max(1, math.ceil(0.95 * len(data))) - 1])


def lpt_loads(rates: Iterable[float], workers: int) -> list[float]:
    """The LPT reference: shards hottest first, each onto the least-loaded worker (knowing the true rates)."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    heap = [(0.0, i) for i in range(workers)]
    for rate in sorted(rates, reverse=True):
        load, i = heapq.heappop(heap)
        heapq.heappush(heap, (load + rate, i))
    return [load for load, _ in sorted(heap, key=lambda item: item[1])]


def min_moves_lower_bound(
    start: Mapping[str, Sequence[float]],
    *,
    max_load: float,
    min_load: float,
    forced: int = 0,
    pool: Sequence[float] | None = None,
) -> int:
    """A lower bound on the lease moves that take ``start`` to any assignment with every worker's load within
    ``[min_load, max_load]``.

    start: per worker that is live at the end, the rates of the leases it held at the starting point (joiners
      hold none).
    forced: leases that must move anyway (held at the start by workers that are dead at the end).
    pool: every rate that can move (default: all of ``start``'s); the under-loaded side may draw on the hottest.

    Over-loaded side: a worker above ``max_load`` must give away at least the fewest leases that bring it down —
    its largest first. Under-loaded side: a worker below ``min_load`` must receive at least the fewest leases that
    fill the gap — the hottest of the pool first. A move leaves one worker and reaches one, so the bound is
    ``max(forced + over-side, under-side)`` (the forced leases may fill gaps too, so they do not add to the
    under side).
    """
    every = sorted(pool if pool is not None else [r for rates in start.values() for r in rates], reverse=True)
    prefix = [0.0]
    for rate in every:
        prefix.append(prefix[-1] + rate)
    eps = 1e-9 * max(1.0, prefix[-1])
    over = 0
    under = 0
    for rates in start.values():
        load = sum(rates)
        if load > max_load + eps:
            excess = load - max_load - eps
            removed = 0.0
            for n, rate in enumerate(sorted(rates, reverse=True), start=1):
                removed += rate
                if removed >= excess:
                    over += n
                    break
        elif load < min_load - eps:
            gap = min_load - eps - load
            n = bisect.bisect_left(prefix, gap)
            under += min(n, len(every))
    return max(forced + over, under, forced)


def min_moves_upper_bound(
    start: Mapping[str, Sequence[float]],
    *,
    max_load: float,
    min_load: float,
    forced: Sequence[float] = (),
) -> int | None:
    """Moves of one feasible repair plan from ``start`` into ``[min_load, max_load]`` — an upper bound on the
    minimum (None if this greedy repair does not find one).

    forced: rates of leases that must be placed anyway (held by workers dead at the end): hottest first onto the
    least-loaded worker, one move each. Then, while a worker is outside the band, the worst one is repaired with
    one move: an over-loaded worker gives the smallest lease that ends its excess (else its largest) to the
    least-loaded worker that stays within ``max_load``; an under-loaded worker takes, from the most loaded worker
    that can spare it, the smallest lease that fills its gap (else the largest that fits).
    """
    held = {w: sorted(rates) for w, rates in start.items()}
    if not held:
        return None
    load = {w: sum(rates) for w, rates in held.items()}
    eps = 1e-9 * max(1.0, sum(load.values()) + sum(forced))
    moves = 0
    for rate in sorted(forced, reverse=True):
        target = min(load, key=lambda w: (load[w], w))
        bisect.insort(held[target], rate)
        load[target] += rate
        moves += 1

    def pick(rates: list[float], need: float, room: float) -> int | None:
        """Index of the smallest rate ≥ need that is ≤ room, else of the largest rate ≤ room."""
        i = bisect.bisect_left(rates, need - eps)
        if i < len(rates) and rates[i] <= room + eps:
            return i
        j = bisect.bisect_right(rates, room + eps) - 1
        return j if j >= 0 and rates[j] > 0 else None

    limit = 4 * sum(len(r) for r in held.values()) + 10
    for _ in range(limit):
        over = {w: load[w] - max_load for w in load if load[w] > max_load + eps}
        under = {w: min_load - load[w] for w in load if load[w] < min_load - eps}
        if not over and not under:
            return moves
        worst_over = max(over.values(), default=0.0)
        worst_under = max(under.values(), default=0.0)
        moved = False
        if worst_over >= worst_under:
            donor = max(over, key=lambda w: (over[w], w))
            for receiver in sorted(load, key=lambda w: (load[w], w)):
                if receiver == donor:
                    continue
                i = pick(held[donor], over[donor], max_load - load[receiver])
                if i is not None:
                    moved = _move(held, load, donor, receiver, i)
                    break
        else:
            receiver = max(under, key=lambda w: (under[w], w))
            for donor in sorted(load, key=lambda w: (-load[w], w)):
                if donor == receiver:
                    continue
                spare = min(load[donor] - min_load, max_load - load[receiver])
                i = pick(held[donor], under[receiver], spare)
                if i is not None:
                    moved = _move(held, load, donor, receiver, i)
                    break
        if not moved:
            return None
        moves += 1
    return None


def cycles_to_converge(
    cycles: Sequence[CycleStats], *, after: int, limit: float, floor: float = 0.0
) -> tuple[int | None, int | None]:
    """First cycle ``> after`` from which throughput max/mean stays ≤ ``limit`` (and min/mean ≥ ``floor``) to the
    end, and how many balancing runs happened in ``(after, that cycle]``. ``(None, None)`` if it never settles."""
    settled: int | None = None
    for stats in cycles:
        if stats.cycle <= after:
            continue
        if stats.tp_max_over_mean <= limit + 1e-12 and stats.tp_min_over_mean >= floor - 1e-12:
            if settled is None:
                settled = stats.cycle
        else:
            settled = None
    if settled is None:
        return None, None
    runs = sum(1 for s in cycles if after < s.cycle <= settled and s.balancing_ran)
    return settled, runs


def convergence_band(reference: Sequence[float], tolerance: float = 0.10) -> tuple[float, float]:
    """The ``(max/mean ceiling, min/mean floor)`` "within ±tolerance" means for a fleet whose LPT reference has
    these loads: ``1 ± tolerance`` where the reference achieves it, else relative to the reference's own
    max/mean and min/mean (a shard hotter than a fair share makes the raw band infeasible)."""
    ref_max, ref_min = max_over_mean(reference), min_over_mean(reference)
    ceiling = 1.0 + tolerance if ref_max <= 1.0 + tolerance else (1.0 + tolerance) * ref_max
    floor = 1.0 - tolerance if ref_min >= 1.0 - tolerance else (1.0 - tolerance) * ref_min
    return ceiling, floor


def _move(held: dict[str, list[float]], load: dict[str, float], donor: str, receiver: str, i: int) -> bool:
    """Move the ``i``-th rate ``donor`` holds to ``receiver`` (kept sorted), with both loads."""
    rate = held[donor].pop(i)
    bisect.insort(held[receiver], rate)
    load[donor] -= rate
    load[receiver] += rate
    return True
