"""The simulator learns time (docs/autoscaling.md): a fleet under DesiredWorkers through a load curve."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from worker_lib.cli.main import main
from worker_lib.cli.simulate import run_autoscale_cli
from worker_lib.core.errors import ConfigError
from worker_lib.tools.simulator.autoscale import AutoscaleSpec, curve_from_file, run_autoscale, summary_lines
from worker_lib.tools.simulator.model import parse_skew

SMALL = AutoscaleSpec(shards=40, skew=parse_skew("zipf:0.5"), peak_workers=6, start_delay_s=120.0)


def step_curve(tmp_path: Path) -> Path:
    """Half load for an hour, full load for two, half again for three (minutes, multiplier)."""
    path = tmp_path / "curve.csv"
    path.write_text("minute,multiplier\n0,0.5\n60,0.5\n61,1.0\n180,1.0\n181,0.5\n360,0.5\n")
    return path


def test_the_fleet_grows_with_the_load_and_shrinks_after_it_without_lag(tmp_path: Path) -> None:
    # GIVEN a load that doubles for two hours, then halves
    result = run_autoscale(SMALL, curve_from_file(step_curve(tmp_path)))
    hour = {t: tick for t, tick in ((int(tick.time_s // 60), tick) for tick in result.ticks)}
    # THEN the fleet is smaller at half load than at full load, before and after
    before, during, after = hour[55].running, hour[170].running, hour[355].running
    assert before < during and after < during, (before, during, after)
    # AND at full load it is the peak fleet within one, every worker under the target most of the time
    assert abs(during - SMALL.peak_workers) <= 1
    assert result.fleet_over_target() < 0.05
    # AND the lag never crossed the threshold, and it cost less than the peak fleet all along
    assert result.lag_episode(60.0) is None
    assert result.ratio < 0.9
    # AND the run is deterministic for its seed
    again = run_autoscale(SMALL, curve_from_file(step_curve(tmp_path)))
    assert [t.running for t in again.ticks] == [t.running for t in result.ticks]


def test_the_cli_prints_the_figures_and_draws_load_workers_and_lag(tmp_path: Path) -> None:
    # GIVEN the step curve WHEN `shardlease simulate --autoscale --load-curve FILE --plot` runs
    out, plot = io.StringIO(), tmp_path / "autoscale.png"
    code = run_autoscale_cli(
        curve=str(step_curve(tmp_path)), shards=40, peak_workers=6, start_delay_s=120, plot=plot, out=out
    )
    # THEN it prints the cost against the peak fleet, the over-target time, the actions and the lag, and a PNG
    text = out.getvalue()
    assert code == 0 and "worker-minutes" in text and "scale actions" in text and "lag never above 60 s" in text
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("0,1\n", "at least two rows"),
        ("0,1\n10,x\n", "bad row"),
        ("0,1\n5,1\n5,2\n", "increasing minutes"),
        ("0,1\n5,-1\n", "must not be negative"),
    ],
)
def test_a_bad_load_curve_is_one_config_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        curve_from_file(path)


def test_a_missing_curve_file_or_a_curve_without_autoscale_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # WHEN the curve file does not exist, or a curve is given without --autoscale
    missing = main(["simulate", "--autoscale", "--load-curve", str(tmp_path / "none.csv")])
    alone = main(["simulate", "--load-curve", "diurnal"])
    # THEN each is exit 2 with one line
    err = capsys.readouterr().err.splitlines()
    assert (missing, alone) == (2, 2)
    assert len(err) == 2 and "none.csv" in err[0] and "--load-curve needs --autoscale" in err[1]


def test_summary_names_the_spike_episode() -> None:
    from worker_lib.tools.simulator.autoscale import spike

    # GIVEN a short spike run (a fleet of 6 at the base, the load tripled for 30 minutes)
    result = run_autoscale(SMALL, spike(duration_s=3 * 3600))
    lines = summary_lines(result)
    # THEN the lag crossed the threshold during the spike and came back under within the spike's length
    episode = result.lag_episode(60.0)
    assert episode is not None
    above, back = episode
    assert 2 * 3600 <= above < back <= 2 * 3600 + 30 * 60 + 15 * 60
    assert "back under at minute" in lines[-1]
    # AND the fleet grew for it
    assert max(t.running for t in result.ticks) > SMALL.peak_workers
