"""Spark applications sharing one stream for a long run: the split over time, lease moves, and lag.

    .venv/bin/python bench/spark_share.py [--scenario even|half-cores] [--minutes 10] [--rate 50]

Everything runs on one machine against a moto server: an 8-shard stream with the same traffic on every shard
(``--rate`` records/s per shard, 200 B), a ``shardlease leader`` process (variance strategy), and

* ``even``: two Spark applications (``spark-a``, ``spark-b``, local[2] each, 1 s trigger) and one plain worker
  (``w1``, process CPU metric);
* ``half-cores``: ``spark-a`` with local[2] and ``spark-b`` with local[1] (half the cores), no plain worker.

Every 10 s it prints how many shards each member holds and its newest load figure (what the leader balances on);
at the end, the lease moves after the first two minutes (settling), and the lag of every record the Spark
applications wrote — sink write time minus Kinesis arrival time — as percentiles per minute and over the run.
The last line is::

    spark sharing (SCENARIO, N min): split a/b[/w1] A/B[/W], moves after settling M, lag p50 X s p99 Y s max Z s
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latest_figure(stats: Mapping[str, Sequence[float]]) -> str:
    """A member's newest load window (``C``, the CPU the leader balances on), e.g. ``C 7.3%``."""
    for name, windows in sorted(stats.items()):
        measured = [value for value in windows if value >= 0]
        if measured:
            return f"{name} {measured[-1]:.1f}%"
    return "-"


def main() -> int:
    parser = argparse.ArgumentParser(description="Spark applications sharing one stream")
    parser.add_argument("--scenario", choices=("even", "half-cores"), default="even")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=50, help="records/s per shard")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument(
        "--min-gap-pct",
        type=float,
        default=None,
        help="the leader's rebalance_min_gap_pct (default: the library's, 2 points)",
    )
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy every process's log here at the end")
    args = parser.parse_args()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "local")

    from worker_lib.core import aws
    from worker_lib.core.config import AwsConfig
    from worker_lib.leases.dynamodb import DynamoDBLeaseStore
    from worker_lib.tables.admin import ensure_tables
    from worker_lib.testing.emulators import start_moto
    from worker_lib.testing.processes import ProcessFleet
    from worker_lib.testing.producers import Producer, shard_hash_keys
    from worker_lib.testing.streams import create_stream
    from worker_lib.workermetrics.stats_store import WorkerMetricsStore

    workdir = Path(tempfile.mkdtemp(prefix="shardlease-spark-share-"))
    emulator = start_moto()
    fleet = ProcessFleet(workdir)
    try:
        config = AwsConfig(endpoint_url=emulator.endpoint_url, max_attempts=3, read_timeout_s=30)
        ddb, kinesis = aws.client("dynamodb", config), aws.client("kinesis", config)
        app, stream = "spark-share", "spark-share-stream"
        ensure_tables(app, ddb)
        create_stream(kinesis, stream, args.shards)
        store = DynamoDBLeaseStore(app, client=ddb)
        rows = WorkerMetricsStore(app, client=ddb)
        env = {
            **os.environ,
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "SHARDLEASE_ENDPOINT_URL": emulator.endpoint_url,
            "AWS_REGION": "us-east-1",
            "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
            "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "2000",
            "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "5000",
            "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "5000",
            "SHARDLEASE_CPU_METRIC": "process",
            "SHARDLEASE_DEMO_JOURNAL": str(workdir),
        }
        if args.min_gap_pct is not None:
            env["SHARDLEASE_REBALANCE_MIN_GAP_PCT"] = str(args.min_gap_pct)

        def start(name: str, command: list[str]) -> None:
            fleet.start(name, command, env=env)

        cli = [sys.executable, "-m", "worker_lib.cli"]
        start("leader", [*cli, "leader", "--app", app, "--stream", stream])

        def spark(worker_id: str, cores: int) -> None:
            start(
                worker_id,
                [
                    sys.executable,
                    "-m",
                    "worker_lib.testing.spark_app",
                    "--app",
                    app,
                    "--stream",
                    stream,
                    "--worker-id",
                    worker_id,
                    "--out",
                    str(workdir / "out"),
                    "--cores",
                    str(cores),
                    "--option",
                    "metrics_report_interval_ms=5000",
                ],
            )

        spark("spark-a", 2)
        spark("spark-b", 2 if args.scenario == "even" else 1)
        members = ["spark-a", "spark-b"]
        if args.scenario == "even":
            start(
                "w1",
                [
                    *cli,
                    "worker",
                    "--app",
                    app,
                    "--stream",
                    stream,
                    "--worker-id",
                    "w1",
                    "--processor",
                    "worker_lib.tools.demo.processor:DemoProcessor",
                ],
            )
            members.append("w1")
        say(
            f"{args.scenario}: {args.shards} shards x {args.rate} records/s of 200 B, members {', '.join(members)}; "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
            + ("" if args.min_gap_pct is None else f"; rebalance_min_gap_pct {args.min_gap_pct:g}")
        )
        per_tick = max(1, args.rate // 5)
        started = time.monotonic()
        samples: list[tuple[float, dict[str, str | None]]] = []
        keys = shard_hash_keys(kinesis, stream)
        with Producer(kinesis, stream, per_tick=per_tick * len(keys), tick_s=0.2, hash_keys=keys, payload_bytes=200):
            while time.monotonic() - started < args.minutes * 60:
                time.sleep(10)
                owners = {lease.lease_key: lease.lease_owner for lease in store.list_leases()}
                elapsed = time.monotonic() - started
                samples.append((elapsed, owners))
                counts = Counter(owners.values())
                figures = {row.worker_id: latest_figure(row.stats) for row in rows.list_all()}
                say(
                    f"  {elapsed / 60:5.1f} min  "
                    + "  ".join(f"{m} {counts.get(m, 0)} ({figures.get(m, '-')})" for m in members)
                    + (f"  unowned {counts[None]}" if None in counts else "")
                )
        settle_s = 120.0
        moves = 0
        for (t0, before), (_, after) in itertools.pairwise(samples):
            if t0 >= settle_s:
                moves += sum(1 for key, owner in after.items() if before.get(key) != owner)
        lags: list[tuple[float, float]] = []
        for path in (workdir / "out").glob("*/batch-*.jsonl"):
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if row["arrival_ms"] is not None:
                    lags.append((row["arrival_ms"] / 1000, (row["written_ms"] - row["arrival_ms"]) / 1000))
        if not lags:
            say("no Spark output")
            return 1
        first = min(at for at, _ in lags)
        say("lag (sink write − Kinesis arrival) per minute, s: p50 / p99 / max")
        for minute in range(int(args.minutes) + 1):
            window = [lag for at, lag in lags if minute * 60 <= at - first < (minute + 1) * 60]
            if window:
                say(
                    f"  minute {minute + 1:2d}: {percentile(window, 0.5):6.2f} / {percentile(window, 0.99):6.2f} / "
                    f"{max(window):6.2f}  ({len(window)} records)"
                )
        values = [lag for _, lag in lags]
        final = Counter(samples[-1][1].values())
        split = "/".join(str(final.get(m, 0)) for m in members)
        names = "/".join(m.split("-")[-1] for m in members)
        say(
            f"spark sharing ({args.scenario}, {args.minutes:g} min): split {names} {split}, "
            f"moves after settling {moves}, lag p50 {percentile(values, 0.5):.2f} s "
            f"p99 {percentile(values, 0.99):.2f} s max {max(values):.2f} s"
        )
    finally:
        # SIGTERM to each main process first (a Spark application stops its query between micro-batches, leaves
        # and stops its JVM), the whole group only for what is still running 30 s later.
        fleet.stop(timeout_s=30)
        fleet.close(exited_groups=True)  # the JVM and Python workers of an application that exited, too
        emulator.stop()
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log_path in workdir.glob("*.log"):
                shutil.copy(log_path, args.keep_logs / log_path.name)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
