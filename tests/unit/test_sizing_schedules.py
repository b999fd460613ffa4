"""``DesiredWorkers`` (worker_lib/scaling/desired.py, docs/autoscaling.md) on thousands of seeded random settings,
loads and histories (issue 36): the signal stays within its bounds, grows with the load, changes only after its
cool-downs, never shrinks while a lag is above the threshold, and does not flap under noise inside its hysteresis.

Time is the leader's wall clock, passed in (``now_epoch_s``): the rule has no clock of its own. The fleet follows the
signal after a random delay, as a scaler does.
"""

from __future__ import annotations

import math
import random
from itertools import pairwise

from worker_lib.scaling.config import ScalingConfig
from worker_lib.scaling.desired import DesiredWorkers, FleetLoad, decide_desired, removal_candidates

SCHEDULES = 2_000
FLEETS = 800
CYCLES = 40
CYCLE_S = 20.0  # the leader's full cycle


def random_config(rng: random.Random) -> ScalingConfig:
    target = rng.choice((70.0, rng.uniform(20.0, 100.0)))
    headroom = rng.choice((15.0, rng.uniform(0.0, 50.0)))
    sizing = target * (1 - headroom / 100)
    low = rng.randint(1, 4)
    return ScalingConfig(
        target_utilization_pct=target,
        headroom_pct=headroom,
        scale_in_band_pct=rng.choice((5.0, rng.uniform(0.0, sizing * 0.9))),
        scale_in_cooldown_s=rng.choice((600, rng.randint(0, 900))),
        scale_out_cooldown_s=rng.choice((180, rng.randint(0, 400))),
        lag_threshold_ms=rng.choice((60_000, rng.randint(1, 120_000))),
        lag_step_pct=rng.choice((25.0, rng.uniform(1.0, 100.0))),
        min_workers=low,
        max_workers=rng.choice((None, rng.randint(low, 40))),
    )


def random_load(rng: random.Random, *, now: float) -> FleetLoad:
    workers = rng.randint(0, 30)
    reporting = rng.choice((workers, workers, rng.randint(0, workers)))
    return FleetLoad(
        workers=workers,
        leases=rng.randint(0, 60),
        utilization_pct=[rng.uniform(0.0, 120.0) for _ in range(reporting)],
        throughput_kbps=rng.uniform(0.0, 50_000.0),
        max_throughput_per_host_kbps=rng.choice((None, rng.uniform(100.0, 5_000.0))),
        max_lag_ms=rng.choice((None, rng.randint(0, 200_000))),
        now_epoch_s=now,
    )


def random_previous(rng: random.Random, *, now: float) -> DesiredWorkers | None:
    if rng.random() < 0.2:
        return None
    return DesiredWorkers(
        desired=rng.randint(1, 50),
        reason="",
        basis="cpu",
        demand=0.0,
        changed_at_epoch_s=now - rng.choice((0.0, rng.uniform(0.0, 1_500.0))),
        lag_ms=rng.choice((None, rng.randint(0, 200_000))),
    )


def bounds(config: ScalingConfig, load: FleetLoad) -> tuple[int, int]:
    """docs/autoscaling.md, rule 6: at least min_workers, at most max_workers, never more than the leases."""
    upper = max(1, load.leases) if config.max_workers is None else min(max(1, load.leases), config.max_workers)
    return min(config.min_workers, upper), upper


def test_the_signal_stays_within_its_bounds_and_never_falls_as_the_load_rises() -> None:
    # GIVEN 2 000 seeded random settings, previous decisions and loads (CPU, throughput or no signal; lag or none)
    problems: list[str] = []
    for seed in range(SCHEDULES):
        rng = random.Random(seed)
        config, now = random_config(rng), 1_700_000_000.0
        load, previous = random_load(rng, now=now), random_previous(rng, now=now)
        # WHEN the same cycle sees a heavier load: every worker's CPU, or the leases' throughput, raised
        heavier = FleetLoad(
            workers=load.workers,
            leases=load.leases,
            utilization_pct=[u + rng.choice((0.0, rng.uniform(0.0, 80.0))) for u in load.utilization_pct],
            throughput_kbps=load.throughput_kbps * rng.uniform(1.0, 3.0),
            max_throughput_per_host_kbps=load.max_throughput_per_host_kbps,
            max_lag_ms=load.max_lag_ms,
            now_epoch_s=now,
        )
        decision, more = decide_desired(config, load, previous), decide_desired(config, heavier, previous)
        # THEN each decision is within min_workers..max_workers and the lease count, and the heavier asks no fewer
        lower, upper = bounds(config, load)
        if not lower <= decision.desired <= upper or not lower <= more.desired <= upper:
            problems.append(f"seed {seed}: {decision.desired} or {more.desired} outside {lower}..{upper}")
        if more.desired < decision.desired:
            problems.append(f"seed {seed}: a heavier load asks {more.desired} < {decision.desired}")
        # AND the workers named to remove are the excess, and none is busier than one that stays
        loads = {f"w{i}": rng.choice((0.0, 10.0, rng.uniform(0.0, 100.0))) for i in range(load.workers)}
        remove = removal_candidates(loads, decision.desired)
        kept = [loads[w] for w in loads if w not in remove]
        if len(remove) != max(0, len(loads) - decision.desired) or (
            remove and max(loads[w] for w in remove) > min(kept, default=math.inf)
        ):
            problems.append(f"seed {seed}: removing {remove} of {loads} for {decision.desired}")
    assert problems == []


def fleet_history(seed: int, *, noise: float, lag: bool) -> tuple[ScalingConfig, list[tuple[float, int, int | None]]]:
    """A fleet run by the signal for ``CYCLES`` cycles: (time, desired, lag) after each decision. The load is a true
    demand (in workers' worth) that stays put (``noise`` only: each cycle measures it off by up to ± that fraction)
    or, with ``lag``, wanders, with a lag that comes and goes."""
    rng = random.Random(seed)
    config = random_config(rng)
    leases = rng.randint(1, 60)
    demand = rng.uniform(0.05, 40.0)
    by_cpu = rng.random() < 0.7
    host_kbps = 1_000.0
    now = 1_700_000_000.0
    workers = rng.randint(0, 30)
    previous: DesiredWorkers | None = None
    pending: list[tuple[float, int]] = []  # (when, size): the scaler's changes still under way
    history: list[tuple[float, int, int | None]] = []
    lag_ms: int | None = None
    for _ in range(CYCLES):
        if lag:
            demand = max(0.05, demand * rng.uniform(0.7, 1.4))
            lag_ms = rng.choice((None, 0, rng.randint(0, 2 * config.lag_threshold_ms)))
        measured = demand * (1 + rng.uniform(-noise, noise))
        if by_cpu and workers:
            reporting = rng.randint((workers + 1) // 2, workers)
            per = measured * 100 / max(workers, reporting)
            spread = [rng.uniform(-1.0, 1.0) for _ in range(reporting)]
            mean_spread = sum(spread) / reporting
            utilization = [per * (1 + 0.2 * (s - mean_spread)) for s in spread]  # uneven, same mean
            load = FleetLoad(
                workers=workers, leases=leases, utilization_pct=utilization, max_lag_ms=lag_ms, now_epoch_s=now
            )
        else:
            load = FleetLoad(
                workers=workers,
                leases=leases,
                throughput_kbps=measured * host_kbps,
                max_throughput_per_host_kbps=host_kbps,
                max_lag_ms=lag_ms,
                now_epoch_s=now,
            )
        previous = decide_desired(config, load, previous)
        history.append((now, previous.desired, lag_ms))
        pending.append((now + rng.uniform(0.0, 300.0), previous.desired))
        workers = max([size for when, size in pending if when <= now + CYCLE_S] or [workers])
        pending = [(when, size) for when, size in pending if when > now + CYCLE_S]
        now += CYCLE_S * rng.uniform(0.5, 1.5) if rng.random() < 0.95 else rng.uniform(0.0, 2_000.0)
    return config, history


def test_noise_inside_the_hysteresis_never_makes_the_signal_flap() -> None:
    # GIVEN 800 seeded fleets whose true demand stays put, measured each cycle with noise up to ± η, where
    # η = band / (2 × sizing point − band): inside it, the most the noise can ask for still fits the band of the least
    problems: list[str] = []
    for seed in range(FLEETS):
        probe = random_config(random.Random(seed))
        sizing, band = probe.sizing_point_pct, probe.scale_in_band_pct
        eta = band / (2 * sizing - band) * random.Random(seed).choice((1.0, 0.999, 0.5))
        # WHEN the leader decides every cycle for 40 cycles, the fleet following after a delay
        _, history = fleet_history(seed, noise=eta, lag=False)
        # THEN once it has moved in one direction, it never moves in the other
        changes = [b - a for (_, a, _), (_, b, _) in pairwise(history) if b != a]
        if any(x * y < 0 for x, y in pairwise(changes)):
            problems.append(f"seed {seed}: η={eta:.4f}, the signal went {changes}")
    assert problems == []


def test_changes_wait_for_their_cool_downs_and_a_lag_above_the_threshold_never_shrinks_the_fleet() -> None:
    # GIVEN 800 seeded fleets whose demand wanders and whose lag comes and goes
    problems: list[str] = []
    for seed in range(FLEETS):
        config, history = fleet_history(seed, noise=0.3, lag=True)
        # WHEN the leader decides every cycle for 40 cycles
        last_change = history[0][0]  # a first decision starts the cool-downs
        for (_, before, _), (now, after, lag_ms) in pairwise(history):
            if after == before:
                continue
            # THEN a scale-out comes a scale-out cool-down after the last change at the earliest, a scale-in a
            # scale-in cool-down after it, and never while the lag is above the threshold
            wait = config.scale_out_cooldown_s if after > before else config.scale_in_cooldown_s
            if now - last_change < wait:
                problems.append(f"seed {seed}: {before} → {after} {now - last_change:.0f} s after the last change")
            if after < before and lag_ms is not None and lag_ms > config.lag_threshold_ms:
                problems.append(f"seed {seed}: {before} → {after} with a lag of {lag_ms} ms")
            last_change = now
    assert problems == []
