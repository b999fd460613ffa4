"""Figures of the failover benchmark: gap statistics, records lost and duplicated (with reasons), the table,
the JSON dump and the CDF plot."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .journal import Rec

TARGETS_S = {
    "kill": 15.0,
    "term": 3.0,
    "deploy": 5.0,
    "leader": 20.0,
    "stop": 15.0,
    "hang": 33.0,  # the shutdown timeout (30 s) + as for term: the departing worker's hold ends only then
    # not separate targets: the same events as kill / term, with the leader on the 1-minute schedule
    "lambda-kill": 15.0,
    "lambda-term": 3.0,
}

REASON_KILLED = "re-read after {worker} was {fate} before checkpointing"
REASON_MOVED = "re-read after a lease moved before its checkpoint"
REASON_SAME = "re-read by the same worker process (a retried batch)"


@dataclass
class Gap:
    """One shard left unserved by one event (for ``deploy``: the shard's longest idle interval in the window)."""

    config: str
    host: str
    scenario: str
    trial: int
    shard: str
    seconds: float
    timed_out: bool
    victim: str
    signal_wall: float
    resumed_by: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    liveness: str = "lease"  # the fleet's liveness mode (docs/liveness-modes.md)


@dataclass
class ScenarioResult:
    config: str
    host: str
    scenario: str
    liveness: str = "lease"
    start: float = 0.0
    end: float = 0.0
    gaps: list[Gap] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    takeovers_s: list[float | None] = field(default_factory=list)  # leader: lock taken by the new leader
    term_exits: list[str] = field(default_factory=list)  # term: "0 after 1.2 s" / "timeout"
    overlaps: int = 0  # stop: records the stopped worker processed after the new owner's first one
    overlap_details: list[str] = field(default_factory=list)
    past_timeout_s: list[float] = field(default_factory=list)  # hang: each gap minus the victim's shutdown timeout
    steady_timeouts: int = 0
    lost: int = 0
    duplicates: Counter[str] = field(default_factory=Counter)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.config, self.host, self.scenario

    def values(self) -> list[float]:
        return [g.seconds for g in self.gaps]


@dataclass
class Stats:
    n: int
    median: float
    p90: float
    max: float
    timeouts: int


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def stats(gaps: Sequence[Gap]) -> Stats:
    values = sorted(g.seconds for g in gaps)
    if not values:
        return Stats(0, math.nan, math.nan, math.nan, 0)
    return Stats(
        n=len(values),
        median=statistics.median(values),
        p90=nearest_rank(values, 0.9),
        max=values[-1],
        timeouts=sum(1 for g in gaps if g.timed_out),
    )


# --- records lost and duplicated -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fate:
    """A process the benchmark SIGKILLed or SIGSTOPped at ``wall``."""

    worker: str
    fate: str  # "killed" | "stopped"
    wall: float


def classify_records(
    records: Iterable[Rec],
    produced: Mapping[str, tuple[str, float]],
    fates: Mapping[int, list[Fate]],
    windows: Sequence[tuple[str, float, float]],
) -> tuple[dict[str, int], dict[str, Counter[str]], list[str]]:
    """Lost ids per window (by when they were produced) and duplicates per window (by when the repeat was
    processed), each repeat with its reason; window ``"-"`` = outside every scenario (start-up, drain).

    A repeat by another process than the previous processing is blamed on that earlier process when it was
    killed or stopped between the two processings, otherwise on a lease that moved before its checkpoint."""

    def window_of(wall: float) -> str:
        for name, start, end in windows:
            if start <= wall <= end:
                return name
        return "-"

    last: dict[str, Rec] = {}
    duplicates: dict[str, Counter[str]] = {}
    for rec in sorted(records, key=lambda r: r.wall):
        previous = last.get(rec.record_id)
        last[rec.record_id] = rec
        if previous is None:
            continue
        if previous.pid == rec.pid:
            reason = REASON_SAME
        else:
            blame = [f for f in fates.get(previous.pid, []) if previous.wall <= f.wall <= rec.wall]
            reason = REASON_KILLED.format(worker=blame[0].worker, fate=blame[0].fate) if blame else REASON_MOVED
        duplicates.setdefault(window_of(rec.wall), Counter())[reason] += 1
    lost_ids = sorted(set(produced) - set(last))
    lost: dict[str, int] = {}
    for rid in lost_ids:
        window = window_of(produced[rid][1])
        lost[window] = lost.get(window, 0) + 1
    return lost, duplicates, lost_ids


def reason_kind(reason: str) -> str:
    if reason == REASON_MOVED:
        return "moved"
    if reason == REASON_SAME:
        return "same"
    return "killed/stopped"


# --- output ----------------------------------------------------------------------------------------------------


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b) or b <= 0:
        return "-"
    return f"{a / b:.1f}×"


def table(results: Sequence[ScenarioResult]) -> list[str]:
    by_key = {r.key: r for r in results}
    header = (
        f"{'config':<6} {'host':<6} {'mode':<6} {'scenario':<12} {'gaps':>4} {'median':>7} {'p90':>7} {'max':>7} "
        f"{'t/o':>4} {'target':>6} {'lost':>5} {'dups':>5}  {'dup reasons (killed/stopped, moved, same)':<42} "
        f"kcl÷ours p90 / max"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        s = stats(r.gaps)
        kinds: Counter[str] = Counter()
        for reason, count in r.duplicates.items():
            kinds[reason_kind(reason)] += count
        reasons = f"{kinds['killed/stopped']}, {kinds['moved']}, {kinds['same']}"
        ratio = ""
        if r.config == "ours" and (kcl := by_key.get(("kcl", r.host, r.scenario))) is not None:
            k = stats(kcl.gaps)
            ratio = f"{_ratio(k.p90, s.p90)} / {_ratio(k.max, s.max)}"
        lines.append(
            f"{r.config:<6} {r.host:<6} {r.liveness:<6} {r.scenario:<12} {s.n:>4} {_fmt(s.median):>7} {_fmt(s.p90):>7} "
            f"{_fmt(s.max):>7} {s.timeouts:>4} {TARGETS_S.get(r.scenario, math.nan):>6.0f} {r.lost:>5} "
            f"{sum(r.duplicates.values()):>5}  {reasons:<42} {ratio}"
        )
    return lines


def final_line(
    results: Sequence[ScenarioResult],
    lost_total: int,
    duplicates_total: int,
    *,
    liveness: str = "lease",
    retrieval: str = "polling",
) -> str:
    """The run in one line (``ours`` on the ``cli`` host); the mode is named when it is not the default ``lease``,
    so that a lease-mode line reads as it always did."""
    by_key = {r.key: r for r in results}
    parts = []
    for scenario in ("kill", "term", "deploy", "leader"):
        r = by_key.get(("ours", "cli", scenario))
        s = stats(r.gaps) if r is not None else None
        parts.append(f"{scenario} {_fmt(s.p90) if s else '-'}/{_fmt(s.max) if s else '-'}")
    named = [f"{liveness} mode"] if liveness != "lease" else []
    named += ["fan-out"] if retrieval == "fanout" else []
    mode = f" ({', '.join(named)})" if named else ""
    return f"failover p90/max s{mode}: {', '.join(parts)}; lost {lost_total}, duplicates {duplicates_total}"


def dump_json(path: Path, results: Sequence[ScenarioResult], meta: Mapping[str, Any]) -> None:
    payload = {
        "meta": dict(meta),
        "summary": [
            {
                "config": r.config,
                "host": r.host,
                "scenario": r.scenario,
                "liveness": r.liveness,
                **asdict(stats(r.gaps)),
                "target_s": TARGETS_S.get(r.scenario),
                "lost": r.lost,
                "duplicates": dict(r.duplicates),
                "takeovers_s": r.takeovers_s,
                "term_exits": r.term_exits,
                "overlaps": r.overlaps,
                "overlap_details": r.overlap_details,
                "steady_timeouts": r.steady_timeouts,
                "notes": r.notes,
                "window": [r.start, r.end],
            }
            for r in results
        ],
        "gaps": [asdict(g) for r in results for g in r.gaps],
    }
    path.write_text(json.dumps(_no_nan(payload), indent=1, default=str) + "\n")


def _no_nan(value: Any) -> Any:
    """NaN (a statistic of no values) as null: strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value


def plot_cdf(path: Path, results: Sequence[ScenarioResult]) -> str | None:
    """One subplot per scenario, one CDF curve per (config, host); returns a note if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    scenarios = [s for s in TARGETS_S if any(r.scenario == s and r.gaps for r in results)]
    if not scenarios:
        return "no gaps to plot"
    cols = min(4, len(scenarios))
    rows = math.ceil(len(scenarios) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    styles = {"ours": "tab:blue", "kcl": "tab:orange"}
    for ax, scenario in zip(axes.flat, scenarios, strict=False):
        for r in results:
            if r.scenario != scenario or not r.gaps:
                continue
            values = sorted(r.values())
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(
                [0.0, *values],
                [0.0, *fractions],
                where="post",
                color=styles.get(r.config),
                label=f"{r.config} ({r.host}, {r.liveness} mode, n={len(values)})",
            )
            timed_out = sorted(g.seconds for g in r.gaps if g.timed_out)
            if timed_out:
                ax.plot(timed_out, [1.0] * len(timed_out), "x", color=styles.get(r.config))
        target = TARGETS_S[scenario]
        ax.axvline(target, color="tab:red", linestyle="--", linewidth=1, label=f"target {target:.0f} s")
        ax.set_title("deploy (longest idle per shard)" if scenario == "deploy" else scenario)
        ax.set_xlabel("gap (s)")
        ax.set_ylabel("fraction of shards")
        ax.set_ylim(0, 1.05)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(scenarios) :]:
        ax.set_visible(False)
    fig.suptitle(
        "shards unserved after an event (CDF): signal → first record of the shard processed by another process"
        " (stop: by any process; deploy: longest idle)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
