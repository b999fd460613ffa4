"""Property-based tests of every decider over random fleets (hypothesis).

GIVEN any fleet (active, inactive, excluded, invalid and default-metric workers; owned, unassigned, expired and
in-handoff leases; caps or none), WHEN a decider decides, THEN:
nothing goes to a worker that is not assignable; caps hold for every receiver; unassigned leases are all
assigned when capacity exists; no lease ends with two owners; the same seed gives the same plan; (ours) an expired
lease never goes back to the worker that let it expire, and a worker all of whose leases expired (a suspect: it has
most likely died while its metrics still look fresh) receives nothing.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.count import CountDecider
from worker_lib.assignment.plan import AssignmentPlan, Decider, apply_plan
from worker_lib.assignment.snapshot import AssignmentSnapshot, is_assignable_worker
from worker_lib.assignment.state import suspect_workers
from worker_lib.assignment.variance import VarianceDecider
from worker_lib.core.models import Lease, WorkerMetricStats
from worker_lib.tools.kcl2_baseline import KCL2StealingDecider

NOW = 1_700_000_000.0


@st.composite
def workers(draw: st.DrawFn) -> tuple[WorkerMetricStats, ...]:
    n = draw(st.integers(min_value=0, max_value=7))
    out: list[WorkerMetricStats] = []
    for i in range(n):
        age = draw(st.sampled_from([0, 10, 60, 61, 5000]))
        kind = draw(st.sampled_from(["cpu", "cpu", "cpu", "default", "failing", "invalid"]))
        wid = f"w{i}"
        if kind == "default":
            out.append(WorkerMetricStats(worker_id=wid, last_update_epoch_s=int(NOW - age)))
            continue
        values = draw(st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=4))
        if kind == "failing":
            values.append(-1.0)
        opr = draw(st.sampled_from([50.0, 80.0, 100.0]))
        ranges = {} if kind == "invalid" else {"C": (opr,)}
        out.append(
            WorkerMetricStats(
                worker_id=wid, last_update_epoch_s=int(NOW - age), stats={"C": tuple(values)}, operating_range=ranges
            )
        )
    return tuple(out)


@st.composite
def snapshots(draw: st.DrawFn) -> AssignmentSnapshot:
    fleet = draw(workers())
    ids = [w.worker_id for w in fleet] + ["ghost"]
    n = draw(st.integers(min_value=0, max_value=40))
    leases: list[Lease] = []
    expired: set[str] = set()
    for i in range(n):
        key = f"shard-{i:03d}"
        owner = draw(st.one_of(st.none(), st.sampled_from(ids)))
        tp = draw(st.one_of(st.none(), st.floats(min_value=0, max_value=1000)))
        checkpoint_owner = None
        if owner is not None and draw(st.integers(min_value=0, max_value=9)) == 0:
            checkpoint_owner = draw(st.sampled_from(ids))
        leases.append(
            Lease(
                lease_key=key,
                lease_owner=owner,
                checkpoint_owner=checkpoint_owner,
                lease_counter=draw(st.integers(min_value=0, max_value=5)),
                throughput_kbps=tp,
            )
        )
        if owner is not None and draw(st.booleans()):
            expired.add(key)
    return AssignmentSnapshot(
        leases=tuple(leases),
        workers=fleet,
        now_epoch_s=NOW,
        expired_lease_keys=frozenset(expired),
        run_number=draw(st.integers(min_value=1, max_value=4)),
    )


@st.composite
def configs(draw: st.DrawFn) -> AssignmentConfig:
    return AssignmentConfig(
        strategy=draw(st.sampled_from(["variance", "count"])),
        kcl_compatible=draw(st.booleans()),
        max_leases_for_worker=draw(st.one_of(st.none(), st.integers(min_value=1, max_value=10))),
        dynamic_cap=draw(st.one_of(st.none(), st.integers(min_value=1, max_value=20))),
        balancing_frequency=draw(st.sampled_from([1, 3])),
        rebalance_threshold_pct=draw(st.sampled_from([0.0, 10.0, 20.0])),
        dampening_pct=draw(st.sampled_from([60.0, 80.0, 100.0])),
        allow_throughput_overshoot=draw(st.booleans()),
    )


def deciders(config: AssignmentConfig) -> list[Decider]:
    return [VarianceDecider(config), CountDecider(config), KCL2StealingDecider(config)]


def assignable(snapshot: AssignmentSnapshot) -> set[str]:
    return {w.worker_id for w in snapshot.workers if is_assignable_worker(w, snapshot.now_epoch_s)}


def live_assignable(snapshot: AssignmentSnapshot) -> set[str]:
    """Assignable workers that are not suspects (ours gives suspects nothing)."""
    allowed = assignable(snapshot)
    return allowed - suspect_workers(snapshot, allowed)


def ours(config: AssignmentConfig) -> list[Decider]:
    """The deciders that apply our expiry rules: variance and count in the default mode, and the KCL 2.x model
    (a dead worker runs no taker)."""
    out: list[Decider] = [KCL2StealingDecider(config)]
    if not config.kcl_compatible:
        out += [VarianceDecider(config), CountDecider(config)]
    return out


SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(snapshots(), configs(), st.integers(min_value=0, max_value=2**32))
def test_nothing_goes_to_an_inactive_excluded_or_invalid_worker(
    snapshot: AssignmentSnapshot, config: AssignmentConfig, seed: int
) -> None:
    allowed = assignable(snapshot)
    for decider in deciders(config):
        plan = decider.decide(snapshot, rng=random.Random(seed))
        assert {d.to_worker for d in plan.decisions} <= allowed
        assert set(plan.projected_leases) <= allowed


@SETTINGS
@given(snapshots(), configs(), st.integers(min_value=0, max_value=2**32))
def test_caps_hold_for_every_receiver(snapshot: AssignmentSnapshot, config: AssignmentConfig, seed: int) -> None:
    for decider in deciders(config):
        plan = decider.decide(snapshot, rng=random.Random(seed))
        if plan.effective_cap is None:
            continue
        for to in {d.to_worker for d in plan.decisions}:
            assert plan.projected_leases[to] <= plan.effective_cap, (type(decider).__name__, to)


@SETTINGS
@given(snapshots(), configs(), st.integers(min_value=0, max_value=2**32))
def test_no_lease_ends_with_two_owners(snapshot: AssignmentSnapshot, config: AssignmentConfig, seed: int) -> None:
    before = {lease.lease_key: lease for lease in snapshot.leases}
    for decider in deciders(config):
        plan = decider.decide(snapshot, rng=random.Random(seed))
        keys = [d.lease_key for d in plan.decisions]
        assert len(keys) == len(set(keys))  # one decision per lease
        for d in plan.decisions:
            lease = before[d.lease_key]
            if d.kind == "rebalance":
                # a live lease already in handoff is never handed off again (it would have two pending owners)
                assert lease.checkpoint_owner is None
                assert d.from_worker != d.to_worker
            assert d.from_worker == lease.actual_owner
        for graceful in (False, True):
            after = apply_plan(snapshot.leases, plan, graceful=graceful)
            assert sorted(lease.lease_key for lease in after) == sorted(before)
            for lease in after:
                if lease.checkpoint_owner is not None and lease.lease_key in keys and not graceful:
                    raise AssertionError("an assignment must clear the checkpoint owner")


@SETTINGS
@given(snapshots(), st.integers(min_value=0, max_value=2**32), st.booleans())
def test_every_unassigned_lease_is_assigned_when_capacity_exists(
    snapshot: AssignmentSnapshot, seed: int, kcl_compatible: bool
) -> None:
    if not assignable(snapshot):
        return
    pending = {lease.lease_key for lease in snapshot.leases if snapshot.needs_owner(lease)}
    for config in (
        AssignmentConfig(kcl_compatible=kcl_compatible),
        AssignmentConfig(strategy="count", kcl_compatible=kcl_compatible),
    ):
        for decider in deciders(config):
            if (isinstance(decider, KCL2StealingDecider) or not kcl_compatible) and not live_assignable(snapshot):
                continue  # ours: only suspects are left, and they receive nothing
            plan = decider.decide(snapshot, rng=random.Random(seed))
            assert plan.unassigned_lease_keys == (), type(decider).__name__
            after = {lease.lease_key: lease for lease in apply_plan(snapshot.leases, plan)}
            for key in pending:
                assert after[key].actual_owner is not None


@SETTINGS
@given(snapshots(), st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=2**32))
def test_every_unassigned_lease_is_assigned_while_caps_leave_room(
    snapshot: AssignmentSnapshot, cap: int, seed: int
) -> None:
    # GIVEN only unassigned leases need owners and the assignable workers have room for all of them under the cap
    allowed = assignable(snapshot)
    leases = tuple(lease.with_(checkpoint_owner=None) for lease in snapshot.leases)
    snapshot = AssignmentSnapshot(leases=leases, workers=snapshot.workers, now_epoch_s=NOW, run_number=2)
    held = Counter(lease.actual_owner for lease in leases)
    pending = sum(1 for lease in leases if lease.actual_owner is None)
    room = sum(max(0, cap - held[w]) for w in allowed)
    if not allowed or room < pending:
        return
    for config in (
        AssignmentConfig(max_leases_for_worker=cap),
        AssignmentConfig(max_leases_for_worker=cap, kcl_compatible=True),
        AssignmentConfig(strategy="count", max_leases_for_worker=cap),
    ):
        plan: AssignmentPlan = (CountDecider(config) if config.strategy == "count" else VarianceDecider(config)).decide(
            snapshot, rng=random.Random(seed)
        )
        # THEN all are assigned
        assert plan.unassigned_lease_keys == ()
        assert plan.assigned == pending


@SETTINGS
@given(snapshots(), configs(), st.integers(min_value=0, max_value=2**32))
def test_same_seed_same_plan(snapshot: AssignmentSnapshot, config: AssignmentConfig, seed: int) -> None:
    for decider in deciders(config):
        first = decider.decide(snapshot, rng=random.Random(seed))
        second = decider.decide(snapshot, rng=random.Random(seed))
        assert first == second


@SETTINGS
@given(snapshots(), configs(), st.integers(min_value=0, max_value=2**32))
def test_ours_never_hands_an_expired_lease_back_and_gives_suspects_nothing(
    snapshot: AssignmentSnapshot, config: AssignmentConfig, seed: int
) -> None:
    # GIVEN any fleet, some of whose leases are expired (some workers with every lease expired: suspects)
    suspects = suspect_workers(snapshot, assignable(snapshot))
    before = {lease.lease_key: lease for lease in snapshot.leases}
    for decider in ours(config):
        # WHEN one of our deciders decides
        plan = decider.decide(snapshot, rng=random.Random(seed))
        for d in plan.decisions:
            lease = before[d.lease_key]
            # THEN no suspect receives anything
            assert d.to_worker not in suspects, (type(decider).__name__, d)
            # AND an expired lease (not in a handoff) never goes back to the owner that let it expire
            if (
                not isinstance(decider, KCL2StealingDecider)
                and d.lease_key in snapshot.expired_lease_keys
                and lease.checkpoint_owner is None
            ):
                assert d.to_worker != lease.actual_owner, (type(decider).__name__, d)


@SETTINGS
@given(snapshots(), st.integers(min_value=0, max_value=2**32))
def test_ours_moves_an_expired_lease_away_whenever_another_live_worker_exists(
    snapshot: AssignmentSnapshot, seed: int
) -> None:
    # GIVEN no caps, and an expired lease whose owner is assignable
    for config in (AssignmentConfig(), AssignmentConfig(strategy="count")):
        decider = VarianceDecider(config) if config.strategy == "variance" else CountDecider(config)
        # WHEN deciding
        plan = decider.decide(snapshot, rng=random.Random(seed))
        decided = {d.lease_key for d in plan.decisions}
        live = live_assignable(snapshot)
        for lease in snapshot.leases:
            if lease.lease_key not in snapshot.expired_lease_keys or lease.checkpoint_owner is not None:
                continue
            # THEN it is reassigned unless its owner is the only live worker (then it stays, no write)
            if live - {lease.actual_owner}:
                assert lease.lease_key in decided, (type(decider).__name__, lease.lease_key)
