"""The command line: which configurations to measure, the run itself, and the exit status (1 when a target ratio
is missed, ``worker`` mode reads more than ``lease`` mode, or a check of the window failed).
"""

from __future__ import annotations

import argparse
import datetime
import os

from worker_lib.leases.config import LeaseConfig
from worker_lib.testing.emulators import start_moto

from . import __doc__ as overview
from .configs import CONFIG_ALIASES, CONFIG_ENV
from .extrapolation import THROUGHPUT, Comparison, calls_of, compare, headline, window_checks
from .measure import run_config
from .prices import HEADLINE, SCALES, TARGET_RATIO
from .report import dump_json, print_report
from .scale import measure_scale_inputs

PROG = "python -m bench.cost_model"
"""The usage line names the documented command (under ``-m`` argparse would name ``__main__.py``)."""


def chosen_configs(liveness: str | None, configs: str | None) -> list[str]:
    """``--liveness`` (lease, worker, both or lease,worker) and ``--configs`` (lease, worker, kcl; ``ours`` = lease)
    together; neither given: both modes. In measuring order: lease, worker, kcl."""
    chosen: set[str] = set()
    for given in (liveness or "").replace("|", ",").split(","):
        mode = given.strip()
        if mode == "both":
            chosen |= {"lease", "worker"}
        elif mode in ("lease", "worker"):
            chosen.add(mode)
        elif mode:
            raise ValueError(f"unknown liveness mode {mode!r}: use lease, worker, both (or lease,worker)")
    for given in (configs or "").split(","):
        name = CONFIG_ALIASES.get(given.strip(), given.strip())
        if name:
            if name not in CONFIG_ENV:
                raise ValueError(f"unknown configuration {name!r}: use lease, worker, kcl")
            chosen.add(name)
    if not chosen:
        chosen = {"lease", "worker"}
    return [name for name in CONFIG_ENV if name in chosen]


def main() -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=(overview or "").splitlines()[0])
    parser.add_argument(
        "--liveness",
        help=(
            "the liveness mode(s) to measure, side by side in one run: lease, worker, both (= lease,worker; the "
            "default unless --configs names some)"
        ),
    )
    parser.add_argument(
        "--configs", help="comma-separated, added to --liveness: lease, worker, kcl (KCL timings, lease mode)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=2.0, help="measured minutes per configuration")
    parser.add_argument(
        "--warmup",
        type=float,
        default=70.0,
        help=(
            "seconds before counting: past the first invocation (a term without a predecessor), all leases held, and "
            "past the workers' first throughput check (60 s), which writes once each lease taken with none stored"
        ),
    )
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args()
    try:
        configs = chosen_configs(args.liveness, args.configs)
    except ValueError as exc:
        parser.error(str(exc))
    first_check_s = LeaseConfig().throughput_update_interval_ms / 1000
    if "worker" in configs and args.warmup <= first_check_s:
        print(
            f"note: a warm-up of {args.warmup:g} s ends before the workers' first throughput check ({first_check_s:g} "
            "s), which writes each lease taken with no throughput stored once: the window may count those writes"
        )
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    print(
        f"run {started:%Y-%m-%d %H:%M} UTC; configurations {', '.join(configs)}; load average before "
        f"{load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} on {os.cpu_count()} CPUs"
    )
    moto = start_moto()
    try:
        results = [
            run_config(
                name,
                moto.endpoint_url,
                workers=args.workers,
                shards=args.shards,
                minutes=args.minutes,
                warmup_s=args.warmup,
            )
            for name in configs
        ]
        inputs = measure_scale_inputs(moto.endpoint_url)
    finally:
        moto.stop()
    load_after = os.getloadavg()
    print_report(results, inputs)
    elapsed = datetime.datetime.now(datetime.timezone.utc) - started
    print(
        f"load average after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
        f"run took {elapsed.total_seconds() / 60:.1f} min"
    )

    print()
    print("== checks of the measured window ==")
    failures: list[str] = []
    for result in results:
        lines, failed = window_checks(result)
        for line in lines:
            print(line)
        failures += failed
    by_name = {r.name: r for r in results}
    comparisons: list[Comparison] = []
    if "lease" in by_name and "worker" in by_name:
        comparisons = [compare(by_name["lease"], by_name["worker"], n, w, inputs) for n, w in SCALES]
        print()
        print("== lease ÷ worker mode, per minute ==")
        print(
            f"{'scale':<11} {'lease writes':>12} {'worker writes':>13} {'ratio':>7} {'target':>7} "
            f"{'worst case':>11} {'lease reads (RRU)':>18} {'worker reads (RRU)':>19}  reads"
        )
        for c in comparisons:
            target = TARGET_RATIO.get((c.leases, c.workers))
            reads = "HIGHER" if c.reads_fail else ("within granularity" if c.reads_more else "not higher")
            print(
                f"{f'{c.leases}/{c.workers}':<11} {c.lease.write_calls:>12.0f} {c.worker.write_calls:>13.0f} "
                f"{c.ratio:>6.1f}× {'' if target is None else f'≥ {target:g}×':>7} {c.worst_ratio:>10.1f}× "
                f"{f'{c.lease.read_calls:.0f} ({c.lease.read_units:.0f})':>18} "
                f"{f'{c.worker.read_calls:.0f} ({c.worker.read_units:.0f})':>19}  {reads}"
            )
            if target is not None and c.ratio < target:
                failures.append(
                    f"ratio {c.ratio:.1f}× at {c.leases} leases/{c.workers} workers is below the target {target:g}×"
                )
            if c.reads_fail:
                failures.append(f"at {c.leases} leases/{c.workers} workers: {c.reads_verdict()}")
        measured = calls_of(by_name["worker"], role="worker", op="UpdateItem", purpose=THROUGHPUT)
        print(
            "worst case: every lease's throughput rewritten every minute, in place of the throughput updates "
            f"measured ({measured} in the window, without records; steady traffic rewrites it rarely)"
        )
    if args.json:
        meta = {"started": started.isoformat(), "load_before": load_before, "load_after": load_after, **vars(args)}
        dump_json(args.json, results, inputs, meta, comparisons=comparisons, failures=failures)
    print()
    for failure in failures:
        print(f"FAILED: {failure}")
    if not comparisons:
        print("(the writes ratio needs both liveness modes: run with --liveness both)")
        return 1 if failures else 0
    by_scale = {(c.leases, c.workers): c for c in comparisons}
    print(headline(by_scale[(10_000, 100)]))
    print(headline(by_scale[HEADLINE]))
    return 1 if failures else 0
