"""What the run prints and the raw figures ``--json`` writes. Printing only: the figures are computed by
:mod:`.extrapolation` (and :mod:`.sizes`), so what is shown and how it is reckoned change apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from worker_lib.leases.mode import LivenessMode
from worker_lib.workermetrics.stats_store import MAX_NOTICE_KEYS

from .configs import CONFIG_TITLE
from .counting import Key, label
from .extrapolation import (
    FORMULAS,
    Comparison,
    compare,
    extrapolate,
    lambda_month,
    measured_totals,
    notice_burst_wru,
    ordered_keys,
    rule,
    scaled_totals,
    worker_row_bytes,
    worst_case_totals,
)
from .measure import ConfigResult
from .prices import DETAIL_SCALES, MINUTES_PER_MONTH, PRICE_PER_RRU, PRICE_PER_WRU, SCALES, TARGET_RATIO
from .scale import ScaleInputs
from .sizes import read_units


def rate(result: ConfigResult, key: Key) -> str:
    calls, _ = result.per_minute(key)
    kind = rule(key)
    if kind == "per lease":
        return f"{calls / result.leases:.2f}/lease"
    if kind in ("per worker", "row write", "GSI query"):
        return f"{calls / result.workers:.2f}/worker"
    return f"{calls:.2f}/min"


def print_report(results: list[ConfigResult], inputs: ScaleInputs) -> None:
    names = [CONFIG_TITLE[r.name] for r in results]
    print()
    print("== measured, per minute (calls, request units = RRU for reads / WRU for writes, rate per lease/worker) ==")
    header = f"{'role table operation [purpose]':<58} {'scaling':<12}"
    for name in names:
        header += f" | {name + ' calls':>17} {'units':>7} {'rate':>14}"
    print(header)
    for key in ordered_keys(results):
        line = f"{label(key):<58} {rule(key):<12}"
        for result in results:
            if key in result.tallies:
                calls, units = result.per_minute(key)
                failed = result.tallies[key].failed
                mark = f"({failed} cond.fail)" if failed else ""
                line += f" | {mark + f'{calls:.1f}':>17} {units:>7.1f} {rate(result, key):>14}"
            else:
                line += f" | {'—':>17} {'—':>7} {'':>14}"
        print(line)
    for result in results:
        t = measured_totals(result)
        print(
            f"{CONFIG_TITLE[result.name]:<12} measured total: reads {t.read_calls:.1f} calls/min = {t.read_units:.1f} "
            f"RRU/min; writes {t.write_calls:.1f} calls/min = {t.write_units:.1f} WRU/min "
            f"({result.workers} workers, {result.leases} leases; held {result.held_at_start} at start, "
            f"{result.held_at_end} at end; {result.minutes:g} min)"
        )
    for result in results:
        kinesis = {key: result.per_minute(key)[0] for key in ordered_keys([result], dynamodb=False)}
        parts = ", ".join(f"{k[0]} {k[2]} {v:.1f}" for k, v in kinesis.items())
        print(f"{CONFIG_TITLE[result.name]:<12} Kinesis calls/min (no per-call charge): {parts}")
        durations = ", ".join(
            f"{i.duration_s:.1f}{'' if i.led else ' (not leader)'}{' (cut short)' if i.cut_short else ''}"
            for i in sorted(result.invocations, key=lambda i: i.started_s)
        )
        print(f"{CONFIG_TITLE[result.name]:<12} leader invocations (s): {durations}")

    print()
    print("== sizes ==")
    for result in results:
        print(
            f"{CONFIG_TITLE[result.name]:<12} lease items "
            f"{min(result.lease_item_bytes)}–{max(result.lease_item_bytes)} B; worker rows "
            f"{min(result.worker_row_bytes)}–{max(result.worker_row_bytes)} B as measured "
            f"({result.rows_with_notice} holding a notice list at the end); b_w at steady size "
            f"{worker_row_bytes(result)} B"
        )
    print(
        f"at scale: lease item b_l = {inputs.lease_bytes:.0f} B (lease Scan at 1 000 leases: {inputs.scan_pages_1000}"
        f" page(s), {inputs.scan_units_1000:.0f} RRU); GSI entry b_k = {inputs.gsi_entry_bytes:.0f} B (discovery "
        f"Query at 1 000/20: {inputs.gsi_units_1000_20:g} RRU); expiry-observation item o(L) = "
        + ", ".join(f"{size} B at L = {total}" for total, size in inputs.observation_bytes.items())
    )
    for result in results:
        scans = ", ".join(
            f"{w} × {worker_row_bytes(result)} B = {w * worker_row_bytes(result)} B → "
            f"{read_units(w * worker_row_bytes(result), consistent=False):g} RRU at W = {w}"
            for w in sorted({w for _, w in SCALES})
        )
        print(f"{CONFIG_TITLE[result.name]:<12} worker-row Scan (EC): {scans}")
        if any(key[3] == "heartbeat" for key in result.tallies):
            bursts = ", ".join(
                f"{notice_burst_wru(result, n, w):g} WRU per worker at {n}/{w}" for n, w in DETAIL_SCALES
            )
            print(
                f"{CONFIG_TITLE[result.name]:<12} one-off, per change: a notice naming a worker's whole share "
                f"(L/W keys, ≤ {MAX_NOTICE_KEYS}) and the beat that consumes it: {bursts}"
            )
    print()
    print(FORMULAS)

    for leases, workers in DETAIL_SCALES:
        print()
        print(f"== extrapolated to {leases} leases / {workers} workers, per minute ==")
        header = f"{'role table operation [purpose]':<58}"
        for name in names:
            header += f" | {name + ' calls':>17} {'units':>9}"
        print(header)
        for key in ordered_keys(results):
            cells = []
            for result in results:
                if key in result.tallies:
                    s = extrapolate(result, key, leases, workers, inputs)
                    cells.append(f" | {s.calls:>17.1f} {s.units:>9.1f}")
                else:
                    cells.append(f" | {'—':>17} {'—':>9}")
            print(f"{label(key):<58}" + "".join(cells))

    print()
    print(
        "== totals per scale, per minute (on-demand, us-east-1: $0.125 per million RRU, $0.625 per million WRU; "
        "Lambda arm64 256 MB $0.0000133334 per GB-s + $0.20 per million requests; 30-day month) =="
    )
    by_name = {r.name: r for r in results}
    for leases, workers in SCALES:
        print()
        print(f"-- {leases} leases / {workers} workers --")
        print(
            f"{'config':<14} {'reads/min':>10} {'RRU/min':>9} {'writes/min':>11} {'WRU/min':>9} "
            f"{'reads $/mo':>11} {'writes $/mo':>12} {'Lambda $/mo':>12} {'total $/mo':>11}"
        )
        for result in results:
            t = scaled_totals(result, leases, workers, inputs)
            lam = lambda_month(result)
            print(
                f"{CONFIG_TITLE[result.name]:<14} {t.read_calls:>10.0f} {t.read_units:>9.0f} {t.write_calls:>11.0f} "
                f"{t.write_units:>9.0f} {t.read_units * PRICE_PER_RRU * MINUTES_PER_MONTH:>11.2f} "
                f"{t.write_units * PRICE_PER_WRU * MINUTES_PER_MONTH:>12.2f} {lam:>12.2f} "
                f"{t.dynamodb_month + lam:>11.2f}"
            )
        if "lease" in by_name and "worker" in by_name:
            c = compare(by_name["lease"], by_name["worker"], leases, workers, inputs)
            w = c.worker_worst
            worst_month = w.dynamodb_month + lambda_month(by_name["worker"])
            print(
                f"{'worker, worst':<14} {w.read_calls:>10.0f} {w.read_units:>9.0f} {w.write_calls:>11.0f} "
                f"{w.write_units:>9.0f} {w.read_units * PRICE_PER_RRU * MINUTES_PER_MONTH:>11.2f} "
                f"{w.write_units * PRICE_PER_WRU * MINUTES_PER_MONTH:>12.2f} {lambda_month(by_name['worker']):>12.2f} "
                f"{worst_month:>11.2f}   (worst case: every lease's throughput rewritten every minute)"
            )
            month = {
                name: scaled_totals(r, leases, workers, inputs).dynamodb_month + lambda_month(r)
                for name, r in by_name.items()
            }
            print(
                f"lease ÷ worker: writes {c.ratio:.1f}×, WRU {c.unit_ratio:.1f}×, total $ "
                f"{month['lease'] / month['worker']:.1f}×; worst case writes {c.worst_ratio:.1f}×"
            )
            print(c.reads_verdict())
    for result in results:
        print(
            f"{CONFIG_TITLE[result.name]:<12} Lambda: {result.billed_invocation_s:.1f} s billed per invocation "
            f"(mean of full invocations), {MINUTES_PER_MONTH} invocations per month"
        )


def scaled_summary(result: ConfigResult, leases: int, workers: int, inputs: ScaleInputs) -> dict[str, Any]:
    totals = scaled_totals(result, leases, workers, inputs)
    lam = lambda_month(result)
    summary: dict[str, Any] = {**asdict(totals), "dynamodb_month": totals.dynamodb_month, "total_month": 0.0}
    summary["total_month"] = totals.dynamodb_month + lam
    if result.mode == LivenessMode.WORKER.value and result.heartbeat_ms:
        worst = worst_case_totals(result, leases, workers, inputs)
        summary["worst_case"] = {**asdict(worst), "dynamodb_month": worst.dynamodb_month}
    return summary


def comparison_summary(c: Comparison) -> dict[str, Any]:
    return {
        "lease_writes": c.lease.write_calls,
        "worker_writes": c.worker.write_calls,
        "ratio": c.ratio,
        "unit_ratio": c.unit_ratio,
        "worst_case_worker_writes": c.worker_worst.write_calls,
        "worst_case_ratio": c.worst_ratio,
        "lease_reads": c.lease.read_calls,
        "lease_read_units": c.lease.read_units,
        "worker_reads": c.worker.read_calls,
        "worker_read_units": c.worker.read_units,
        "reads_more": c.reads_more,
        "reads_fail": c.reads_fail,
        "read_excesses": [
            {
                "key": list(e.key),
                "lease": asdict(e.lease),
                "worker": asdict(e.worker),
                "allowance": asdict(e.allowance),
                "explained": e.explained,
            }
            for e in c.excesses
        ],
        "target_ratio": TARGET_RATIO.get((c.leases, c.workers)),
    }


def dump_json(
    path: str,
    results: list[ConfigResult],
    inputs: ScaleInputs,
    meta: Mapping[str, Any],
    *,
    comparisons: list[Comparison],
    failures: list[str],
) -> None:
    def tallies(result: ConfigResult) -> list[dict[str, Any]]:
        return [
            {"key": list(key), "rule": rule(key), **asdict(tally)}
            for key, tally in sorted(result.tallies.items(), key=lambda kv: kv[0])
        ]

    payload = {
        "meta": dict(meta),
        "scale_inputs": asdict(inputs),
        "configs": {
            r.name: {
                **{k: v for k, v in asdict(r).items() if k != "tallies"},
                "tallies": tallies(r),
                "billed_invocation_s": r.billed_invocation_s,
                "lambda_month": lambda_month(r),
                "scaled": {f"{n}/{w}": scaled_summary(r, n, w, inputs) for n, w in SCALES},
            }
            for r in results
        },
        "comparison": {f"{c.leases}/{c.workers}": comparison_summary(c) for c in comparisons},
        "failures": failures,
    }
    Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
