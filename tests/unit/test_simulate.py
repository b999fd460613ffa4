"""The offline fleet simulator (``shardlease simulate``): determinism, events, balance, output, plots, errors."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import PROCESS_START_S
from tests.support.stalls import hang_bound_s
from worker_lib.cli.simulate import run_simulate_cli
from worker_lib.core.errors import ConfigError
from worker_lib.tools.simulator.measures import (
    convergence_band,
    cycles_to_converge,
    lpt_loads,
    max_over_mean,
    min_moves_lower_bound,
    min_moves_upper_bound,
)
from worker_lib.tools.simulator.model import Event, FleetSpec, Simulation, parse_event, parse_skew, simulate


def _cli_output(**kwargs: object) -> str:
    out = io.StringIO()
    assert run_simulate_cli(out=out, **kwargs) == 0  # type: ignore[arg-type]
    # the decision time is measured, so it is the only line allowed to differ between runs
    return "\n".join(line for line in out.getvalue().splitlines() if not line.startswith("decision time"))


# ----------------------------------------------------------------------------------------------- determinism


def test_same_seed_gives_the_same_output() -> None:
    # GIVEN a Zipf fleet with every kind of event
    args: dict[str, object] = {
        "workers": 6,
        "shards": 40,
        "skew": "zipf:1.0",
        "cycles": 12,
        "seed": 7,
        "kill": ["5"],
        "join": ["8:2"],
        "split": ["6"],
    }
    # WHEN it is simulated twice with the same seed
    first, second = _cli_output(**args), _cli_output(**args)
    # THEN the printed tables are identical, and a different seed gives a different run
    assert first == second
    assert _cli_output(**{**args, "seed": 8}) != first


@pytest.mark.parametrize("strategy", ["variance", "variance-kcl", "count", "count-kcl", "kcl2"])
def test_every_strategy_is_deterministic(strategy: str) -> None:
    # GIVEN one fleet WHEN simulated twice per strategy THEN the histories compare equal (decision time excluded)
    spec = FleetSpec(workers=5, shards=30, skew=parse_skew("hot:2:8"), seed=3)
    a = simulate(spec, strategy=strategy, cycles=8, events=[Event(4, "join")])
    b = simulate(spec, strategy=strategy, cycles=8, events=[Event(4, "join")])
    assert a.cycles == b.cycles
    assert a.workers == b.workers


# ----------------------------------------------------------------------------------------------- events


@pytest.mark.parametrize("strategy", ["variance", "count", "kcl2"])
def test_dead_workers_leases_are_reassigned_after_failover(strategy: str) -> None:
    # GIVEN a settled fleet whose most loaded worker dies at cycle 5
    sim = Simulation(FleetSpec(workers=4, shards=24, seed=2), strategy=strategy, events=[Event(5, "kill")])
    for _ in range(4):
        sim.step()
    victim = max(sim.throughput_by_worker().items(), key=lambda item: (item[1], item[0]))[0]
    held = {lease.lease_key for lease in sim.leases if lease.actual_owner == victim}
    assert held
    # WHEN the cycles go on past the failover time and the worker's metrics going stale (2 report intervals)
    stats = [sim.step() for _ in range(5)]
    # THEN the worker is gone from the fleet and every lease it held is owned by a live worker
    assert victim not in stats[-1].throughput
    owners = {lease.lease_key: lease.actual_owner for lease in sim.leases}
    assert all(owners[key] in stats[-1].throughput for key in held)
    assert stats[-1].unassigned == 0
    assert sum(s.reassigned_expired for s in stats) >= len(held)


@pytest.mark.parametrize("strategy", ["variance", "count", "kcl2"])
def test_joining_workers_receive_leases(strategy: str) -> None:
    # GIVEN a uniform fleet of 4 workers, two more joining at cycle 5
    result = simulate(
        FleetSpec(workers=4, shards=40, skew=parse_skew("uniform"), seed=1),
        strategy=strategy,
        cycles=12,
        events=[Event(5, "join", 2)],
    )
    # WHEN the run ends THEN both newcomers hold leases and the fleet has 6 live workers
    final = result.final
    assert final.live_workers == 6
    joined = [row for row in result.workers if row.status == "joined@5"]
    assert len(joined) == 2
    assert all(row.leases > 0 for row in joined)


def test_split_finishes_the_parent_and_creates_two_children_with_half_the_rate() -> None:
    # GIVEN a fleet whose hottest shard splits at cycle 3
    sim = Simulation(FleetSpec(workers=3, shards=12, seed=4), events=[Event(3, "split")])
    for _ in range(2):
        sim.step()
    parent = max(sim.leases, key=lambda lease: sim.rates[lease.lease_key])
    rate = sim.rates[parent.lease_key]
    # WHEN the split happens
    stats = sim.step()
    # THEN the parent is finished with two children, each half as hot and assigned in that same cycle
    assert any(note.startswith("split") for note in stats.events)
    finished = next(lease for lease in sim.leases if lease.lease_key == parent.lease_key)
    assert finished.is_finished
    assert len(finished.child_shard_ids) == 2
    children = [lease for lease in sim.leases if lease.lease_key in finished.child_shard_ids]
    assert all(lease.parent_shard_ids == {parent.lease_key} for lease in children)
    assert [sim.rates[c.lease_key] for c in children] == [rate / 2, rate / 2]
    assert all(c.actual_owner is not None for c in children)
    assert stats.assigned == 2
    # AND once the children are owned by live workers the parent lease is cleaned up
    sim.step()
    assert parent.lease_key not in {lease.lease_key for lease in sim.leases}
    assert sum(len(v) for v in sim.held_rates().values()) == 13


# ----------------------------------------------------------------------------------------------- balance


def test_variance_improves_imbalance_on_a_zipf_fleet_and_beats_lease_count() -> None:
    # GIVEN 64 Zipf(1.2) shards over 8 workers, cold start
    spec = FleetSpec(workers=8, shards=64, skew=parse_skew("zipf:1.2"), seed=1)
    # WHEN ours and the lease-count strategy run 10 cycles (3 balancing runs after the initial assignment)
    ours = simulate(spec, strategy="variance", cycles=10)
    count = simulate(spec, strategy="count", cycles=10)
    # THEN ours improved on its post-initial-assignment imbalance, ends within 1.10 × the LPT reference,
    # and is better balanced than the count strategy
    initial = ours.cycles[0].tp_max_over_mean
    assert ours.final.tp_max_over_mean < initial
    assert ours.final.tp_max_over_mean <= 1.10 * ours.reference_ratio()
    assert ours.final.tp_max_over_mean < count.final.tp_max_over_mean
    assert ours.final.unassigned == 0


def test_cpu_follows_throughput_times_cost_with_per_worker_factors() -> None:
    # GIVEN no noise, base 10 %, and hosts whose cost alternates 1× / 2×
    spec = FleetSpec(workers=4, shards=8, skew=parse_skew("uniform"), noise_pct=0, base_cpu=10, cost_factors=(1, 2))
    sim = Simulation(spec, strategy="count")
    # WHEN one cycle runs and the workers report the next
    sim.step()
    stats = sim.step()
    # THEN each worker's reported CPU is base + throughput × cost × factor, capped at 100
    for worker_id, worker in sim.workers.items():
        expected = min(100.0, 10 + stats.throughput[worker_id] * sim.cost_per_kbps * worker.cost_factor)
        assert worker.sts[-1] == pytest.approx(expected, abs=1e-3)
        assert len(worker.sts) == 2
    assert sim.workers["w001"].sts[-1] > sim.workers["w000"].sts[-1]


# ----------------------------------------------------------------------------------------------- references


def test_lpt_reference_and_move_bounds() -> None:
    # GIVEN rates 5, 4, 3, 3, 3 over two workers
    # WHEN LPT places them hottest first (5→A, 4→B, 3→B, 3→A, 3→B) THEN the loads are 8 and 10
    assert sorted(lpt_loads([5, 4, 3, 3, 3], 2)) == [8, 10]
    assert max_over_mean(lpt_loads([1000, 1, 1, 1], 2)) == pytest.approx(1000 / 501.5)
    # GIVEN worker a holds everything WHEN the target band is [4, 6] on 10 units of 1 each
    start = {"a": [1.0] * 10, "b": []}
    # THEN at least and at most 4 moves are needed
    assert min_moves_lower_bound(start, max_load=6, min_load=4) == 4
    assert min_moves_upper_bound(start, max_load=6, min_load=4) == 4
    # AND leases of a dead worker count as forced moves
    assert min_moves_lower_bound({"b": [1.0]}, max_load=3, min_load=0, forced=2) == 2
    assert min_moves_upper_bound({"b": [1.0], "c": []}, max_load=2, min_load=1, forced=[1.0, 1.0]) == 2


def test_convergence_band_is_relative_to_the_reference_only_when_the_raw_band_is_infeasible() -> None:
    assert convergence_band([1.0, 1.0, 1.04]) == pytest.approx((1.10, 0.90))
    ceiling, floor = convergence_band([10.0, 2.0, 2.0])
    assert ceiling == pytest.approx(1.10 * 10 / (14 / 3))
    assert floor == pytest.approx(0.90 * 2 / (14 / 3))
    result = simulate(FleetSpec(workers=8, shards=64, seed=1), cycles=10)
    cycle, runs = cycles_to_converge(result.cycles, after=1, limit=1.10 * result.reference_ratio())
    assert cycle is not None and runs is not None and runs <= 3


# ----------------------------------------------------------------------------------------------- output


def test_cli_prints_a_cycle_table_and_a_final_table(tmp_path: Path) -> None:
    # GIVEN a small fleet WHEN the CLI runs with a plot
    plot = tmp_path / "fleet.png"
    text = _cli_output(workers=3, shards=9, cycles=4, seed=1, plot=str(plot), cost_factors="1,1.5")
    # THEN both tables and the summary are printed
    assert "cycle" in text and "tp max/mean" in text
    assert "w000" in text and "w002" in text
    assert "LPT reference" in text
    assert f"plot: {plot}" in text
    # AND the plot is a real PNG
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_large_fleet_uses_an_envelope(tmp_path: Path) -> None:
    plot = tmp_path / "big.png"
    _cli_output(workers=60, shards=300, cycles=3, seed=1, plot=plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _legend_texts(ax: object) -> list[str]:
    legend = ax.get_legend()  # type: ignore[attr-defined]
    return [t.get_text() for t in legend.get_texts()]


def test_a_small_fleets_plot_names_every_worker_every_reference_line_and_every_event() -> None:
    from matplotlib.ticker import MaxNLocator

    from worker_lib.tools.simulator.plot import result_figure

    # GIVEN 4 workers, one killed at cycle 3 and a split at cycle 5
    result = simulate(FleetSpec(workers=4, shards=16, seed=3), cycles=8, events=[Event(3, "kill"), Event(5, "split")])
    # WHEN its figure is drawn
    fig = result_figure(result)
    top, bottom, moves = fig.axes
    # THEN each worker has a legend entry, and so do the fleet mean, the LPT reference and its +10 % line
    labels = _legend_texts(top)
    workers = sorted({w for c in result.cycles for w in c.throughput})
    assert all(w in labels for w in workers)
    assert "fleet mean (1.0)" in labels and "scripted event" in labels
    assert any(label.startswith("LPT reference max/mean") for label in labels)
    assert any(label.startswith("reference + 10 %") for label in labels)
    # AND the events are written on the plot, at their cycles
    notes = {t.get_text() for t in top.texts}
    assert any(note.startswith("killed w") for note in notes) and any(note.startswith("split") for note in notes)
    # AND moves are counted in whole leases, cycles in whole cycles
    assert isinstance(moves.yaxis.get_major_locator(), MaxNLocator)
    assert all(float(t).is_integer() for t in moves.get_yticks())
    assert all(float(t).is_integer() for t in bottom.get_xticks())
    assert "leases moved or reassigned" in _legend_texts(bottom)


def test_a_hundred_worker_fleets_plot_is_a_band_with_a_short_legend() -> None:
    from worker_lib.tools.simulator.plot import result_figure

    result = simulate(FleetSpec(workers=100, shards=400, seed=1), cycles=4)
    labels = _legend_texts(result_figure(result).axes[0])
    assert "100 workers: min to max" in labels and "p95 worker" in labels and len(labels) < 12


def test_plot_without_matplotlib_is_one_line_naming_the_plot_extra(tmp_path: Path) -> None:
    # GIVEN a Python in which matplotlib cannot be imported (as in an install without the 'plot' extra)
    plot = tmp_path / "x.png"
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from worker_lib.cli.main import main\n"
        f"raise SystemExit(main(['simulate', '--workers', '2', '--cycles', '2', '--plot', {str(plot)!r}]))"
    )
    # WHEN `shardlease simulate --plot x.png` runs there
    done = subprocess.run(  # (a fresh interpreter and a two-cycle simulation of two workers: a process start)
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=hang_bound_s(PROCESS_START_S), check=False
    )
    # THEN it exits 1 (operational) with exactly one line naming the extra to install, and nothing else
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "'plot' extra" in lines[0] and "pip install 'shardlease[plot]'" in lines[0]
    assert "unexpected error" not in lines[0]
    assert not plot.exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers"),
        ({"shards": 0}, "shards"),
        ({"cycles": 0}, "cycles"),
        ({"strategy": "random"}, "strategy"),
        ({"skew": "pareto"}, "skew"),
        ({"skew": "zipf:-1"}, "Zipf"),
        ({"skew": "hot:0"}, "hot"),
        ({"kill": ["x"]}, "kill"),
        ({"join": ["0"]}, "join"),
        ({"split": ["99"]}, "after the last cycle"),
        ({"kill": ["2:9"], "workers": 3}, "only"),
        ({"noise": -1.0}, "noise"),
        ({"target_cpu": 2.0}, "target_cpu"),
        ({"cost_factors": "1,a"}, "cost-factors"),
        ({"cost_factors": "1,0"}, "cost factors"),
        ({"plot": "out.jpg"}, ".png"),
        ({"plot": "/nonexistent-dir/out.png"}, "does not exist"),
    ],
)
def test_bad_values_raise_one_line_config_errors(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"workers": 3, "shards": 9, "cycles": 4}
    with pytest.raises(ConfigError, match=message) as info:
        run_simulate_cli(out=io.StringIO(), **{**base, **kwargs})  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_event_parsing() -> None:
    assert parse_event("join", "10:2") == Event(cycle=10, kind="join", count=2)
    assert parse_event("kill", "3") == Event(cycle=3, kind="kill", count=1)
    with pytest.raises(ConfigError):
        parse_event("merge", "3")


def test_the_command_line_offers_exactly_the_simulators_strategies() -> None:
    # GIVEN the simulator's strategy names and the CLI (which spells them out to start fast)
    import argparse

    from worker_lib.cli.main import build_parser
    from worker_lib.tools.simulator.model import STRATEGIES

    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    strategy = next(a for a in subcommands.choices["simulate"]._actions if a.dest == "strategy")
    # THEN both name the same strategies
    assert tuple(strategy.choices or ()) == STRATEGIES
