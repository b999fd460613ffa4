"""DesiredWorkers, the leader's fleet-size signal: pure rules (worker_lib/scaling/desired.py)."""

from __future__ import annotations

import pytest

from worker_lib.core.errors import ConfigError
from worker_lib.scaling.config import ScalingConfig
from worker_lib.scaling.desired import DesiredWorkers, FleetLoad, decide_desired, fleet_demand, removal_candidates

CONFIG = ScalingConfig()  # target 70 %, headroom 15 % → sized at 59.5 %; band 5 points; cool-downs 600 / 180 s


def load(workers: int, cpu: float, *, leases: int = 100, lag: int | None = None, at: float = 0.0) -> FleetLoad:
    return FleetLoad(workers=workers, leases=leases, utilization_pct=[cpu] * workers, max_lag_ms=lag, now_epoch_s=at)


def test_a_fleet_over_its_sizing_point_asks_at_once_for_the_workers_its_demand_needs() -> None:
    # GIVEN 4 workers at 90 % CPU (3.6 workers' worth of work), the signal at 4
    previous = decide_desired(CONFIG, load(4, 50.0), None)
    # WHEN a cycle within the scale-out cool-down sees them at 90 %
    early = decide_desired(CONFIG, load(4, 90.0, at=170.0), previous)
    # THEN it holds, saying why
    assert early.desired == 4 and "scale-out cool-down" in early.reason
    # WHEN a cycle after the cool-down sees them at 90 %
    decision = decide_desired(CONFIG, load(4, 90.0, at=180.0), previous)
    # THEN it asks for ⌈3.6 / 0.595⌉ = 7 workers, says why, and records the change
    assert decision.desired == 7 and decision.changed and decision.basis == "cpu"
    assert decision.reason.startswith("scale out: cpu demand 3.60 workers")
    # AND asking again with the same load changes nothing
    again = decide_desired(CONFIG, load(4, 90.0, at=400.0), decision)
    assert (again.desired, again.changed, again.changed_at_epoch_s) == (7, False, 180.0)


def test_a_shrinking_load_waits_for_the_cool_down_and_the_band_before_scaling_in() -> None:
    # GIVEN a signal of 10 workers set at t=0
    previous = DesiredWorkers(desired=10, reason="", basis="cpu", demand=5.9, changed_at_epoch_s=0.0)
    # WHEN the 10 workers drop to 33 % (3.3 workers' worth: 6 needed) before the cool-down ended
    early = decide_desired(CONFIG, load(10, 33.0, at=599.0), previous)
    # THEN the signal holds, saying why
    assert early.desired == 10 and "cool-down" in early.reason
    # WHEN the cool-down has passed
    late = decide_desired(CONFIG, load(10, 33.0, at=600.0), previous)
    # THEN it shrinks to the size that sits a band under the sizing point: ⌈3.3 / 0.545⌉ = 7, not 6
    assert late.desired == 7 and late.reason.startswith("scale in")
    # AND a load just under a boundary (need 9 < 10, but 10 at the band) holds: no flapping
    hovering = decide_desired(CONFIG, load(10, 52.0, at=900.0), previous)
    assert hovering.desired == 10 and "band" in hovering.reason


def test_growing_lag_adds_workers_once_per_scale_out_cool_down_and_blocks_scale_in() -> None:
    # GIVEN 8 workers pinned at 100 % CPU that already asked for 14, and a lag that grows past the threshold
    previous = DesiredWorkers(desired=14, reason="", basis="cpu", demand=8.0, changed_at_epoch_s=0.0, lag_ms=70_000)
    # WHEN the lag grows again within the scale-out cool-down
    soon = decide_desired(CONFIG, load(8, 100.0, lag=90_000, at=100.0), previous)
    # THEN nothing more is asked (the workers asked for are still starting)
    assert soon.desired == 14 and not soon.changed
    # WHEN it is still growing after the cool-down
    later = decide_desired(CONFIG, load(8, 100.0, lag=120_000, at=200.0), previous)
    # THEN 25 % of the fleet is added on top of the signal
    assert later.desired == 14 + 4 and "lag 120000 ms" in later.reason
    # AND while the lag is above the threshold a light load does not shrink the fleet, nor does the growing lag of a
    # fleet with CPU to spare (a hot or stuck shard) grow it
    light = decide_desired(CONFIG, load(18, 10.0, lag=61_000, at=5_000.0), later)
    assert light.desired == 18 and "lag is above" in light.reason
    spare = decide_desired(CONFIG, load(18, 10.0, lag=99_000, at=9_000.0), light)
    assert spare.desired == 18 and not spare.changed


def test_bounds_and_the_lease_count_cap_the_signal() -> None:
    # GIVEN a heavy load on an application of 5 leases, and bounds 2..4
    config = ScalingConfig(min_workers=2, max_workers=4)
    # WHEN sized
    capped = decide_desired(ScalingConfig(), load(3, 100.0, leases=5), None)
    bounded = decide_desired(config, load(3, 100.0, leases=50), None)
    idle = decide_desired(config, load(3, 0.0, leases=50), None)
    # THEN never more workers than leases, and the bounds hold either way
    assert capped.desired == 5 and "bounded to 5" in capped.reason
    assert bounded.desired == 4 and idle.desired == 3  # a first decision does not shrink: the cool-down starts


def test_without_cpu_the_throughput_against_the_host_maximum_is_the_demand() -> None:
    # GIVEN workers that report no CPU, 3 000 KBps on leases, and a host maximum of 1 000 KBps
    fleet = FleetLoad(workers=2, leases=40, throughput_kbps=3_000.0, max_throughput_per_host_kbps=1_000.0)
    # WHEN sized THEN the demand is 3 hosts' worth and the need ⌈3 / 0.595⌉ = 6
    assert fleet_demand(fleet) == (3.0, "throughput")
    assert decide_desired(CONFIG, fleet, None).desired == 6
    # AND with neither signal the fleet holds its size, saying so
    blind = decide_desired(CONFIG, FleetLoad(workers=3, leases=40), None)
    assert blind.desired == 3 and blind.basis == "none" and "no load signal" in blind.reason


def test_the_least_loaded_workers_are_the_ones_to_remove() -> None:
    loads = {"w1": 40.0, "w2": 10.0, "w3": 10.0, "w4": 70.0}
    assert removal_candidates(loads, 2) == ("w2", "w3")
    assert removal_candidates(loads, 4) == ()


def test_a_stored_decision_round_trips_and_a_foreign_item_reads_as_none() -> None:
    decision = decide_desired(CONFIG, load(4, 90.0, lag=5, at=3.0), None)
    stored = DesiredWorkers.from_attrs(decision.to_attrs())
    assert stored is not None and (stored.desired, stored.lag_ms, stored.changed_at_epoch_s) == (7, 5, 3.0)
    assert DesiredWorkers.from_attrs({"desired": "many"}) is None
    assert DesiredWorkers.from_attrs({}) is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SHARDLEASE_SCALING_TARGET_UTILIZATION_PCT": "120"}, "must be in \\(0, 100\\]"),
        ({"SHARDLEASE_SCALING_MIN_WORKERS": "3", "SHARDLEASE_SCALING_MAX_WORKERS": "2"}, "below min_workers=3"),
        ({"SHARDLEASE_SCALING_SCALE_IN_BAND_PCT": "70"}, "below the sizing point"),
    ],
)
def test_impossible_settings_are_one_config_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ScalingConfig.from_env(env)


@pytest.mark.parametrize("strategy", ["variance", "count"])
def test_a_draining_worker_receives_nothing_and_is_not_balanced_around(strategy: str) -> None:
    import dataclasses
    import random

    from tests.support.assignment import snap
    from worker_lib.assignment.config import AssignmentConfig
    from worker_lib.assignment.deciders import make_decider
    from worker_lib.assignment.plan import apply_plan
    from worker_lib.core.models import Lease, WorkerMetricStats

    # GIVEN three workers, the idlest of which the fleet is asked to remove, and 6 unassigned leases
    workers = [
        WorkerMetricStats(worker_id=w, last_update_epoch_s=int(1e9), stats={"C": (cpu,)}, operating_range={"C": (100,)})
        for w, cpu in (("busy", 60.0), ("mid", 40.0), ("idle", 5.0))
    ]
    leases = [Lease(lease_key=f"s{n}", lease_owner="idle", lease_counter=5, throughput_kbps=1.0) for n in range(2)]
    leases += [Lease(lease_key=f"u{n}") for n in range(6)]
    snapshot = dataclasses.replace(snap(leases, workers), now_epoch_s=1e9, draining=frozenset({"idle"}))
    # WHEN the decider runs
    decider = make_decider(AssignmentConfig(strategy=strategy))  # type: ignore[arg-type]
    placed = apply_plan(snapshot.leases, decider.decide(snapshot, rng=random.Random(3)))
    # THEN every unassigned lease went to the others, and the draining worker kept what it holds
    owner = {lease.lease_key: lease.lease_owner for lease in placed}
    assert all(owner[f"u{n}"] in {"busy", "mid"} for n in range(6)), owner
    assert owner["s0"] == owner["s1"] == "idle"


def test_the_sizer_names_workers_to_drain_only_when_asked() -> None:
    from worker_lib.core.models import Lease, WorkerMetricStats
    from worker_lib.leader.sizing import FleetSizer

    # GIVEN an idle fleet of three that a first decision leaves at three, then (cool-down past) shrinks to one
    workers = [
        WorkerMetricStats(worker_id=w, last_update_epoch_s=1, stats={"C": (cpu,)})
        for w, cpu in (("a", 9.0), ("b", 3.0), ("c", 6.0))
    ]
    leases = [Lease(lease_key=f"s{n}") for n in range(10)]
    for drain, expected in ((False, frozenset()), (True, frozenset({"b", "c"}))):
        sizer = FleetSizer(None, ScalingConfig(drain_least_loaded=drain))
        sizer.size(workers=workers, leases=leases, max_lag_ms=None, now_epoch_s=0.0)
        decision = sizer.size(workers=workers, leases=leases, max_lag_ms=None, now_epoch_s=1_000.0)
        # THEN the two least loaded are named either way, and drained only when asked
        assert decision.desired == 1 and sizer.remove == ("b", "c")
        assert sizer.draining == expected
