"""Records/s through the shardlease Spark source, a lease-less Python Data Source and a plain reader, side by side.

    .venv/bin/python bench/spark.py [--records 100000] [--shards 4] [--rounds 3] [--max-records-per-shard 6250]

Everything runs on one machine against moto servers: one for Kinesis and, as in AWS where the two services share
nothing, one for DynamoDB (``--one-emulator``: both in one process, where the source's heartbeats and renewals
queue behind GetRecords in one interpreter). A stream is filled once; then each round runs, in
alternating order:

* **plain**: one thread per shard running the library's ShardRecordFetcher from TRIM_HORIZON to the tip (no
  Spark, no leases);
* **lease-less**: a Python Data Source defined below that reads the same shards with the same partitioning (one
  task per shard per micro-batch), the same stop rules and record cap, the same Arrow output, the same
  ``Trigger.AvailableNow`` and the same counting ``foreachBatch`` sink — but keeps no leases and records each
  read's end in a local file instead of DynamoDB. It is what the Python Data Source API costs by itself;
* **source**: the shardlease source under a fresh application (its own lease table, leases assigned to it).

A first run of each reader warms it up and is not counted (the SparkSession, the Python workers' imports and
clients, the emulator's first requests of each kind: costs a long-running query pays once). Rates are medians over
the rounds; ratios are what to read (absolute numbers drift with the machine). With ``SHARDLEASE_SPARK_TRACE_DIR``
set the source and the baseline trace every step (worker_lib/spark/trace.py): the breakdown printed per micro-batch
comes from there and from Spark's own progress reports. The CPU seconds each run cost are printed by side: the
readers (this process and its descendants) and each emulator. The last line is::

    spark records/s: lease-less L, source S (S/L X×); Spark-side CPU s per 100k: lease-less C1, source C2 (C2/C1 Y×)

The bar (issue 31): X ≥ 0.95 and Y ≤ 1.10, measured in the steady state — from the end of each query's first
micro-batch to its end, so that the query's start (once per query) is reported on its own line, not spread over
100 000 records. The whole runs are printed too. The plain reader is context only: on a 2-core machine it measures
the emulator sharing the cores with Spark, not the source.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# --- the lease-less baseline (shipped to Spark's Python processes by value, as it is defined in __main__) ---------


def _baseline_read(task: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Read one shard for one micro-batch by the source's stop rules; Arrow batches and the end reached."""
    from worker_lib.core.config import AwsConfig
    from worker_lib.core.models import TRIM_HORIZON, Checkpoint
    from worker_lib.retrieval import ShardRecordFetcher
    from worker_lib.retrieval.config import RetrievalConfig
    from worker_lib.spark.reading import cached_client, to_arrow

    kinesis = cached_client("kinesis", AwsConfig(endpoint_url=task["endpoint"]))
    start = (
        TRIM_HORIZON if task["seq"] == "TRIM_HORIZON" else Checkpoint(sequence=task["seq"], sub_sequence=task["sub"])
    )
    cap = task["max_records"]
    fetcher = ShardRecordFetcher(
        task["stream"],
        task["shard"],
        kinesis_client=kinesis,
        start=start,
        config=RetrievalConfig(max_records=min(cap, 10_000)),
    )
    records: list[Any] = []
    caught_up = False
    deadline = time.monotonic() + task["max_read_ms"] / 1000
    while len(records) < cap:
        batch = fetcher.fetch()
        fresh = [
            r
            for r in batch.records
            if task["until"] is None
            or r.approximate_arrival_timestamp is None
            or r.approximate_arrival_timestamp.timestamp() <= task["until"]
        ]
        records.extend(fresh[: cap - len(records)])
        if len(fresh) < len(batch.records) or batch.end_of_shard:
            caught_up = True
            break
        if len(records) >= cap:  # the cap, not the tip (the source's order: a full page says nothing of the tip)
            break
        if not batch.throttled and not batch.millis_behind_latest and batch.fetched < min(cap, 10_000):
            caught_up = True
            break
        if time.monotonic() > deadline:
            break
    end = {"seq": task["seq"], "sub": task["sub"], "records": len(records), "caught_up": caught_up}
    if records:
        end.update(seq=records[-1].sequence_number, sub=records[-1].sub_sequence_number)
    # The source's own conversion, so that both Spark readers hand Spark the same Arrow batches.
    return to_arrow(task["shard"], records, stream=task["stream"]), end


class LeaselessReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.until: float | None = None

    def _end_path(self, batch: int, shard: str) -> Path:
        return Path(self.options["ends_dir"]) / f"{batch}-{shard}.json"

    def initialOffset(self) -> dict[str, Any]:
        shards = self.options["shards"].split(",")
        return {"batch": 0, "shards": {s: {"seq": "TRIM_HORIZON", "sub": 0} for s in shards}}

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        batch = start["batch"]
        if batch == 0:
            return {"batch": 1, "shards": start["shards"]}
        ends = {s: json.loads(self._end_path(batch, s).read_text()) for s in start["shards"]}
        if self.until is not None:  # the source's rule under availableNow: a read that reached the tip is done
            ends = {s: e for s, e in ends.items() if not e["caught_up"]}
        if not ends or all(e["records"] == 0 and e["caught_up"] for e in ends.values()):
            return start
        return {"batch": batch + 1, "shards": {s: {"seq": e["seq"], "sub": e["sub"]} for s, e in ends.items()}}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        common = {key: self.options[key] for key in ("stream", "endpoint", "ends_dir")}
        return [
            InputPartition(
                {
                    **common,
                    "shard": s,
                    "seq": p["seq"],
                    "sub": p["sub"],
                    "batch": end["batch"],
                    "until": self.until,
                    "max_records": int(self.options["max_records"]),
                    "max_read_ms": int(self.options["max_read_ms"]),
                }
            )
            for s, p in sorted(end["shards"].items())
        ]

    def read(self, partition: InputPartition) -> Any:
        task = partition.value
        started = time.perf_counter()
        batches, end = _baseline_read(task)
        Path(task["ends_dir"], f"{task['batch']}-{task['shard']}.json").write_text(json.dumps(end))
        trace_dir = os.environ.get("SHARDLEASE_SPARK_TRACE_DIR")
        if trace_dir:
            line = {
                "kind": "baseline_task",
                "at": time.time(),
                "seconds": time.perf_counter() - started,
                "records": end["records"],
            }
            with open(os.path.join(trace_dir, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")
        return iter(batches)

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def prepareForTriggerAvailableNow(self) -> None:
        self.until = time.time()


class LeaselessSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "leaseless-kinesis"

    def schema(self) -> str:
        from worker_lib.spark.source import SCHEMA

        return SCHEMA

    def streamReader(self, schema: Any) -> LeaselessReader:
        return LeaselessReader(dict(self.options))


# --- the runs ---------------------------------------------------------------------------------------------------


def plain_reader(kinesis: Any, stream: str, shard_ids: list[str]) -> int:
    from worker_lib.core.models import TRIM_HORIZON
    from worker_lib.retrieval import ShardRecordFetcher

    counts = dict.fromkeys(shard_ids, 0)

    def read(shard_id: str) -> None:
        fetcher = ShardRecordFetcher(stream, shard_id, kinesis_client=kinesis, start=TRIM_HORIZON)
        while True:
            batch = fetcher.fetch()
            counts[shard_id] += len(batch.records)
            if batch.end_of_shard or (not batch.records and not batch.millis_behind_latest):
                return

    threads = [threading.Thread(target=read, args=(s,)) for s in shard_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts.values())


class Run:
    def __init__(self, label: str, records: int, seconds: float, progress: list[Any], window: tuple[float, float]):
        self.label, self.records, self.seconds, self.progress, self.window = label, records, seconds, progress, window
        self.cpu: dict[str, float] = {}
        self.cpu_by_kind: dict[str, float] = {}
        self.steady: tuple[int, float, float] | None = None  # after the first micro-batch: records, seconds, CPU s
        self.jvm_threads: dict[str, float] = {}

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def steady_rate(self) -> float:
        assert self.steady is not None
        return self.steady[0] / self.steady[1]

    @property
    def steady_cpu_per_100k(self) -> float:
        assert self.steady is not None
        return self.steady[2] * 100_000 / max(1, self.steady[0])

    @property
    def cpu_per_100k(self) -> float:
        """CPU seconds of Spark's side (this process, the JVM, the Python workers and source runners) per 100 000
        records; the emulators apart."""
        return self.cpu["readers"] * 100_000 / max(1, self.records)


def batch_progress(run: Run) -> list[Any]:
    return [p for p in run.progress if "addBatch" in p.durationMs]


def planning_ms(run: Run) -> float:
    """Mean per micro-batch of what Spark spends outside the batch's read and sink: asking the source for the next
    offset (the source commits the previous batch's checkpoints there), the offset and commit logs, planning."""
    batches = batch_progress(run)
    if not batches:
        return 0.0
    return float(statistics.mean(p.durationMs["triggerExecution"] - p.durationMs["addBatch"] for p in batches))


def start_ms(run: Run, progress: Any = None) -> float:
    """From the query's start to its first trigger (the source's coordinator starts in there), or to the trigger of
    ``progress``."""
    progress = progress if progress is not None else (run.progress[0] if run.progress else None)
    if progress is None:
        return 0.0
    from datetime import datetime

    at = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
    return 1000 * (at - run.window[0])


class CpuMeter:
    """CPU seconds spent by the readers (this process and its descendants: Spark's JVM, its Python workers and
    source runners, ended ones included through their parents' reaped-children times) and by each emulator. On a
    2-core machine the wall-clock rates are set by who gets the cores; CPU seconds say what each reader costs."""

    def __init__(self, emulators: dict[str, int]) -> None:
        import psutil

        self._psutil = psutil
        self._emulators = emulators
        self.jvm_threads = False
        self.jvm_threads_before: dict[str, float] = {}

    def _tree(self, root: Any, skip: set[int]) -> float:
        """CPU seconds of ``root`` and its descendants, leaving out the subtrees rooted at ``skip``."""
        if root.pid in skip:
            return 0.0
        try:
            t = root.cpu_times()
            children = root.children()
        except self._psutil.Error:
            return 0.0  # ended while we looked: its parent's reaped-children times hold it from now on
        total: float = t.user + t.system + t.children_user + t.children_system
        return total + sum(self._tree(child, skip) for child in children)

    def read(self) -> dict[str, float]:
        me = self._psutil.Process()
        figures = {"readers": self._tree(me, set(self._emulators.values()))}
        for name, pid in self._emulators.items():
            figures[name] = self._tree(self._psutil.Process(pid), set())
        return figures

    def _own(self, skip: set[int]) -> dict[int, tuple[str, float]]:
        """Every live reader process: pid → (its kind, its own CPU seconds, children apart)."""
        me = self._psutil.Process()
        found: dict[int, tuple[str, float]] = {}
        for process in [me, *me.children(recursive=True)]:
            if process.pid in skip:
                continue
            try:
                t = process.cpu_times()
                kind = process_kind(process.pid == me.pid, process.cmdline())
            except self._psutil.Error:
                continue
            found[process.pid] = (kind, t.user + t.system)
        return found

    def measure(self, run: Callable[[Callable[[int], None]], Run]) -> Run:
        """The run's CPU seconds by side, and the readers' by kind of process (sampled every 0.1 s: a process that
        ends between two samples loses its last tenth of a second there, never in the total)."""
        skip = {pid for pid in self._emulators.values()} | {
            child.pid for pid in self._emulators.values() for child in self._psutil.Process(pid).children(True)
        }
        before, first = self.read(), self._own(skip)
        if self.jvm_threads:
            self.jvm_threads_before = jvm_thread_cpu()
        last = dict(first)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                last.update(self._own(skip))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        marked: list[tuple[float, float, int]] = []

        def mark(records: int) -> None:
            marked.append((time.monotonic(), self.read()["readers"], records))

        try:
            result = run(mark)
        finally:
            done.set()
            sampler.join()
        ended = time.monotonic()
        last.update(self._own(skip))
        after = self.read()
        if marked:
            at, cpu_at, records_at = marked[0]
            result.steady = (result.records - records_at, ended - at, after["readers"] - cpu_at)
        result.cpu = {name: after[name] - before.get(name, 0.0) for name in after}
        if self.jvm_threads:
            result.jvm_threads = diff_threads(self.jvm_threads_before, jvm_thread_cpu())
        kinds: dict[str, float] = defaultdict(float)
        for pid, (kind, seconds) in last.items():
            kinds[kind] += seconds - (first[pid][1] if pid in first else 0.0)
        result.cpu_by_kind = dict(kinds)
        return result


def jvm_thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of our JVM children by thread name (digits folded: "Executor task launch worker
    for task 3.0" and its siblings count together), from /proc/PID/task/TID/stat."""
    import psutil

    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = defaultdict(float)
    for child in psutil.Process().children():
        try:
            if not child.cmdline()[0].endswith("java"):
                continue
        except (psutil.Error, IndexError):
            continue
        for task in Path(f"/proc/{child.pid}/task").iterdir():
            try:
                raw = (task / "stat").read_text()
            except OSError:
                continue
            name = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw[raw.rindex(")") + 2 :].split()
            out["".join("#" if c.isdigit() else c for c in name)] += (int(fields[11]) + int(fields[12])) / ticks
    return dict(out)


def diff_threads(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after if after[name] - before.get(name, 0.0) > 0}


def process_kind(is_me: bool, cmdline: list[str]) -> str:
    """What a reader process is, from its command line."""
    if is_me:
        return "bench process (Py4J client)"
    text = " ".join(cmdline)
    if cmdline and cmdline[0].endswith("java"):
        return "JVM"
    for marker, kind in (
        ("streaming_source_runner", "source runner"),
        ("pyspark.daemon", "Python workers"),
        ("pyspark.worker", "Python workers"),
    ):
        if marker in text:
            return kind
    return "other: " + text[:60]


def run_query(spark: Any, reader: Any, label: str, workdir: Path, mark: Callable[[int], None] | None = None) -> Run:
    """An ``availableNow`` query to its end; ``mark(records so far)`` is called once the first micro-batch's sink is
    done (where the steady state begins: the query's start is behind)."""
    seen = [0]

    def count(df: Any, batch_id: int) -> None:
        seen[0] += df.count()
        if batch_id == 0 and mark is not None:
            mark(seen[0])

    checkpoint = workdir / f"ckpt-{label}-{time.monotonic_ns()}"
    began = time.time()
    started = time.monotonic()
    query = (
        reader.writeStream.foreachBatch(count)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.monotonic() - started
    return Run(label, seen[0], elapsed, list(query.recentProgress), (began, time.time()))


def trace_lines(trace_dir: Path, window: tuple[float, float]) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in trace_dir.glob("*.jsonl"):
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            if window[0] <= line["at"] <= window[1] + 0.5:
                lines.append(line)
    return lines


def describe(run: Run, trace_dir: Path, shards: int, slots: int) -> None:
    batches = [p for p in run.progress if "addBatch" in p.durationMs]
    if not batches:
        say(f"  {run.label}: no micro-batch ran")
        return
    durations: dict[str, float] = defaultdict(float)
    for p in batches:
        for key, value in p.durationMs.items():
            durations[key] += value / len(batches)
    lines = trace_lines(trace_dir, run.window)
    n = len(batches)
    trigger, add_batch, latest = durations["triggerExecution"], durations["addBatch"], durations["latestOffset"]
    say(
        f"  {run.label}: {n} micro-batches, {run.records / n:,.0f} rows each on average; "
        f"per micro-batch (Spark's progress, mean): trigger {trigger:,.0f} ms = latestOffset {latest:,.0f} "
        f"+ addBatch {add_batch:,.0f} "
        f"+ rest {trigger - latest - add_batch:,.0f} (offset log, planning, commit log)"
    )
    if run.progress:
        last = run.progress[-1]
        last_at = start_ms(run, run.progress[-1]) / 1000 + run.window[0]
        end_ms = 1000 * (run.window[1] - last_at) - last.durationMs.get("triggerExecution", 0)
        say(
            f"    query start to first trigger {start_ms(run):,.0f} ms; last trigger's end to termination "
            f"{end_ms:,.0f} ms; {len(run.progress)} triggers"
        )
    tasks = [line for line in lines if line["kind"] in ("task", "baseline_task")]
    task_ms = 1000 * sum(line["seconds"] for line in tasks) / n
    calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for line in lines:
        for key, (count, seconds) in line.get("calls", {}).items():
            calls[key][0] += count
            calls[key][1] += seconds
    convert_ms = 1000 * sum(line.get("convert_s", 0.0) for line in tasks) / n
    kinesis_ms = 1000 * sum(s for k, (c, s) in calls.items() if k.endswith("kinesis")) / n
    say(
        f"    tasks: {len(tasks) / n:.1f} per micro-batch, {task_ms:,.0f} ms of task time in all"
        + (f" (GetRecords+iterators {kinesis_ms:,.0f}, Arrow conversion {convert_ms:,.0f})" if calls else "")
        + f"; Spark scheduling and sink ≈ addBatch − task time ÷ {slots} slots = {add_batch - task_ms / slots:,.0f} ms"
    )
    ddb = {k: v for k, v in calls.items() if not k.endswith("kinesis")}
    if ddb:
        per_batch = sum(c for c, _ in ddb.values()) / n
        parts = ", ".join(f"{k} {c / n:.1f} ({1000 * s / n:,.0f} ms)" for k, (c, s) in sorted(ddb.items()))
        say(f"    DynamoDB calls per micro-batch: {per_batch:.1f} for {shards} shards — {parts}")
    driver = [line for line in lines if line["kind"] in ("latest_offset", "partitions")]
    if driver:
        say(
            "    driver: "
            + ", ".join(
                f"{kind} {1000 * sum(x['seconds'] for x in driver if x['kind'] == kind) / n:,.0f} ms"
                for kind in ("latest_offset", "partitions")
            )
            + " per micro-batch"
        )
    made = [line["at"] for line in lines if line["kind"] == "reader_made"]
    starts = [line for line in lines if line["kind"] == "coordinator_start"]
    if made and starts:
        start = starts[0]
        parts = ", ".join(f"{k} {int(c)}" for k, (c, _) in sorted(start.get("calls", {}).items()))
        say(
            f"    source runner: reader made {1000 * (min(made) - run.window[0]):,.0f} ms after the query started; "
            f"coordinator made and started in {1000 * start['seconds']:,.0f} ms ({parts})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description="shardlease Spark source vs a lease-less source vs a plain reader")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2, help="Spark local[N]")
    parser.add_argument(
        "--one-emulator",
        action="store_true",
        help="serve DynamoDB from the Kinesis emulator's process (default: a moto server of its own)",
    )
    from worker_lib.spark.options import SourceOptions

    defaults = SourceOptions.__dataclass_fields__
    # Five micro-batches of ~20 000 rows per query, as a streaming query runs many: with the source's default cap
    # (100 000 per shard) the whole stream is one micro-batch, and the query's start is most of what is measured.
    parser.add_argument("--max-records-per-shard", type=int, default=6_250)
    parser.add_argument("--jvm-threads", action="store_true", help="print the JVM's CPU by thread name")
    parser.add_argument("--max-read-ms", type=int, default=defaults["max_read_ms"].default)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="shardlease-bench-spark-"))
    trace_dir = workdir / "trace"
    trace_dir.mkdir(parents=True)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SHARDLEASE_SPARK_TRACE_DIR"] = str(trace_dir)  # before Spark starts its Python processes
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "local")

    from worker_lib.core import aws
    from worker_lib.core.config import AwsConfig
    from worker_lib.core.models import TRIM_HORIZON, Lease
    from worker_lib.leases.dynamodb import DynamoDBLeaseStore
    from worker_lib.tables.admin import ensure_tables
    from worker_lib.testing.emulators import start_moto
    from worker_lib.testing.streams import create_stream

    emulator = start_moto()
    # In AWS the source's DynamoDB calls take nothing from Kinesis; in one moto process they would take its
    # interpreter (GetRecords waits behind heartbeats and renewals), so DynamoDB gets a process of its own.
    tables = emulator if args.one_emulator else start_moto()
    try:
        config = AwsConfig(endpoint_url=emulator.endpoint_url, max_attempts=2)
        kinesis = aws.client("kinesis", config)
        ddb = aws.client("dynamodb", AwsConfig(endpoint_url=tables.endpoint_url, max_attempts=2))
        stream = "bench-spark"
        create_stream(kinesis, stream, args.shards)
        payload = b"x" * 200
        for i in range(0, args.records, 500):
            batch = [{"Data": payload, "PartitionKey": f"k{i + j}"} for j in range(min(500, args.records - i))]
            kinesis.put_records(StreamName=stream, Records=batch)
        shard_ids = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
        say(
            f"stream {stream}: {args.shards} shards, {args.records} records of {len(payload)} B (moto"
            + ("" if args.one_emulator else "; DynamoDB on a moto server of its own")
            + f"); "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before the runs"
        )

        from pyspark.sql import SparkSession

        from worker_lib.spark import register

        slots = args.slots
        spark = (
            SparkSession.builder.master(f"local[{slots}]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        spark.dataSource.register(LeaselessSource)
        runs: dict[str, list[Run]] = defaultdict(list)
        counter = [0]

        def leaseless() -> Any:
            counter[0] += 1
            ends = workdir / f"ends-{counter[0]}"
            ends.mkdir()
            return (
                spark.readStream.format("leaseless-kinesis")
                .options(
                    stream=stream,
                    endpoint=emulator.endpoint_url,
                    shards=",".join(shard_ids),
                    ends_dir=str(ends),
                    max_records=str(args.max_records_per_shard),
                    max_read_ms=str(args.max_read_ms),
                )
                .load()
            )

        def source() -> Any:
            counter[0] += 1
            app = f"bench-spark-{counter[0]}"
            ensure_tables(app, ddb)
            store = DynamoDBLeaseStore(app, client=ddb)
            for shard_id in shard_ids:
                store.create_lease_if_absent(Lease(lease_key=shard_id, checkpoint=TRIM_HORIZON))
            for lease in store.list_leases():
                store.assign_lease(lease, "bench")
            return (
                spark.readStream.format("shardlease")
                .options(
                    app=app,
                    stream=stream,
                    kinesis_endpoint_url=emulator.endpoint_url,
                    dynamodb_endpoint_url=tables.endpoint_url,
                    worker_id="bench",
                    max_records_per_shard=str(args.max_records_per_shard),
                    metrics="false",
                )
                .load()
            )

        emulators = {"Kinesis emulator": emulator.pid}
        if tables is not emulator:
            emulators["DynamoDB emulator"] = tables.pid
        meter = CpuMeter(emulators)
        meter.jvm_threads = args.jvm_threads

        def plain(mark: Callable[[int], None] | None = None) -> Run:
            began, started = time.time(), time.monotonic()
            count = plain_reader(kinesis, stream, shard_ids)
            return Run("plain", count, time.monotonic() - started, [], (began, time.time()))

        try:
            warm_ups: list[tuple[str, Callable[[], Run]]] = [
                ("lease-less", lambda: run_query(spark, leaseless(), "warm-up", workdir)),
                ("source", lambda: run_query(spark, source(), "warm-up", workdir)),
                ("plain", plain),
            ]
            for label, warm_up in warm_ups:
                warm = warm_up()
                say(f"warm-up ({label}, not counted): {warm.records} records in {warm.seconds:.2f} s")
            for round_no in range(args.rounds):
                order = ("plain", "leaseless", "source") if round_no % 2 == 0 else ("source", "leaseless", "plain")
                for label in order:
                    if label == "plain":
                        run = meter.measure(plain)
                    else:
                        reader = leaseless() if label == "leaseless" else source()
                        run = meter.measure(functools.partial(run_query, spark, reader, label, workdir))
                    runs[label].append(run)
                    say(
                        f"round {round_no + 1} {label:>9}: {run.records:>7} records in {run.seconds:6.2f} s "
                        f"= {run.rate:9.0f} records/s"
                    )
                    if run.records != args.records:
                        say(f"  !! {label} read {run.records} of {args.records} records")
            say("CPU seconds per run, medians over the rounds (readers: this process, Spark's JVM and Python workers):")
            for label in ("plain", "leaseless", "source"):
                names = runs[label][0].cpu.keys()
                say(
                    f"  {label:>9}: "
                    + ", ".join(f"{name} {statistics.median(r.cpu[name] for r in runs[label]):.2f}" for name in names)
                )
            say("the readers' CPU seconds by kind of process, medians over the rounds:")
            for label in ("leaseless", "source"):
                kinds = sorted({kind for r in runs[label] for kind in r.cpu_by_kind})
                say(
                    f"  {label:>9}: "
                    + ", ".join(
                        f"{kind} {statistics.median(r.cpu_by_kind.get(kind, 0.0) for r in runs[label]):.2f}"
                        for kind in kinds
                    )
                )
            if meter.jvm_threads:
                say("JVM CPU seconds by thread name, medians over the rounds (--jvm-threads):")
                for label in ("leaseless", "source"):
                    thread_names = {name for r in runs[label] for name in r.jvm_threads}
                    top = sorted(
                        thread_names, key=lambda n: -statistics.median(r.jvm_threads.get(n, 0.0) for r in runs[label])
                    )[:8]
                    say(
                        f"  {label:>9}: "
                        + ", ".join(
                            f"{n} {statistics.median(r.jvm_threads.get(n, 0.0) for r in runs[label]):.2f}" for n in top
                        )
                    )
            say("where a micro-batch's time goes (last round):")
            for label in ("leaseless", "source"):
                describe(runs[label][-1], trace_dir, args.shards, slots)
        finally:
            spark.stop()
        rate = {label: statistics.median(r.rate for r in found) for label, found in runs.items()}
        spark_labels = ("leaseless", "source")
        cpu = {label: statistics.median(r.cpu_per_100k for r in runs[label]) for label in spark_labels}
        planning = {label: statistics.median(planning_ms(r) for r in runs[label]) for label in spark_labels}
        starts = {label: statistics.median(start_ms(r) for r in runs[label]) for label in spark_labels}
        batches = {label: statistics.median(len(batch_progress(r)) for r in runs[label]) for label in runs}
        steady = all(r.steady is not None and r.steady[0] > 0 for label in spark_labels for r in runs[label])
        say(f"load average after the runs: {os.getloadavg()[0]:.2f}")
        say(
            "micro-batch planning and commit (Spark's triggerExecution − addBatch, mean per batch): "
            f"lease-less {planning['leaseless']:.0f} ms, source {planning['source']:.0f} ms "
            f"(lease holding: {planning['source'] - planning['leaseless']:+.0f} ms per batch, "
            f"{batches['source']:.0f} batches per run); query start to first trigger: lease-less "
            f"{starts['leaseless']:.0f} ms, source {starts['source']:.0f} ms"
        )
        say(
            f"context (not the bar): the plain thread-per-shard reader, no Spark: {rate['plain']:.0f} records/s "
            f"(source/plain {rate['source'] / rate['plain']:.2f}×)"
        )
        whole = (
            f"lease-less {rate['leaseless']:.0f}, source {rate['source']:.0f} "
            f"(S/L {rate['source'] / rate['leaseless']:.2f}×); Spark-side CPU s per 100k: lease-less "
            f"{cpu['leaseless']:.2f}, source {cpu['source']:.2f} (C2/C1 {cpu['source'] / cpu['leaseless']:.2f}×)"
        )
        if not steady:
            say(f"spark records/s: {whole}")
            return 0
        say(f"whole runs, each query's start included: records/s {whole}")
        steady_rate = {label: statistics.median(r.steady_rate for r in runs[label]) for label in spark_labels}
        steady_cpu = {label: statistics.median(r.steady_cpu_per_100k for r in runs[label]) for label in spark_labels}
        start_cpu = {
            label: statistics.median(r.cpu["readers"] - (r.steady[2] if r.steady else 0.0) for r in runs[label])
            for label in spark_labels
        }
        say(
            "a query's start and first micro-batch, Spark-side CPU s (once per query): lease-less "
            f"{start_cpu['leaseless']:.2f}, source {start_cpu['source']:.2f}"
        )
        say("steady state (from the end of the first micro-batch to the query's end, the start behind):")
        say(
            f"spark records/s: lease-less {steady_rate['leaseless']:.0f}, source {steady_rate['source']:.0f} "
            f"(S/L {steady_rate['source'] / steady_rate['leaseless']:.2f}×); Spark-side CPU s per 100k: lease-less "
            f"{steady_cpu['leaseless']:.2f}, source {steady_cpu['source']:.2f} "
            f"(C2/C1 {steady_cpu['source'] / steady_cpu['leaseless']:.2f}×)"
        )
    finally:
        emulator.stop()
        if tables is not emulator:
            tables.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
