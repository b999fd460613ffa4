"""Deciders: KCL 3.x's test scenarios (kcl_compatible), CPU 70 / 40 with threshold 10, 500 shards over
100 + 100 workers and the dynamic cap (docs/assignment.md), our refinements, config, expiry.

Scenarios follow KCL's Java tests (docs/kcl-compatibility.md, "Scenarios"): a "yield" worker at CPU [90, 90] and a
"take" worker at [50, 50], both with operating range 80; owned leases carry 10 KBps; dampening 80 and balancing on
every run (the Java tests' settings), unless a test says otherwise.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Iterable

import pytest

from tests.support.assignment import NOW, snap
from worker_lib.assignment.config import AssignmentConfig, effective_cap
from worker_lib.assignment.count import CountDecider, spread_quotas
from worker_lib.assignment.deciders import make_decider
from worker_lib.assignment.plan import AssignmentPlan, Decider, apply_plan
from worker_lib.assignment.snapshot import (
    NEVER,
    AssignmentSnapshot,
    ExpiryTracker,
    ema,
    is_active_worker,
    is_assignable_worker,
    is_excluded_worker,
    is_valid_worker,
)
from worker_lib.assignment.variance import VarianceDecider
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import Lease, WorkerMetricStats
from worker_lib.leader.config import LeaderConfig
from worker_lib.leases.config import LeaseConfig
from worker_lib.tools.kcl2_baseline import KCL2StealingDecider

YIELD, TAKE = "workerIdYield", "workerIdTake"


# ----------------------------------------------------------------------------------------------- helpers


def cpu_worker(wid: str, *values: float, opr: float = 80, lut: float = NOW) -> WorkerMetricStats:
    return WorkerMetricStats(
        worker_id=wid, last_update_epoch_s=int(lut), stats={"C": tuple(values)}, operating_range={"C": (opr,)}
    )


def default_worker(wid: str, lut: float = NOW) -> WorkerMetricStats:
    return WorkerMetricStats(worker_id=wid, last_update_epoch_s=int(lut))


def yield_worker(wid: str = YIELD) -> WorkerMetricStats:
    return cpu_worker(wid, 90, 90)


def take_worker(wid: str = TAKE) -> WorkerMetricStats:
    return cpu_worker(wid, 50, 50)


def owned(key: str, owner: str, tp: float | None = 10.0, counter: int = 123) -> Lease:
    return Lease(lease_key=key, lease_owner=owner, lease_counter=counter, throughput_kbps=tp)


def unassigned(key: str) -> Lease:
    return Lease(lease_key=key)


def kcl(**overrides: object) -> VarianceDecider:
    """KCL 3.x's decider with the Java tests' settings (dampening 80, balancing every run, threshold 20)."""
    values: dict[str, object] = {
        "kcl_compatible": True,
        "dampening_pct": 80,
        "balancing_frequency": 1,
        "rebalance_threshold_pct": 20,
    }
    values.update(overrides)
    return VarianceDecider(AssignmentConfig(**values))  # type: ignore[arg-type]


def decide(decider: Decider, snapshot: AssignmentSnapshot, seed: int = 7) -> AssignmentPlan:
    return decider.decide(snapshot, rng=random.Random(seed))


def owners(leases: Iterable[Lease]) -> Counter[str | None]:
    return Counter(lease.lease_owner for lease in leases)


def run_and_apply(decider: Decider, snapshot: AssignmentSnapshot, seed: int = 7) -> tuple[Lease, ...]:
    return apply_plan(snapshot.leases, decide(decider, snapshot, seed))


# ----------------------------------------------------------------------------------------------- KCL scenarios


def test_scenario_1_one_unassigned_lease_goes_to_the_take_worker() -> None:
    # GIVEN a yield worker at 90 % and a take worker at 50 %, and one unassigned lease
    s = snap([unassigned("something")], [yield_worker(), take_worker()])
    # WHEN the KCL-compatible decider runs
    plan = decide(kcl(), s)
    # THEN the lease is assigned to the take worker
    assert [(d.lease_key, d.to_worker, d.kind) for d in plan.decisions] == [("something", TAKE, "assign")]


def test_scenario_2_worker_whose_metric_ends_in_minus_one_gets_nothing() -> None:
    # GIVEN the only worker's CPU list ends in −1, and two unassigned leases
    failing = cpu_worker("failing", 50, -1)
    s = snap([unassigned("l1"), unassigned("l2")], [failing])
    # WHEN deciding
    plan = decide(kcl(), s)
    # THEN nothing is assigned and both leases are reported unassigned
    assert plan.decisions == ()
    assert set(plan.unassigned_lease_keys) == {"l1", "l2"}


def test_scenario_2b_a_past_minus_one_does_not_exclude() -> None:
    # GIVEN the worker's CPU list is [−1, 50, 50] (it recovered)
    recovered = cpu_worker("recovered", -1, 50, 50)
    s = snap([unassigned("l1"), unassigned("l2")], [recovered])
    # WHEN deciding
    plan = decide(kcl(), s)
    # THEN it gets both leases, and the −1 is skipped by the EMA
    assert sorted((d.lease_key, d.to_worker) for d in plan.decisions) == [("l1", "recovered"), ("l2", "recovered")]
    assert ema([-1, 50, 50], 0.5) == 50.0


def test_scenario_3_max_leases_for_worker_caps_assignment() -> None:
    # GIVEN maxLeasesForWorker 2, one worker and three unassigned leases
    s = snap([unassigned("lease1"), unassigned("lease2"), unassigned("lease3")], [take_worker()])
    # WHEN deciding
    plan = decide(kcl(max_leases_for_worker=2), s)
    # THEN exactly two are assigned; the third waits
    assert len(plan.decisions) == 2
    assert plan.unassigned_lease_keys == ("lease3",)
    assert plan.effective_cap == 2


def test_scenario_4_worker_above_operating_range_gives_its_small_lease() -> None:
    # GIVEN Worker1 at 41 %, Worker2 at 59 %, both with operating range 50 and threshold 20;
    # Worker2 holds a 1000 KBps and a 1 KBps lease
    s = snap(
        [owned("lease1", "Worker2", 1000), owned("lease2", "Worker2", 1)],
        [cpu_worker("Worker1", 41, 41, opr=50), cpu_worker("Worker2", 59, 59, opr=50)],
    )
    # WHEN deciding (59 is inside avg 50 × 1.2, but above its range 50)
    plan = decide(kcl(rebalance_threshold_pct=20), s)
    # THEN the 1 KBps lease moves to Worker1 as a rebalance
    assert [(d.lease_key, d.from_worker, d.to_worker, d.kind) for d in plan.decisions] == [
        ("lease2", "Worker2", "Worker1", "rebalance")
    ]


def test_scenario_5_inactive_worker_gets_nothing() -> None:
    # GIVEN an inactive worker (lut 0, idle) and the yield worker; two unassigned leases; maxThroughput 9
    inactive = cpu_worker("InActiveWorker", 0, 0, lut=0)
    s = snap([unassigned("leaseKey1"), unassigned("leaseKey2")], [yield_worker(), inactive])
    # WHEN deciding
    plan = decide(kcl(max_throughput_per_host_kbps=9), s)
    # THEN both go to the yield worker
    assert {d.to_worker for d in plan.decisions} == {YIELD}
    assert len(plan.decisions) == 2


@pytest.mark.parametrize("seed", range(5))
def test_scenario_6_the_100_kbps_lease_moves(seed: int) -> None:
    # GIVEN the yield worker holds 100/200/300/400 KBps, take holds nothing, threshold 10
    leases = [owned(f"lease{i}", YIELD, tp) for i, tp in enumerate((100, 200, 300, 400), start=1)]
    s = snap(leases, [yield_worker(), take_worker()])
    # WHEN deciding, whatever the shuffle
    plan = decide(kcl(rebalance_threshold_pct=10), s, seed)
    # THEN exactly the 100 KBps lease moves to take
    assert [(d.lease_key, d.to_worker) for d in plan.decisions] == [("lease1", TAKE)]


@pytest.mark.parametrize("seed", range(5))
def test_scenario_7_overshoot_takes_the_smallest_lease_only_when_allowed(seed: int) -> None:
    # GIVEN yield holds 300/299/301 KBps (each ≈ 30 % CPU), take holds one 3000 KBps lease
    leases = [
        owned("lease1", YIELD, 300),
        owned("lease2", YIELD, 299),
        owned("lease3", YIELD, 301),
        owned("lease4", TAKE, 3000),
    ]
    s = snap(leases, [yield_worker(), take_worker()])
    # WHEN overshoot is not allowed THEN nothing moves
    assert decide(kcl(rebalance_threshold_pct=10, allow_throughput_overshoot=False), s, seed).decisions == ()
    # WHEN it is allowed THEN the smallest (299) moves to take, which ends with lease2 and lease4
    after = run_and_apply(kcl(rebalance_threshold_pct=10), s, seed)
    assert sorted(lease.lease_key for lease in after if lease.lease_owner == TAKE) == ["lease2", "lease4"]


def _scenario_8_leases() -> list[Lease]:
    return [
        owned("lease1", YIELD + "1"),
        owned("lease2", YIELD + "1", 1000),
        owned("lease3", YIELD + "2"),
        owned("lease4", YIELD + "2", 1000),
        owned("lease5", TAKE),
    ]


def _scenario_8_workers() -> list[WorkerMetricStats]:
    return [yield_worker(YIELD + "1"), yield_worker(YIELD + "2"), take_worker()]


@pytest.mark.parametrize("seed", range(5))
def test_scenario_8_each_yield_worker_gives_its_10_kbps_lease(seed: int) -> None:
    # GIVEN two yield workers each holding 10 and 1000 KBps, take holding 10 KBps
    s = snap(_scenario_8_leases(), _scenario_8_workers())
    # WHEN deciding with threshold 10
    after = run_and_apply(kcl(rebalance_threshold_pct=10), s, seed)
    # THEN take ends with 3 leases and each yield worker keeps one
    counts = owners(after)
    assert counts[TAKE] == 3
    assert counts[YIELD + "1"] == 1
    assert counts[YIELD + "2"] == 1
    assert {lease.lease_key for lease in after if lease.lease_owner == TAKE} == {"lease1", "lease3", "lease5"}


def test_scenario_9_balancing_frequency_3_balances_on_runs_1_and_4_only() -> None:
    # GIVEN scenario 8's fleet, reset before each run, and balancing frequency 3
    decider = kcl(rebalance_threshold_pct=10, balancing_frequency=3)
    taken = []
    for run in range(1, 6):
        s = snap(_scenario_8_leases(), _scenario_8_workers(), run=run)
        # WHEN each run decides
        plan = decide(decider, s)
        taken.append(owners(apply_plan(s.leases, plan))[TAKE])
        assert plan.balancing_ran == (run in (1, 4))
    # THEN take ends with 3 on runs 1 and 4 and keeps its 1 otherwise
    assert taken == [3, 1, 1, 3, 1]


def test_scenario_10_expiry_by_counter_observation_across_leader_runs() -> None:
    # GIVEN a take worker, an unassigned lease and a lease owned by "someOwner"; failover 1 s
    tracker = ExpiryTracker(failover_s=1.0)
    leases: tuple[Lease, ...] = (unassigned("unAssignedLease"), owned("lease-1", "someOwner"))
    decider = kcl()
    # WHEN run 1 happens while not leader THEN nothing is observed or decided (the loop skips the decider)
    assert len(tracker) == 0
    # WHEN run 2 is the first as leader (t = 0.11 s)
    expired = tracker.observe(leases, 0.110)
    s = snap(leases, [take_worker()], expired=expired, last_increments=tracker.last_increments(), run=1)
    plan = decide(decider, s)
    # THEN only the unassigned lease is assigned; the owned one is on its first sight, not expired
    assert expired == {"unAssignedLease"}
    assert [(d.lease_key, d.to_worker, d.kind) for d in plan.decisions] == [("unAssignedLease", TAKE, "assign")]
    leases = apply_plan(leases, plan)
    # WHEN run 3 observes again after more than the failover time, lease-1's counter unchanged
    expired = tracker.observe(leases, 1.5)
    s = snap(leases, [take_worker()], expired=expired, last_increments=tracker.last_increments(), run=2)
    plan = decide(decider, s)
    # THEN lease-1 is expired and reassigned to take; the assigned lease (counter grew) is not expired
    assert expired == {"lease-1"}
    assert [(d.lease_key, d.from_worker, d.to_worker, d.kind) for d in plan.decisions] == [
        ("lease-1", "someOwner", TAKE, "reassign_expired")
    ]


def test_scenario_10b_unassigned_lease_is_assigned_before_expired_and_throughput_limit_holds() -> None:
    # GIVEN (KCL test) an expired lease first seen earlier and a new unassigned one; maxThroughput 9 KBps
    tracker = ExpiryTracker(failover_s=0.001)
    tracker.observe([owned("expiredLease", "random-owner")], 0.100)
    leases = (owned("expiredLease", "random-owner"), unassigned("unAssignedLease"))
    expired = tracker.observe(leases, 0.110)
    s = snap(leases, [take_worker()], expired=expired, last_increments=tracker.last_increments())
    # WHEN deciding
    plan = decide(kcl(max_throughput_per_host_kbps=9), s)
    # THEN the unassigned lease goes first; take is then over 9 KBps and gets no more
    assert expired == {"expiredLease", "unAssignedLease"}
    assert [d.lease_key for d in plan.decisions] == ["unAssignedLease"]
    assert plan.unassigned_lease_keys == ("expiredLease",)


@pytest.mark.parametrize("seed", range(5))
def test_scenario_11_take_ends_with_four(seed: int) -> None:
    # GIVEN yield holds 1000 KBps and seven 10 KBps leases, and one lease is unassigned
    leases = [owned("leaseY1", YIELD, 1000), unassigned("leaseT1")]
    leases += [owned(f"leaseY{i}", YIELD) for i in (2, 3, 5, 6, 7, 8, 9)]
    s = snap(leases, [yield_worker(), take_worker()])
    # WHEN deciding with threshold 10
    after = run_and_apply(kcl(rebalance_threshold_pct=10), s, seed)
    # THEN take ends with 4 leases (the unassigned one and three moved until it would pass the average)
    assert owners(after)[TAKE] == 4


def test_scenario_12_hot_worker_above_range_gives_one_of_six() -> None:
    # GIVEN a hot worker at 90 % (range 50) holding six 10 KBps leases, take at 40 %
    hot = cpu_worker("randomWorkerId", 90, 90, opr=50)
    s = snap([owned(f"leaseKey{i}", "randomWorkerId") for i in range(1, 7)], [hot, cpu_worker(TAKE, 40, 40)])
    # WHEN deciding with threshold 20
    after = run_and_apply(kcl(rebalance_threshold_pct=20), s)
    # THEN the split is 5 / 1
    assert owners(after) == Counter({"randomWorkerId": 5, TAKE: 1})


def test_scenario_13_zero_throughput_leases_move_one_at_a_time() -> None:
    # GIVEN yield holds ten leases with 0 KBps
    s = snap([owned(f"lease{i}", YIELD, 0.0) for i in range(10)], [yield_worker(), take_worker()])
    # WHEN deciding
    after = run_and_apply(kcl(), s)
    # THEN exactly one moves
    assert owners(after) == Counter({YIELD: 9, TAKE: 1})


def test_scenario_15_a_lease_in_handoff_is_not_moved_again() -> None:
    # GIVEN yield holds 5 and 30 KBps leases; graceful handoff enabled
    decider = kcl()
    s1 = snap([owned("lease1", YIELD, 5), owned("lease2", YIELD, 30)], [yield_worker(), take_worker()])
    # WHEN run 1 decides and the leader starts graceful handoffs
    plan1 = decide(decider, s1)
    after1 = apply_plan(s1.leases, plan1, graceful=True)
    # THEN one lease is in handoff: checkpointOwner = yield, leaseOwner = take
    in_handoff = [lease for lease in after1 if lease.checkpoint_owner == YIELD]
    assert [(lease.lease_key, lease.lease_owner) for lease in in_handoff] == [("lease1", TAKE)]
    # WHEN run 2 sees the same metrics
    plan2 = decide(decider, snap(after1, [yield_worker(), take_worker()], run=2))
    # THEN nothing changes (the only candidate is the lease already in handoff)
    assert plan2.decisions == ()


def test_scenario_15b_expired_handoff_lease_is_reassigned_even_to_its_checkpoint_owner() -> None:
    # GIVEN a lease stuck in handoff (leaseOwner gone, checkpointOwner = take) and only take is alive
    lease = Lease(lease_key="stuck", lease_owner="gone", checkpoint_owner=TAKE, lease_counter=5, throughput_kbps=1.0)
    s = snap([lease], [take_worker()], expired=["stuck"])
    # WHEN deciding
    plan = decide(kcl(), s)
    # THEN it is reassigned to take with assignLease (clearing the checkpoint owner)
    assert [(d.lease_key, d.to_worker, d.kind) for d in plan.decisions] == [("stuck", TAKE, "reassign_expired")]
    assert apply_plan(s.leases, plan)[0].checkpoint_owner is None


def test_scenario_16_default_metric_worker_receives_all_three() -> None:
    # GIVEN a default-metric worker and a CPU worker at 50 % holding one lease; three unassigned leases
    s = snap(
        [unassigned("lease1"), unassigned("lease2"), unassigned("lease3"), owned("lease6", "worker2")],
        [default_worker("worker1"), cpu_worker("worker2", 50, 50)],
    )
    # WHEN deciding
    after = run_and_apply(kcl(), s)
    # THEN the default-metric worker gets all three
    assert owners(after) == Counter({"worker1": 3, "worker2": 1})


def test_default_metric_and_cpu_workers_at_target_keep_their_leases() -> None:
    # GIVEN (KCL test) a default-metric worker with 100 + 200 KBps and a CPU worker at 50 % with 300 + 400
    s = snap(
        [owned("l1", "w1", 100), owned("l2", "w1", 200), owned("l3", "w2", 300), owned("l4", "w2", 400)],
        [default_worker("w1"), cpu_worker("w2", 50, 50)],
    )
    # WHEN deciding THEN nothing moves (each metric is alone in its fleet)
    assert decide(kcl(), s).decisions == ()


def test_yield_worker_with_a_single_lease_gives_it() -> None:
    # GIVEN (KCL test) yield holds one 5 KBps lease, take one 30 KBps lease
    s = snap([owned("lease1", YIELD, 5), owned("lease2", TAKE, 30)], [yield_worker(), take_worker()])
    # WHEN deciding THEN take ends with both
    assert owners(run_and_apply(kcl(), s)) == Counter({TAKE: 2})


# ----------------------------------------------------------------------------------------------- CPU 70 / 40


def test_seed_000_cpu_70_and_40_threshold_10_triggers_rebalance() -> None:
    # GIVEN worker A at 70 % and B at 40 %, threshold 10 → average 55, limits 60.5 / 49.5
    a, b = cpu_worker("A", 70, 70, opr=100), cpu_worker("B", 40, 40, opr=100)
    leases = [owned(f"a{i}", "A", 10) for i in range(7)] + [owned(f"b{i}", "B", 10) for i in range(4)]
    decider = VarianceDecider(AssignmentConfig(kcl_compatible=True, balancing_frequency=1))
    # WHEN deciding
    plan = decide(decider, snap(leases, [a, b]))
    # THEN both are outside the limits, A is the donor, and leases move from A to B
    assert plan.fleet_average["C"] == 55.0
    assert pytest.approx(60.5) == 55.0 * 1.1
    assert pytest.approx(49.5) == 55.0 * 0.9
    assert plan.balancing_ran
    assert plan.moved >= 1
    assert all(d.from_worker == "A" and d.to_worker == "B" and d.kind == "rebalance" for d in plan.decisions)
    assert "threshold 10%" in plan.decisions[0].reason
    # AND with both inside the limits (58 / 52) nothing moves
    calm = [cpu_worker("A", 58, 58, opr=100), cpu_worker("B", 52, 52, opr=100)]
    assert decide(decider, snap(leases, calm)).decisions == ()


# ---------------------------------------------------------------------------------------- 500 shards, 100 + 100 workers


def _seed_001(decider: Decider, cycles: int = 12) -> tuple[Counter[str], list[int], int]:
    """500 shards: cluster a (100 workers) takes them all, then cluster b (100 workers) joins."""
    leases: tuple[Lease, ...] = tuple(unassigned(f"shardId-{i:06d}") for i in range(500))
    a = [default_worker(f"a-{i:03d}") for i in range(100)]
    b = [default_worker(f"b-{i:03d}") for i in range(100)]
    rng = random.Random(1)
    run = 1
    # Phase 1: cluster a alone.
    for _ in range(3):
        s = AssignmentSnapshot(
            leases=leases, workers=tuple(a), now_epoch_s=NOW, run_number=run, expired_lease_keys=frozenset()
        )
        leases = apply_plan(leases, decider.decide(s, rng=rng))
        run += 1
    assert Counter(lease.lease_owner for lease in leases) == Counter({w.worker_id: 5 for w in a})
    # Phase 2: cluster b joins; run balancing cycles.
    moves = 0
    for _ in range(cycles):
        s = AssignmentSnapshot(leases=leases, workers=tuple(a + b), now_epoch_s=NOW, run_number=run)
        plan = decider.decide(s, rng=rng)
        moves += len(plan.decisions)
        leases = apply_plan(leases, plan)
        run += 1
    per_cluster: Counter[str] = Counter((lease.lease_owner or "-").split("-")[0] for lease in leases)
    per_worker = sorted(Counter(lease.lease_owner for lease in leases).values())
    return per_cluster, per_worker, moves


def test_seed_001_count_strategy_splits_500_shards_250_250() -> None:
    # GIVEN 500 shards held 5 each by cluster a's 100 workers, then cluster b's 100 workers join
    decider = CountDecider(AssignmentConfig(strategy="count", balancing_frequency=1))
    # WHEN the count strategy balances
    per_cluster, per_worker, moves = _seed_001(decider)
    # THEN each cluster processes 250 shards, every worker 2 or 3, with the minimum 250 moves for that split
    assert per_cluster == Counter({"a": 250, "b": 250})
    assert set(per_worker) == {2, 3}
    assert moves == 250


def test_seed_001_kcl2_stealing_shows_the_stable_disbalance() -> None:
    # GIVEN the same fleet under KCL 2.x takers (steal one lease at a time from the most loaded)
    decider = KCL2StealingDecider(AssignmentConfig(strategy="count"))
    # WHEN enough rounds pass to settle
    per_cluster, per_worker, _ = _seed_001(decider, cycles=12)
    # THEN it settles 300 / 200: every old worker at the target 3, every new one at 2 — and no one can steal
    assert per_cluster == Counter({"a": 300, "b": 200})
    assert set(per_worker) == {2, 3}


def test_seed_001_kcl_count_strategy_is_stuck_at_300_200() -> None:
    # GIVEN KCL 3.4.3's lease-count decider
    decider = CountDecider(AssignmentConfig(strategy="count", balancing_frequency=1, kcl_compatible=True))
    # WHEN it balances
    per_cluster, per_worker, moves = _seed_001(decider)
    # THEN the old cluster keeps the target 3 each (300 / 200) after 200 moves, and since its two pointers fill
    # receivers up to the target 3, 33 new workers end with no lease at all (167 owners: 166 × 3 + 1 × 2)
    assert per_cluster == Counter({"a": 300, "b": 200})
    assert moves == 200
    assert Counter(per_worker) == Counter({3: 166, 2: 1})


def test_seed_001_variance_strategy_with_default_metric_workers() -> None:
    # GIVEN the same fleet of default-metric (throughput-only) workers and equal 10 KBps shards
    decider = VarianceDecider(AssignmentConfig(balancing_frequency=1))
    leases = tuple(owned(f"shardId-{i:06d}", f"a-{i % 100:03d}", 10.0) for i in range(500))
    workers = tuple(default_worker(f"{c}-{i:03d}") for c in "ab" for i in range(100))
    rng = random.Random(3)
    for run in range(1, 13):
        plan = decider.decide(
            AssignmentSnapshot(leases=leases, workers=workers, now_epoch_s=NOW, run_number=run), rng=rng
        )
        leases = apply_plan(leases, plan)
    per_cluster = Counter((lease.lease_owner or "-").split("-")[0] for lease in leases)
    # THEN the load-based decider converges to within 10 % of the even split (the threshold band: 2 or 3 each)
    assert set(Counter(lease.lease_owner for lease in leases).values()) <= {2, 3}
    assert 200 <= per_cluster["b"] <= 250


# ----------------------------------------------------------------------------------------------- the dynamic cap


@pytest.mark.parametrize("strategy", ["count", "variance"])
def test_seed_004_dynamic_cap_follows_shard_count_without_restart(strategy: str) -> None:
    # GIVEN 30 shards and 3 workers with dynamic cap 80
    config = AssignmentConfig(strategy=strategy, dynamic_cap=80, balancing_frequency=1)  # type: ignore[arg-type]
    decider = make_decider(config)
    workers = (cpu_worker("worker-1", 30, 30), cpu_worker("worker-2", 30, 30), cpu_worker("worker-3", 30, 30))
    leases: tuple[Lease, ...] = tuple(unassigned(f"shard-{i:03d}") for i in range(30))
    # WHEN the first decision runs
    plan = decide(decider, snap(leases, workers))
    leases = apply_plan(leases, plan)
    # THEN the cap is ceil(30/3) = 10 and every worker holds 10
    assert plan.effective_cap == 10
    assert sorted(owners(leases).values()) == [10, 10, 10]
    # WHEN the stream doubles to 60 shards, the same decider instance (no restart) decides again
    leases = leases + tuple(unassigned(f"shard-{i:03d}") for i in range(30, 60))
    plan = decide(decider, snap(leases, workers, run=2))
    leases = apply_plan(leases, plan)
    # THEN the cap is recomputed to 20 and all 60 are assigned, 20 each
    assert plan.effective_cap == 20
    assert plan.unassigned_lease_keys == ()
    assert sorted(owners(leases).values()) == [20, 20, 20]
    # AND an explicit shard count (from ListShards) is used when given; the cap never exceeds 80
    assert decide(decider, snap(leases, workers, shard_count=300)).effective_cap == 80


def test_seed_004_two_leaders_compute_the_same_cap() -> None:
    # GIVEN two leaders racing with the same snapshot (e.g. an old and a new lock holder)
    config = AssignmentConfig(strategy="count", dynamic_cap=80)
    s = snap([unassigned(f"s{i}") for i in range(60)], [take_worker("w1"), take_worker("w2"), take_worker("w3")])
    # WHEN both decide
    p1, p2 = decide(CountDecider(config), s, 1), decide(CountDecider(config), s, 2)
    # THEN they agree on the cap and the plan: no stored value can be stale, and writes are conditional anyway
    assert p1.effective_cap == p2.effective_cap == 20
    assert p1.decisions == p2.decisions


def test_effective_cap_combines_static_and_dynamic_caps() -> None:
    # GIVEN both caps THEN the lower wins; with no worker the dynamic part is off
    config = AssignmentConfig(max_leases_for_worker=15, dynamic_cap=80)
    assert effective_cap(config, shard_count=60, worker_count=3) == 15
    assert effective_cap(config, shard_count=30, worker_count=3) == 10
    assert effective_cap(config, shard_count=30, worker_count=0) == 15
    assert effective_cap(AssignmentConfig(), shard_count=30, worker_count=3) is None
    assert effective_cap(AssignmentConfig(dynamic_cap=5), shard_count=31, worker_count=3) == 5


# ----------------------------------------------------------------------------------------------- count strategy


def test_count_strategy_one_worker_joining_costs_only_its_share() -> None:
    # GIVEN 100 leases evenly held by 10 workers, then an 11th worker joins
    workers = [take_worker(f"w{i:02d}") for i in range(10)]
    leases = tuple(owned(f"l{i:03d}", f"w{i % 10:02d}") for i in range(100))
    workers.append(take_worker("w99"))
    decider = CountDecider(AssignmentConfig(strategy="count", balancing_frequency=1))
    # WHEN balancing
    plan = decide(decider, snap(leases, workers))
    # THEN only the newcomer receives, up to its quota (10: the one ceil slot of 100/11 falls on the last id),
    # one move more than the minimum of 9
    assert {d.to_worker for d in plan.decisions} == {"w99"}
    assert plan.moved == spread_quotas([w.worker_id for w in workers], 100, None)["w99"] == 10
    # AND the next run changes nothing
    after = apply_plan(leases, plan)
    assert decide(decider, snap(after, workers, run=2)).decisions == ()


def test_count_strategy_dead_worker_leases_spread_over_the_fleet() -> None:
    # GIVEN 4 workers with 5 leases each; w3's leases expired (it died and stopped reporting)
    workers = [take_worker(f"w{i}") for i in range(3)] + [take_worker("w3") if False else cpu_worker("w3", 50, lut=0)]
    leases = tuple(owned(f"l{i:02d}", f"w{i % 4}") for i in range(20))
    expired = [lease.lease_key for lease in leases if lease.lease_owner == "w3"]
    # WHEN deciding
    plan = decide(CountDecider(AssignmentConfig(strategy="count")), snap(leases, workers, expired=expired))
    # THEN the 5 expired leases are reassigned so that counts are 7/7/6
    assert plan.reassigned_expired == 5
    assert sorted(plan.projected_leases.values()) == [6, 7, 7]


def test_spread_quotas_gives_contiguous_groups_their_share() -> None:
    # GIVEN 500 leases over a-000..a-099 and b-000..b-099
    quotas = spread_quotas([f"{c}-{i:03d}" for c in "ab" for i in range(100)], 500, None)
    # THEN the quotas are 2 or 3, sum to 500, and each cluster gets 250
    assert set(quotas.values()) == {2, 3}
    assert sum(quotas.values()) == 500
    assert sum(q for w, q in quotas.items() if w.startswith("a")) == 250
    assert spread_quotas([], 10, None) == {}
    assert spread_quotas(["x", "y"], 10, 3) == {"x": 3, "y": 3}


# ----------------------------------------------------------------------------------------------- our refinements


def _zipf_fleet(n_leases: int, n_workers: int, s: float = 1.2, seed: int = 5) -> tuple[list[Lease], list[float]]:
    rng = random.Random(seed)
    rates = [1000.0 / (k**s) for k in range(1, n_leases + 1)]
    rng.shuffle(rates)
    leases = [owned(f"shard-{i:05d}", f"w{i % n_workers:03d}", rates[i]) for i in range(n_leases)]
    return leases, rates


def _cpu_from_throughput(leases: Iterable[Lease], worker_ids: list[str], scale: float) -> list[WorkerMetricStats]:
    load = dict.fromkeys(worker_ids, 0.0)
    for lease in leases:
        if lease.lease_owner in load:
            load[lease.lease_owner] += lease.throughput_kbps or 0.0
    return [cpu_worker(w, load[w] * scale, load[w] * scale, opr=100) for w in worker_ids]


def _lpt_ratio(rates: list[float], n_workers: int) -> float:
    bins = [0.0] * n_workers
    for rate in sorted(rates, reverse=True):
        bins[bins.index(min(bins))] += rate
    return max(bins) / (sum(bins) / n_workers)


def _balance_cycles(
    n_leases: int, n_workers: int, zipf_s: float, kcl_mode: bool, cycles: int = 3
) -> tuple[float, float, int, float]:
    """Deal Zipf shards round-robin, CPU ∝ throughput (fleet avg 60 %), balancing cycles re-measuring CPU.

    Returns (initial max/mean, final max/mean, moves, final min/mean), of throughput per worker.
    """
    leases, rates = _zipf_fleet(n_leases, n_workers, zipf_s)
    worker_ids = [f"w{i:03d}" for i in range(n_workers)]
    total = sum(rates)
    mean = total / n_workers
    scale = 60.0 * n_workers / total
    decider = VarianceDecider(AssignmentConfig(kcl_compatible=kcl_mode, balancing_frequency=1))
    rng = random.Random(11)
    current: tuple[Lease, ...] = tuple(leases)

    def loads() -> list[float]:
        load = dict.fromkeys(worker_ids, 0.0)
        for lease in current:
            load[lease.lease_owner or "-"] = load.get(lease.lease_owner or "-", 0.0) + (lease.throughput_kbps or 0.0)
        return list(load.values())

    def ratio() -> float:
        return max(loads()) / mean

    initial = ratio()
    moves = 0
    for run in range(1, cycles + 1):
        workers = tuple(_cpu_from_throughput(current, worker_ids, scale))
        plan = decider.decide(
            AssignmentSnapshot(leases=current, workers=workers, now_epoch_s=NOW, run_number=run), rng=rng
        )
        moves += len(plan.decisions)
        current = apply_plan(current, plan)
    return initial, ratio(), moves, min(loads()) / mean


@pytest.mark.parametrize(("n_leases", "n_workers", "zipf_s"), [(64, 8, 1.2), (256, 16, 0.6)])
def test_zipf_fleet_within_110_percent_of_reference_in_three_cycles(
    n_leases: int, n_workers: int, zipf_s: float
) -> None:
    # GIVEN Zipf-skewed shards dealt round-robin over the workers
    _, rates = _zipf_fleet(n_leases, n_workers, zipf_s)
    reference = _lpt_ratio(rates, n_workers)
    # WHEN three balancing cycles run with ours and with KCL's decider
    initial, ours, our_moves, our_min = _balance_cycles(n_leases, n_workers, zipf_s, kcl_mode=False)
    _, theirs, their_moves, their_min = _balance_cycles(n_leases, n_workers, zipf_s, kcl_mode=True)
    # THEN ours is within 1.10 × the LPT reference's max/mean (the raw 1.10 is infeasible when one shard is hotter
    # than a fair share) and it improved on the start
    assert ours / reference <= 1.10, (initial, ours, reference)
    assert ours < initial
    if reference <= 1.10:
        # AND where the band is feasible it needed fewer moves than KCL for the same band
        assert our_moves <= their_moves, (our_moves, their_moves, ours, theirs)
    else:
        # AND where one shard alone is hotter than the band (64 Zipf 1.2 / 8: 2.34 × a fair share), ours leaves
        # that worker out of the band and keeps balancing the other seven, which KCL stops short of: its
        # least-loaded worker ends clearly better off (0.72 vs 0.58 × the mean) for 21 moves instead of 14
        assert our_min >= their_min + 0.1, (our_min, their_min, our_moves, their_moves)
        assert our_moves <= 1.5 * their_moves, (our_moves, their_moves)


def test_ours_does_not_drop_the_receiver_when_a_lease_would_overshoot() -> None:
    # GIVEN scenario 11's fleet
    leases = [owned("leaseY1", YIELD, 1000), unassigned("leaseT1")]
    leases += [owned(f"leaseY{i}", YIELD) for i in (2, 3, 5, 6, 7, 8, 9)]
    s = snap(leases, [yield_worker(), take_worker()])
    # WHEN our decider runs (threshold 10, dampening 80 as the scenario)
    plan = decide(VarianceDecider(AssignmentConfig(dampening_pct=80, balancing_frequency=1)), s)
    # THEN the projected loads of donor and receiver move towards the average and neither passes the other
    # (the band average is the projected one: the unassigned lease adds load that the measured 70 % lacks)
    assert plan.projected_load[TAKE] <= plan.band_average["C"] + 1e-9
    assert plan.projected_load[YIELD] >= plan.projected_load[TAKE]
    assert owners(apply_plan(s.leases, plan))[TAKE] >= 4


def test_ours_assigns_unassigned_to_the_least_utilised_worker_even_when_idle() -> None:
    # GIVEN an idle worker (0 %) and a light one (10 %) while the fleet average is 40 % (a busy third worker)
    workers = [cpu_worker("idle", 0, 0), cpu_worker("light", 10, 10), cpu_worker("busy", 110, 110, opr=200)]
    s = snap([unassigned("x")], workers, run=2)
    # WHEN deciding on a run without balancing: KCL ranks the idle worker below the light one (capacity 1 vs 3);
    # ours picks the idle one
    assert decide(kcl(balancing_frequency=3), s).decisions[0].to_worker == "light"
    assert decide(VarianceDecider(AssignmentConfig()), s).decisions[0].to_worker == "idle"


def test_ours_counts_a_lease_in_handoff_at_its_destination() -> None:
    # GIVEN a lease already handed from yield to take (checkpointOwner = yield)
    handing = Lease(lease_key="h", lease_owner=TAKE, checkpoint_owner=YIELD, lease_counter=3, throughput_kbps=500)
    s = snap([handing, owned("y", YIELD, 500)], [yield_worker(), take_worker()])
    # WHEN our decider runs THEN it neither moves the lease in handoff nor piles more onto take
    plan = decide(VarianceDecider(AssignmentConfig(balancing_frequency=1)), s)
    assert all(d.lease_key != "h" for d in plan.decisions)
    assert plan.projected_throughput_kbps[TAKE] == 500


# ----------------------------------------------------------------------------------------------- performance


@pytest.mark.parametrize("strategy", ["variance", "count"])
def test_a_decision_for_10000_leases_and_1000_workers_assigns_everything_within_a_leader_cycle(strategy: str) -> None:
    # GIVEN 10 000 leases (half unassigned, the rest skewed) and 1 000 workers with skewed CPU
    rng = random.Random(2)
    workers = tuple(cpu_worker(f"w{i:04d}", rng.uniform(10, 90), rng.uniform(10, 90), opr=100) for i in range(1000))
    leases = tuple(
        owned(f"s{i:05d}", f"w{rng.randrange(1000):04d}", rng.paretovariate(1.5)) if i % 2 else unassigned(f"s{i:05d}")
        for i in range(10_000)
    )
    config = AssignmentConfig(strategy=strategy, balancing_frequency=1)  # type: ignore[arg-type]
    decider = make_decider(config)
    s = snap(leases, workers)
    # WHEN deciding (best of 3, in this process's CPU seconds: what the machine's other processes take is not the
    # decider's)
    best = math.inf
    for _ in range(3):
        started = time.process_time()
        plan = decider.decide(s, rng=random.Random(1))
        best = min(best, time.process_time() - started)
    print(f"{strategy}: one decision for 10 000 leases x 1 000 workers took {best * 1000:.0f} ms of CPU")
    # THEN it assigns everything, within one leader cycle (the configured 20 s: a decision past it makes the leader
    # fall behind). How fast it is (the target: under 1 s) is bench/assignment.py's figure (docs/benchmarks.md).
    assert plan.unassigned_lease_keys == ()
    assert best < LeaderConfig().cycle_interval_ms / 1000, best


# ----------------------------------------------------------------------------------------------- snapshot rules


def test_worker_rules_validity_activity_exclusion() -> None:
    # GIVEN workers in each state
    ok = cpu_worker("ok", 50)
    no_range = WorkerMetricStats(worker_id="nr", last_update_epoch_s=int(NOW), stats={"C": (50.0,)})
    zero_range = WorkerMetricStats(
        worker_id="zr", last_update_epoch_s=int(NOW), stats={"C": (50.0,)}, operating_range={"C": (0.0,)}
    )
    # THEN validity, activity (≤ 2 × 30 s) and exclusion follow KCL
    assert is_valid_worker(ok) and is_valid_worker(default_worker("d"))
    assert not is_valid_worker(no_range) and not is_valid_worker(zero_range)
    assert is_active_worker(cpu_worker("x", 50, lut=NOW - 60), NOW)
    assert not is_active_worker(cpu_worker("x", 50, lut=NOW - 61), NOW)
    assert is_excluded_worker(cpu_worker("x", 50, -1))
    assert not is_excluded_worker(default_worker("d"))
    assert not is_assignable_worker(cpu_worker("x", 50, -1), NOW)
    assert is_assignable_worker(ok, NOW)


def test_expiry_tracker_first_sight_growth_and_forgetting() -> None:
    tracker = ExpiryTracker(failover_s=10.0)
    # GIVEN an owned and an unowned lease first seen at t = 100
    first = tracker.observe([owned("a", "w"), unassigned("b")], 100.0)
    # THEN only the unowned one needs an owner; the owned one gets a full lease duration
    assert first == {"b"}
    assert tracker.last_increment("a") == 100.0 and tracker.last_increment("b") == NEVER
    # WHEN the counter of a does not move for more than 10 s THEN it expires
    assert tracker.observe([owned("a", "w")], 110.0) == frozenset()
    assert tracker.observe([owned("a", "w")], 110.5) == {"a"}
    # WHEN it grows THEN it is alive again
    assert tracker.observe([owned("a", "w", counter=124)], 111.0) == frozenset()
    # AND vanished leases are forgotten; reset forgets everything
    assert tracker.last_increment("b") == NEVER and len(tracker) == 1
    tracker.reset()
    assert len(tracker) == 0
    with pytest.raises(ValueError, match="failover_s"):
        ExpiryTracker(0)


# ----------------------------------------------------------------------------------------------- config


def test_config_defaults_match_kcl() -> None:
    config = AssignmentConfig()
    assert (config.rebalance_threshold_pct, config.dampening_pct, config.balancing_frequency) == (10, 60, 3)
    assert (config.ema_alpha, config.worker_report_interval_s) == (0.5, 30.0)
    assert config.dynamic_cap is None and config.max_leases_for_worker is None
    lease = LeaseConfig()  # the leader's lease duration and hand-off timeout are the lease settings'
    assert (lease.failover_time_ms, lease.graceful_handoff_timeout_ms, lease.handoff_deadline_ms) == (
        10_000,
        30_000,
        40_000,
    )
    assert [config.is_balancing_run(r) for r in range(1, 8)] == [True, False, False, True, False, False, True]


def test_config_from_env() -> None:
    env = {
        "SHARDLEASE_ASSIGNMENT_STRATEGY": "Count",
        "SHARDLEASE_REBALANCE_THRESHOLD_PCT": "20",
        "SHARDLEASE_DAMPENING_PCT": "80",
        "SHARDLEASE_BALANCING_FREQUENCY": "1",
        "SHARDLEASE_MAX_LEASES_FOR_WORKER": "0",
        "SHARDLEASE_MAX_THROUGHPUT_PER_HOST_KBPS": "1024.5",
        "SHARDLEASE_ALLOW_THROUGHPUT_OVERSHOOT": "false",
        "SHARDLEASE_DYNAMIC_MAX_LEASES": "80",
        "SHARDLEASE_KCL_COMPATIBLE": "yes",
        "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "5000",
    }
    config = AssignmentConfig.from_env(env)
    assert config.strategy == "count" and config.rebalance_threshold_pct == 20 and config.dampening_pct == 80
    assert config.max_leases_for_worker is None and config.max_throughput_per_host_kbps == 1024.5
    assert not config.allow_throughput_overshoot and config.dynamic_cap == 80 and config.kcl_compatible
    # AND the leader judges worker reports by the workers' own report interval (one variable, one reader)
    assert config.worker_report_interval_s == 5.0
    assert AssignmentConfig.from_env({}) == AssignmentConfig()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SHARDLEASE_ASSIGNMENT_STRATEGY": "random"}, "SHARDLEASE_ASSIGNMENT_STRATEGY"),
        ({"SHARDLEASE_DAMPENING_PCT": "0"}, "dampening_pct"),
        ({"SHARDLEASE_DAMPENING_PCT": "lots"}, "SHARDLEASE_DAMPENING_PCT"),
        ({"SHARDLEASE_BALANCING_FREQUENCY": "0"}, "balancing_frequency"),
        ({"SHARDLEASE_ALLOW_THROUGHPUT_OVERSHOOT": "maybe"}, "not a boolean"),
        ({"SHARDLEASE_DYNAMIC_MAX_LEASES": "-3"}, "dynamic_cap"),
        ({"SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "10"}, "report_interval_ms"),
    ],
)
def test_config_errors_are_one_clear_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        AssignmentConfig.from_env(env)
    assert "\n" not in str(info.value)


def test_empty_fleet_leaves_everything_unassigned() -> None:
    s = snap([unassigned("a"), owned("b", "gone")], [], expired=["b"])
    for decider in (kcl(), VarianceDecider(), CountDecider(), KCL2StealingDecider()):
        plan = decide(decider, s)
        assert plan.decisions == ()
        assert set(plan.unassigned_lease_keys) == {"a", "b"}


def test_leases_of_several_streams_are_balanced_by_load_not_per_stream() -> None:
    from worker_lib.core.streams import StreamIdentifier

    # GIVEN a multi-stream application: w1 holds both hot shards of "orders", w2 all six cold shards of "clicks"
    orders = StreamIdentifier(account_id="1", stream_name="orders", creation_epoch=1)
    clicks = StreamIdentifier(account_id="1", stream_name="clicks", creation_epoch=1)
    leases: tuple[Lease, ...] = (
        *(owned(orders.lease_key(f"shardId-{n}"), "w1", 100.0) for n in range(2)),
        *(owned(clicks.lease_key(f"shardId-{n}"), "w2", 10.0) for n in range(6)),
    )
    workers = [default_worker("w1"), default_worker("w2")]
    decider = VarianceDecider(AssignmentConfig(balancing_frequency=1))
    # WHEN the leader runs a few cycles
    for run in range(1, 6):
        leases = apply_plan(leases, decide(decider, snap(leases, workers, run=run), seed=run))
    # THEN both workers carry the same load (one hot orders shard and three clicks shards each): streams mixed
    load: dict[str | None, float] = {}
    for lease in leases:
        load[lease.lease_owner] = load.get(lease.lease_owner, 0.0) + (lease.throughput_kbps or 0.0)
    assert load == {"w1": 130.0, "w2": 130.0}
    assert {lease.lease_key.split(":")[1] for lease in leases if lease.lease_owner == "w1"} == {"orders", "clicks"}
