"""Exactly-once effects: records/s of outputs committed with the checkpoint against at-least-once writes, and
duplicates after SIGKILLs.

1. **Throughput.** A real :class:`~worker_lib.worker.worker.Worker` in this process on a moto server (HTTP on
   loopback) and a PostgreSQL server of the benchmark's own (``worker_lib.testing.postgres``; psycopg 3). Every run
   reads a fresh stream of ``--shards`` shards pre-filled with ``--records`` 100-byte records (spread evenly), its
   lease table made and its TRIM_HORIZON leases assigned to the worker beforehand, and writes a fresh output table.
   Every mode writes the same output per record — an item keyed ``<shard>:<sequence number>`` with the shard, the
   sequence number, the partition key and the data — and checkpoints once per batch
   (bench/exactly_once_support/processor.py):

   - **A, at-least-once** (the baseline, KCL's usual pattern): BatchWriteItem of the batch's items (25 a request,
     UnprocessedItems sent again), then ``checkpointer.checkpoint()``;
   - **D, dynamodb-transaction**: ``checkpointer.stage(record, put_item(table, item))`` per record, then
     ``checkpointer.checkpoint()``: the library commits outputs and checkpoint in TransactWriteItems of at most 99
     outputs and the lease's update;
   - **S, sql-position**: the rows and ``SqlPositions.save(cursor, checkpointer, records[-1])`` in one PostgreSQL
     transaction, commit, then ``checkpointer.checkpoint()`` (``Worker(..., position_sink=SqlPositions(...))``);
   - **A_sql, at-least-once into PostgreSQL**: the same rows in one transaction, commit, then the checkpoint — S
     without the position row: the like-for-like baseline of S, printed on a line of its own with S/A_sql.

   records/s: the run's records / (end of the delivery that completed the last of them − start of the first
   delivery); a delivery ends when its checkpoint returned. ``--rounds`` rounds of the four modes, the order
   rotating each round; the figures are the medians, every run printed too. Every run is checked: each record's
   output there once, every lease's checkpoint at its shard's last record.

   The moto server's TransactWriteItems keeps a rollback copy of the items it touches
   (bench/exactly_once_support/moto_rollback.py). moto as shipped deep-copies every table a transaction names,
   once per action — a cost that grows with the table (15 s for 99 puts into 8 000 items) and that DynamoDB does
   not have; ``--moto as-shipped`` measures with it (``--records 400``: at 800, moto stalled long enough for a
   lease to expire).

2. **Duplicates after N kills.** Real ``shardlease worker`` processes (embedded leader, 3 s leases) on one moto
   stream of ``--kill-shards`` shards fed by a steady producer (``--rate`` records/s). Four applications read it,
   one process each, with effects that are not idempotent: at-least-once into DynamoDB (BatchWriteItem of an item
   per record and delivery: BatchWriteItem has no ``ADD``) and into PostgreSQL (a row per record and delivery);
   dynamodb-transaction (``ADD n 1`` on the record's item, staged) and sql-position (a row per record and delivery,
   and the position, in one transaction). Every processor sleeps ``--hold-ms`` between its write and its
   checkpoint, so that a kill often lands after a batch's effects and before its checkpoint. ``--kills`` times,
   spaced ``--kill-every`` s (plus up to 1 s at random): SIGKILL every application's process, start a replacement
   with a fresh worker id, wait until it holds every lease. Then the producer stops, every sink is drained and the
   processes stop. Per sink: *duplicated records* (a record whose effect landed more than once), *lost records*
   (produced, no effect), records delivered more than once (from the processes' journals: the kills did hit
   batches in flight) and, for the SQL sinks, the records applied past their shard's lease checkpoint when the
   kills landed (what a replacement starting at the lease checkpoint applies again).

    .venv/bin/python bench/exactly_once.py [--records 16000] [--shards 4] [--rounds 3] [--max-records 10000]
        [--kills 3] [--kill-every 5] [--rate 200] [--hold-ms 300] [--kill-shards 4] [--moto item-rollback|as-shipped]

The last line: ``exactly-once: records/s at-least-once A, dynamodb-transaction D (D/A X×), sql-position S (S/A
Y×); duplicates after N kills: at-least-once K, exactly-once E``. A is the DynamoDB at-least-once rate, and S/A is
against it too: the issue's bar is the cost of exactly-once against what a KCL application does today (BatchWriteItem
to DynamoDB), whatever the sink; the line ``like for like in PostgreSQL`` gives S/A_sql, against the sink's own
at-least-once writes. K sums the duplicated records of the two at-least-once sinks, E those of the two exactly-once
sinks (0 expected: measured, never assumed). Exits 1 if a record was lost, E > 0 or a throughput run failed its
check.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exactly_once_support.effects import (  # noqa: E402
    AT_LEAST_ONCE,
    AT_LEAST_ONCE_SQL,
    DYNAMODB_TRANSACTION,
    MODES,
    SQL_MODES,
    SQL_POSITION,
    count_table_sql,
    create_output_table,
    item_table_sql,
)
from exactly_once_support.moto_rollback import start_moto as start_moto_item_rollback  # noqa: E402
from exactly_once_support.processor import EffectsProcessor  # noqa: E402
from lanes_support import Tally  # noqa: E402

from worker_lib.core import aws  # noqa: E402
from worker_lib.core.config import AwsConfig  # noqa: E402
from worker_lib.core.models import TRIM_HORIZON, Lease  # noqa: E402
from worker_lib.leases.config import LeaseConfig  # noqa: E402
from worker_lib.leases.dynamodb import DynamoDBLeaseStore  # noqa: E402
from worker_lib.processing.positions import SqlPositions  # noqa: E402
from worker_lib.retrieval.config import RetrievalConfig  # noqa: E402
from worker_lib.tables.admin import ensure_tables  # noqa: E402
from worker_lib.testing.emulators import start_moto  # noqa: E402
from worker_lib.testing.postgres import PostgresServer  # noqa: E402
from worker_lib.testing.processes import ProcessFleet  # noqa: E402
from worker_lib.testing.producers import Producer, shard_hash_keys  # noqa: E402
from worker_lib.testing.streams import create_stream, list_all_shards  # noqa: E402
from worker_lib.worker.worker import Worker, WorkerConfig  # noqa: E402

WORKER_ID = "bench-exactly-once"
PAYLOAD_BYTES = 100
LABELS = {
    AT_LEAST_ONCE: "at-least-once",
    DYNAMODB_TRANSACTION: "dynamodb-transaction",
    SQL_POSITION: "sql-position",
    AT_LEAST_ONCE_SQL: "at-least-once-sql",
}
EXACTLY_ONCE = (DYNAMODB_TRANSACTION, SQL_POSITION)
PROCESSOR = "exactly_once_support.processor:from_env"
POSITION_SINK = "exactly_once_support.processor:positions"

# The kill runs' processes: 3 s leases, a leader in every process (the lock picks one), short cycles.
KILL_ENV = {
    "SHARDLEASE_LEADER_MODE": "embedded",
    "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
    "SHARDLEASE_FAILOVER_TIME_MS": "3000",
    "SHARDLEASE_DISCOVERY_INTERVAL_MS": "200",
    "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS": "100",
    "SHARDLEASE_LEADER_LOCK_DURATION_MS": "3000",
    "SHARDLEASE_LEADER_HEARTBEAT_MS": "1000",
    "SHARDLEASE_MAX_CLOCK_SKEW_MS": "500",
    "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "500",
    "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "1000",
}
HOLD_TIMEOUT_S = 120.0  # a fresh process holding every lease of a killed one's (lock and leases expire: ~8 s)
DRAIN_TIMEOUT_S = 300.0


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(poll_s)


def scan(dynamodb: Any, table: str, projection: str) -> Iterator[dict[str, Any]]:
    """Every item of ``table`` (consistent reads), the attributes ``projection`` names."""
    pages = dynamodb.get_paginator("scan").paginate(
        TableName=table, ProjectionExpression=projection, ConsistentRead=True
    )
    for page in pages:
        yield from page["Items"]


# --- 1. throughput ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    mode: str
    round_no: int
    records: int
    rate: float
    deliveries: int
    checked: bool  # every output there once, every checkpoint at its shard's last record


class Throughput:
    def __init__(self, endpoint_url: str, dsn: str, args: argparse.Namespace, tag: str) -> None:
        self.ddb = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint_url))
        self.kinesis = aws.client("kinesis", AwsConfig(endpoint_url=endpoint_url, read_timeout_s=60))
        self.dsn, self.args, self.tag = dsn, args, tag

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn)

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        with self.connect() as connection, connection.cursor() as cursor:
            cursor.execute(statement)
            return list(cursor.fetchall()) if cursor.description else []

    def prepare(self, app: str) -> tuple[str, dict[str, str]]:
        """A fresh stream, filled evenly, and a lease table whose TRIM_HORIZON leases are ours; (stream, shard id ->
        the sequence number of its last record)."""
        stream = f"{app}-s"
        create_stream(self.kinesis, stream, self.args.shards)
        keys = shard_hash_keys(self.kinesis, stream)
        last: dict[str, str] = {}
        for start in range(0, self.args.records, 500):
            entries = [
                {
                    "Data": f"r{n:07d}|".encode().ljust(PAYLOAD_BYTES, b"x"),
                    "PartitionKey": f"pk-{n}",
                    "ExplicitHashKey": keys[n % len(keys)],
                }
                for n in range(start, min(self.args.records, start + 500))
            ]
            reply = self.kinesis.put_records(StreamName=stream, Records=entries)
            assert reply.get("FailedRecordCount", 0) == 0
            for result in reply["Records"]:
                last[result["ShardId"]] = result["SequenceNumber"]  # in order within a shard
        ensure_tables(app, self.ddb)
        store = DynamoDBLeaseStore(app, client=self.ddb)
        for shard in list_all_shards(self.kinesis, stream):
            store.create_lease_if_absent(Lease(lease_key=shard["ShardId"], checkpoint=TRIM_HORIZON))
            lease = store.get_lease(shard["ShardId"])
            assert lease is not None and store.assign_lease(lease, WORKER_ID)
        return stream, last

    def measure(self, mode: str, round_no: int) -> Result:
        app = f"bench-eo-{self.tag}-{round_no}-{MODES.index(mode)}"
        table = app.replace("-", "_")
        stream, last = self.prepare(app)
        positions: SqlPositions | None = None
        if mode in SQL_MODES:
            self.sql(item_table_sql(table))
            if mode == SQL_POSITION:
                positions = SqlPositions(self.connect, application=app, dialect="postgresql")
                positions.create_table()
        else:
            create_output_table(self.ddb, table)
        tally = Tally(expected=self.args.records)
        processors: list[EffectsProcessor] = []
        lock = threading.Lock()

        def make() -> EffectsProcessor:
            processor = EffectsProcessor(
                mode,
                table=table,
                dynamodb=self.ddb if mode == AT_LEAST_ONCE else None,
                connect=self.connect if mode in SQL_MODES else None,
                positions=positions,
                observers=[tally],
            )
            with lock:
                processors.append(processor)
            return processor

        config = WorkerConfig(
            app=app,
            stream=stream,
            worker_id=WORKER_ID,
            lease=LeaseConfig(failover_time_ms=10_000),
            retrieval=RetrievalConfig(idle_time_between_reads_ms=200, max_records=self.args.max_records),
            discovery_interval_ms=100,
            shutdown_timeout_ms=15_000,
        )
        worker = Worker(config, make, dynamodb=self.ddb, kinesis=self.kinesis, position_sink=positions)
        try:
            worker.start()
            if not tally.finished.wait(self.args.run_timeout):
                raise SystemExit(
                    f"{LABELS[mode]}: {tally.done} of {self.args.records} records done in {self.args.run_timeout:.0f} s"
                )
        finally:
            worker.shutdown(timeout_s=15)
            for processor in processors:
                processor.close()
        checked = self.outputs(mode, table) == self.args.records and self.checkpoints(app) == last
        self.drop(mode, table, stream)
        return Result(mode, round_no, self.args.records, tally.rate(), tally.deliveries, checked)

    def outputs(self, mode: str, table: str) -> int:
        """How many outputs the run left (the same as its records: one each, each key once)."""
        if mode in SQL_MODES:
            ((count,),) = self.sql(f"SELECT count(DISTINCT pk) FROM {table}")
            return int(count)
        return sum(1 for _ in scan(self.ddb, table, "pk"))

    def checkpoints(self, app: str) -> dict[str, str]:
        return {
            lease.lease_key: lease.checkpoint.sequence
            for lease in DynamoDBLeaseStore(app, client=self.ddb).list_leases()
        }

    def drop(self, mode: str, table: str, stream: str) -> None:
        """Free what the run made (moto keeps everything in memory)."""
        if mode in SQL_MODES:
            self.sql(f"DROP TABLE {table}")
        else:
            self.ddb.delete_table(TableName=table)
        self.kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)


def run_throughput(bench: Throughput, rounds: int) -> list[Result]:
    results: list[Result] = []
    print(f"{'mode':<22} {'round':>5} {'records':>7} {'s':>6} {'records/s':>9} {'deliveries':>10} {'checked':>7}")
    for round_no in range(rounds):
        order = MODES[round_no % len(MODES) :] + MODES[: round_no % len(MODES)]
        for mode in order:
            result = bench.measure(mode, round_no)
            results.append(result)
            print(
                f"{LABELS[mode]:<22} {round_no:>5} {result.records:>7} {result.records / result.rate:>6.2f} "
                f"{result.rate:>9.0f} {result.deliveries:>10} {'yes' if result.checked else 'NO':>7}",
                flush=True,
            )
    return results


# --- 2. duplicates after kills ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tallied:
    mode: str
    produced: int
    duplicated: int  # records whose effect landed more than once
    extra: int  # effects beyond one per record
    lost: int  # produced, no effect
    unknown: int  # effects of records never produced (expected 0)
    redelivered: int  # records delivered more than once (the journals)
    ahead: int | None  # SQL sinks: records applied past the lease checkpoint when the kills landed, summed


class Kills:
    def __init__(
        self, moto: str, dsn: str, work: Path, fleet: ProcessFleet, *, args: argparse.Namespace, tag: str
    ) -> None:
        self.moto, self.dsn, self.work, self.fleet, self.args = moto, dsn, work, fleet, args
        self.ddb = aws.client("dynamodb", AwsConfig(endpoint_url=moto))
        self.kinesis = aws.client("kinesis", AwsConfig(endpoint_url=moto, read_timeout_s=60))
        self.stream = f"bench-eo-{tag}-kills"
        self.apps = {mode: f"bench-eo-{tag}-kill-{MODES.index(mode)}" for mode in MODES}
        self.tables = {mode: app.replace("-", "_") for mode, app in self.apps.items()}
        self.current: dict[str, str] = {}  # mode -> the name (= worker id) of its running process
        self.journals = work / "journals"
        self.journals.mkdir()

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.dsn) as connection, connection.cursor() as cursor:
            cursor.execute(statement, params)
            return list(cursor.fetchall()) if cursor.description else []

    def prepare(self) -> None:
        create_stream(self.kinesis, self.stream, self.args.kill_shards)
        for mode, app in self.apps.items():
            ensure_tables(app, self.ddb)
            if mode in SQL_MODES:
                self.sql(count_table_sql(self.tables[mode]))
            else:
                create_output_table(self.ddb, self.tables[mode])
        import psycopg

        SqlPositions(lambda: psycopg.connect(self.dsn), application="-", dialect="postgresql").create_table()

    def start(self, mode: str, generation: int) -> None:
        name = f"{LABELS[mode]}-{generation}"
        env = {
            "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench'}",
            "SHARDLEASE_ENDPOINT_URL": self.moto,
            **KILL_ENV,
            "BENCH_MODE": mode,
            "BENCH_APP": self.apps[mode],
            "BENCH_TABLE": self.tables[mode],
            "BENCH_DSN": self.dsn,
            "BENCH_HOLD_MS": str(self.args.hold_ms),
            "BENCH_JOURNAL_DIR": str(self.journals),
        }
        argv = ["worker", "--app", self.apps[mode], "--stream", self.stream, "--endpoint-url", self.moto]
        argv += ["--processor", PROCESSOR, "--worker-id", name]
        if mode == SQL_POSITION:
            argv += ["--position-sink", POSITION_SINK]
        self.fleet.start_shardlease(name, *argv, env=env)
        self.current[mode] = name

    def holding(self, mode: str) -> bool:
        """Whether the mode's current process holds a lease on every shard."""
        leases = DynamoDBLeaseStore(self.apps[mode], client=self.ddb).list_leases()
        owner = self.current[mode]
        return len(leases) == self.args.kill_shards and all(lease.lease_owner == owner for lease in leases)

    def all_holding(self) -> bool:
        return all(self.holding(mode) for mode in MODES)

    def past_checkpoint(self, mode: str) -> int:
        """Records of an SQL sink applied past the lease checkpoint of their shard (its process just killed): what
        a replacement starting at the lease checkpoint would apply again."""
        past = 0
        for lease in DynamoDBLeaseStore(self.apps[mode], client=self.ddb).list_leases():
            after = lease.checkpoint.sequence if lease.checkpoint.is_real else "-1"
            ((count,),) = self.sql(
                f"SELECT count(DISTINCT rid) FROM {self.tables[mode]} WHERE shard = %s AND seq::numeric > %s::numeric",
                (lease.lease_key, after),
            )
            past += int(count)
        return past

    def effects(self, mode: str) -> Counter[str]:
        """Record id -> how many times its effect landed in the mode's sink."""
        table = self.tables[mode]
        if mode in SQL_MODES:
            return Counter({rid: int(n) for rid, n in self.sql(f"SELECT rid, count(*) FROM {table} GROUP BY rid")})
        if mode == AT_LEAST_ONCE:
            return Counter(item["rid"]["S"] for item in scan(self.ddb, table, "rid"))
        return Counter({item["pk"]["S"]: int(item["n"]["N"]) for item in scan(self.ddb, table, "pk, n")})

    def deliveries(self, mode: str) -> Counter[str]:
        found: Counter[str] = Counter()
        for path in self.journals.glob(f"{self.apps[mode]}-*.jnl"):
            found.update(path.read_text(encoding="utf-8").split())
        return found

    def run(self) -> dict[str, Tallied]:
        args = self.args
        rng = random.Random(args.seed)
        self.prepare()
        for mode in MODES:
            self.start(mode, 0)
        wait_for("every application's leases held", self.all_holding, HOLD_TIMEOUT_S + 60)
        keys = shard_hash_keys(self.kinesis, self.stream)
        per_tick = max(1, args.rate // 10)
        ahead: Counter[str] = Counter()
        with Producer(
            self.kinesis, self.stream, per_tick=per_tick, tick_s=0.1, prefix="k", hash_keys=keys, payload_bytes=100
        ) as producer:
            for kill in range(1, args.kills + 1):
                time.sleep(args.kill_every + rng.random())  # a steady flow: records in flight at the kill
                for mode in MODES:
                    self.fleet.kill(self.current[mode])
                for mode in SQL_MODES:
                    ahead[mode] += self.past_checkpoint(mode)
                for mode in MODES:
                    self.start(mode, kill)
                killed_at = time.monotonic()
                wait_for(f"kill {kill}: replacements holding every lease", self.all_holding, HOLD_TIMEOUT_S)
                print(
                    f"kill {kill}: every application's process SIGKILLed and replaced, "
                    f"leases held again after {time.monotonic() - killed_at:.1f} s",
                    flush=True,
                )
            time.sleep(args.kill_every)  # the last replacements working under the flow
        produced = set(producer.produced)

        def drained() -> bool:
            return all(produced <= set(self.effects(mode)) for mode in MODES)

        wait_for("every sink holding every record produced", drained, DRAIN_TIMEOUT_S, poll_s=1.0)
        codes = self.fleet.stop([self.current[mode] for mode in MODES], timeout_s=60)
        if any(code != 0 for code in codes.values()):
            print(f"exit codes at the stop: {codes}", flush=True)
        results: dict[str, Tallied] = {}
        for mode in MODES:
            effects = self.effects(mode)
            delivered = self.deliveries(mode)
            results[mode] = Tallied(
                mode=mode,
                produced=len(produced),
                duplicated=sum(1 for rid, n in effects.items() if n > 1 and rid in produced),
                extra=sum(n - 1 for rid, n in effects.items() if n > 1 and rid in produced),
                lost=len(produced - set(effects)),
                unknown=sum(1 for rid in effects if rid not in produced),
                redelivered=sum(1 for rid, n in delivered.items() if n > 1 and rid in produced),
                ahead=ahead[mode] if mode in SQL_MODES else None,
            )
        return results


# --- the report ---------------------------------------------------------------------------------------------------


def medians(results: list[Result]) -> Mapping[str, float]:
    return {mode: statistics.median(r.rate for r in results if r.mode == mode) for mode in MODES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=16_000, help="records of every throughput run")
    parser.add_argument("--shards", type=int, default=4, help="shards of every throughput run's stream")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four throughput modes")
    parser.add_argument("--max-records", type=int, default=10_000, help="GetRecords limit (records per batch)")
    parser.add_argument("--run-timeout", type=float, default=600.0, help="s: a throughput run longer than this hangs")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs of every application's process (0: none)")
    parser.add_argument("--kill-every", type=float, default=5.0, help="s between a replacement and the next kill")
    parser.add_argument("--rate", type=int, default=200, help="records/s the kill runs' producer writes")
    parser.add_argument("--hold-ms", type=int, default=300, help="sleep between a batch's write and its checkpoint")
    parser.add_argument("--kill-shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument(
        "--moto",
        choices=("item-rollback", "as-shipped"),
        default="item-rollback",
        help="TransactWriteItems' rollback copy: of the items it touches (bench/exactly_once_support/"
        "moto_rollback.py), or of whole tables, once per action (moto as shipped: cost grows with the table)",
    )
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before the runs", flush=True)
    tag = uuid.uuid4().hex[:6]
    tallied: dict[str, Tallied] = {}
    with tempfile.TemporaryDirectory(prefix="bench-exactly-once-") as tmp:
        work = Path(tmp)
        launch = start_moto_item_rollback if args.moto == "item-rollback" else start_moto
        with launch(log_path=work / "moto.log") as moto, PostgresServer.start() as postgres:
            print(f"{moto.source} at {moto.endpoint_url}; PostgreSQL {postgres.binaries.postgres}", flush=True)
            dsn = postgres.create_database("bench_exactly_once")
            results = run_throughput(Throughput(moto.endpoint_url, dsn, args, tag), args.rounds)
            print(f"load average after the throughput runs: {os.getloadavg()[0]:.2f}", flush=True)
            if args.kills:
                with ProcessFleet(work, env=dict(os.environ), cwd=REPO, log_level="WARNING") as fleet:
                    tallied = Kills(moto.endpoint_url, dsn, work, fleet, args=args, tag=tag).run()
    rate = medians(results)
    a, d, s, a_sql = (rate[m] for m in (AT_LEAST_ONCE, DYNAMODB_TRANSACTION, SQL_POSITION, AT_LEAST_ONCE_SQL))
    unchecked = [f"{LABELS[r.mode]} round {r.round_no}" for r in results if not r.checked]
    if unchecked:
        print(f"NOT CHECKED (an output missing or twice, or a checkpoint short): {', '.join(unchecked)}")
    print(
        f"medians of {args.rounds} rounds, {args.records} records on {args.shards} shards: "
        + ", ".join(f"{LABELS[m]} {rate[m]:.0f}" for m in MODES)
        + " records/s"
    )
    print(
        f"like for like in PostgreSQL: at-least-once-sql {a_sql:.0f}, sql-position {s:.0f} (S/A_sql {s / a_sql:.2f}×)"
    )
    for mode, t in tallied.items():
        print(
            f"kills, {LABELS[mode]:<20}: {t.produced} produced, {t.duplicated} duplicated records "
            f"({t.extra} extra effects), {t.lost} lost, {t.unknown} unknown; {t.redelivered} records delivered "
            "more than once"
            + ("" if t.ahead is None else f"; {t.ahead} applied past the lease checkpoint at the kills"),
            flush=True,
        )
    at_least_once = sum(t.duplicated for m, t in tallied.items() if m not in EXACTLY_ONCE)
    exactly_once = sum(t.duplicated for m, t in tallied.items() if m in EXACTLY_ONCE)
    lost = sum(t.lost for t in tallied.values())
    if tallied:
        print(
            f"lost records: at-least-once {sum(t.lost for m, t in tallied.items() if m not in EXACTLY_ONCE)}, "
            f"exactly-once {sum(t.lost for m, t in tallied.items() if m in EXACTLY_ONCE)}"
        )
    print(f"load average after the runs: {os.getloadavg()[0]:.2f}")
    print(
        f"exactly-once: records/s at-least-once {a:.0f}, dynamodb-transaction {d:.0f} (D/A {d / a:.2f}×), "
        f"sql-position {s:.0f} (S/A {s / a:.2f}×); duplicates after {args.kills} kills: "
        f"at-least-once {at_least_once}, exactly-once {exactly_once}"
    )
    return 1 if lost or exactly_once or unchecked else 0


if __name__ == "__main__":
    sys.exit(main())
