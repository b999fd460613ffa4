"""Poison records under the skip-and-record failure policy, against a clean run of the same flow.

Real `shardlease worker` processes (embedded leader); Kinesis on kinesalite, leases and the failure destination (an
SQS queue) on moto. The policy at its documented defaults (3 attempts, 0.5 s backoff doubling, bisection), batches
of up to 1 000 records (``SHARDLEASE_MAX_RECORDS``), ``--shards`` shards. Runs alternate, ``--rounds`` times:

* **clean**: the processor takes every record;
* **poison**: the same processor fails a batch that holds a poison record — one per 10 000 at seeded random
  positions (a transactional processor: nothing of the failing batch is written).

1. **Steady flow (the bar).** A fresh stream per run; once the worker holds its leases, a producer writes
   ``--rate`` records a second for ``--seconds``. Figures: **throughput** — records processed per second, from the
   first record written to the last processed; **stall** — for each poison record, from its first failed delivery
   to the first record after it processed on its shard. Every poison record must reach the queue, and no other.
2. **Backlog (context).** The same on a backlog of ``--backlog-per-shard`` records a shard, read from TRIM_HORIZON:
   there the throughput is the catch-up speed, and a poisoned shard's retries (1.5 s of backoff) weigh on a
   catch-up that takes seconds.

    .venv/bin/python bench/failures.py [--shards 8] [--rate 1000] [--seconds 30] [--rounds 2] [--backlog-per-shard 5000]

The last line: ``poison records: 1 per 10k, policy skip-and-record: shard stalled max S s, throughput T× of a clean
run`` (the steady flow's figures).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from worker_lib.core import aws  # noqa: E402
from worker_lib.core.config import AwsConfig  # noqa: E402
from worker_lib.leases.dynamodb import DynamoDBLeaseStore  # noqa: E402
from worker_lib.tables.admin import ensure_tables  # noqa: E402
from worker_lib.testing.emulators import start_kinesalite, start_moto  # noqa: E402
from worker_lib.testing.processes import ProcessFleet  # noqa: E402
from worker_lib.testing.producers import Producer, shard_hash_keys  # noqa: E402
from worker_lib.testing.streams import create_stream, list_all_shards, record_positions  # noqa: E402

PROCESSOR = "failures_support.processor:Poisoned"
POISON_PER = 10_000
REGION, ACCOUNT = "us-east-1", "123456789012"


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def processed_ids_count(lines: list[dict[str, Any]]) -> int:
    return sum(int(x["records"]) for x in lines if x["failed"] is None)


def processed_at_least(out: Path, count: int) -> bool:
    return processed_ids_count(lines_of(out)) >= count


class Bench:
    def __init__(self, fleet: ProcessFleet, work: Path, moto: str, kinesalite: str, queue_arn: str) -> None:
        self.fleet, self.work, self.moto, self.kinesalite, self.queue_arn = fleet, work, moto, kinesalite, queue_arn

    def start(self, app: str, stream: str, poison_ids: list[str]) -> Path:
        """Start the application's worker; the file its processor journals to."""
        ensure_tables(app, aws.client("dynamodb", AwsConfig(endpoint_url=self.moto)))
        out = self.work / f"{app}.jsonl"
        env = {
            "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench'}",
            "SHARDLEASE_LEADER_MODE": "embedded",
            "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
            "SHARDLEASE_KINESIS_ENDPOINT_URL": self.kinesalite,
            "SHARDLEASE_MAX_RECORDS": "1000",
            "SHARDLEASE_FAILURE_POLICY": "skip-and-record",
            "SHARDLEASE_FAILURE_DESTINATION": self.queue_arn,
            "BENCH_OUT": str(out),
            "BENCH_POISON": ",".join(poison_ids),
        }
        argv = ["--app", app, "--stream", stream, "--endpoint-url", self.moto, "--processor", PROCESSOR]
        self.fleet.start_shardlease(app, "worker", *argv, env=env)
        return out

    def holding(self, app: str, shards: int) -> bool:
        """Whether the worker holds a lease on every shard (then the flow starts)."""
        store = DynamoDBLeaseStore(app, client=aws.client("dynamodb", AwsConfig(endpoint_url=self.moto)))
        leases = store.list_leases()
        return len(leases) == shards and all(lease.lease_owner for lease in leases)


def wait_for(what: str, predicate: Any, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.2)


def stalls_of(lines: list[dict[str, Any]], poison: dict[str, str]) -> list[float]:
    """Per poison record (id -> sequence number): first failed delivery -> first record after it processed."""
    out = []
    for identifier, sequence in poison.items():
        fails = [x for x in lines if x["failed"] == identifier]
        if not fails:
            raise SystemExit(f"poison record {identifier} was never delivered")
        t0, shard = fails[0]["at"], fails[0]["shard"]
        after = [
            x["at"]
            for x in lines
            if x["shard"] == shard and x["failed"] is None and x["records"] and int(x["first"]) > int(sequence)
        ]
        if after:  # else nothing came after it on that shard
            out.append(min(after) - t0)
    return out


def drain(sqs: Any, queue_url: str) -> list[str]:
    """The sequence numbers the queue's reports name (one record each here), emptying it."""
    found: list[str] = []
    while True:
        got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not got:
            return found
        for message in got:
            info = json.loads(message["Body"])["KinesisBatchInfo"]
            if info["startSequenceNumber"] != info["endSequenceNumber"]:
                raise SystemExit(f"a report covers more than one record: {info}")
            found.append(info["startSequenceNumber"])
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rate", type=int, default=1000, help="records per second written in the steady runs")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each steady run writes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backlog-per-shard", type=int, default=5_000, help="0: no backlog runs")
    parser.add_argument("--seed", type=int, default=20240607)
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before the runs", flush=True)
    rng = random.Random(args.seed)
    steady_total = int(args.rate * args.seconds)
    steady_poison = sorted(f"s{n:07d}" for n in rng.sample(range(steady_total), max(1, steady_total // POISON_PER)))
    per_tick = max(1, args.rate // 10)
    throughput: dict[str, list[float]] = {"clean": [], "poison": []}
    backlog_rate: dict[str, list[float]] = {"clean": [], "poison": []}
    stalls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-failures-") as tmp:
        work = Path(tmp)
        with (
            start_moto(log_path=work / "moto.log") as moto,
            start_kinesalite(log_path=work / "kinesalite.log") as kinesalite,
            ProcessFleet(work, env=dict(os.environ), cwd=REPO, log_level="WARNING") as fleet,
        ):
            kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesalite.endpoint_url, read_timeout_s=60))
            sqs = aws.client("sqs", AwsConfig(endpoint_url=moto.endpoint_url, region=REGION))
            tag = uuid.uuid4().hex[:6]
            queue_url = sqs.create_queue(QueueName=f"bench-{tag}-failed")["QueueUrl"]
            bench = Bench(
                fleet,
                work,
                moto.endpoint_url,
                kinesalite.endpoint_url,
                f"arn:aws:sqs:{REGION}:{ACCOUNT}:bench-{tag}-failed",
            )
            # 1. steady flow
            for round_no in range(args.rounds):
                for kind in ("clean", "poison"):
                    app = stream = f"bench-{tag}-{kind}-{round_no}"
                    create_stream(kinesis, stream, args.shards)
                    chosen = steady_poison if kind == "poison" else []
                    out = bench.start(app, stream, chosen)
                    wait_for(f"{app} leases", functools.partial(bench.holding, app, args.shards))
                    keys = shard_hash_keys(kinesis, stream)
                    with Producer(
                        kinesis, stream, per_tick=per_tick, tick_s=0.1, prefix="s", hash_keys=keys
                    ) as producer:
                        began = time.monotonic()
                        time.sleep(args.seconds)  # a steady flow for a fixed time: real time is what is measured
                    produced = len(producer.produced)
                    expected = produced - sum(1 for r in chosen if r in set(producer.produced))
                    wait_for(f"{app} done", functools.partial(processed_at_least, out, expected))
                    fleet.stop([app], timeout_s=60)
                    lines = lines_of(out)
                    done = max(x["at"] for x in lines if x["failed"] is None and x["records"])
                    rate = processed_ids_count(lines) / (done - began)
                    throughput[kind].append(rate)
                    made = [r for r in chosen if r in set(producer.produced)]
                    positions = record_positions(kinesis, stream)
                    where = {identifier: positions[identifier][1] for identifier in made}
                    run_stalls = stalls_of(lines, where)
                    stalls += run_stalls
                    reported = sorted(set(drain(sqs, queue_url)))
                    if reported != sorted(where.values()):
                        raise SystemExit(f"{app}: the queue names {reported}, expected {sorted(where.values())}")
                    text = f"; {len(made)} poison, stalls {', '.join(f'{x:.2f}' for x in run_stalls)} s" if made else ""
                    print(
                        f"steady {kind:6s} round {round_no}: {produced} written, {rate:,.0f} processed/s{text}",
                        flush=True,
                    )
            # 2. backlog (context)
            if args.backlog_per_shard:
                for round_no in range(args.rounds):
                    for kind in ("clean", "poison"):
                        backlog_rate[kind].append(
                            backlog_run(
                                bench,
                                kinesis=kinesis,
                                sqs=sqs,
                                queue_url=queue_url,
                                tag=tag,
                                kind=kind,
                                round_no=round_no,
                                args=args,
                                rng=rng,
                            )
                        )
    ratio = statistics.median(throughput["poison"]) / statistics.median(throughput["clean"])
    if args.backlog_per_shard:
        clean, poisoned = statistics.median(backlog_rate["clean"]), statistics.median(backlog_rate["poison"])
        print(f"backlog catch-up (context): clean {clean:,.0f}/s, poison {poisoned:,.0f}/s ({poisoned / clean:.2f}×)")
    print(f"load average after the runs: {os.getloadavg()[0]:.2f}")
    print(
        f"poison records: 1 per 10k, policy skip-and-record: shard stalled max {max(stalls):.1f} s, "
        f"throughput {ratio:.2f}× of a clean run"
    )
    return 0


def backlog_run(
    bench: Bench,
    *,
    kinesis: Any,
    sqs: Any,
    queue_url: str,
    tag: str,
    kind: str,
    round_no: int,
    args: Any,
    rng: random.Random,
) -> float:
    stream = app = f"bench-{tag}-backlog-{kind}-{round_no}"
    create_stream(kinesis, stream, args.shards)
    keys = shard_hash_keys(kinesis, stream)
    total = args.backlog_per_shard * len(keys)
    numbers = set(rng.sample(range(total), max(1, total // POISON_PER))) if kind == "poison" else set()
    last: dict[str, int] = {}
    shard_of = {s["HashKeyRange"]["StartingHashKey"]: s["ShardId"] for s in list_all_shards(kinesis, stream)}
    for start in range(0, total, 500):
        entries = [
            {"Data": f"b{n:07d}|".encode() + b"x" * 90, "PartitionKey": f"k{n}", "ExplicitHashKey": keys[n % len(keys)]}
            for n in range(start, min(total, start + 500))
        ]
        reply = kinesis.put_records(StreamName=stream, Records=entries)
        for entry, result in zip(entries, reply["Records"], strict=True):
            shard = shard_of[entry["ExplicitHashKey"]]
            last[shard] = max(last.get(shard, 0), int(result["SequenceNumber"]))
    out = bench.start(app, stream, sorted(f"b{n:07d}" for n in numbers))

    def caught_up() -> bool:
        reached = {
            x["shard"]
            for x in lines_of(out)
            if x["failed"] is None and x["last"] and int(x["last"]) >= last[x["shard"]]
        }
        return reached == set(last)

    wait_for(f"{app} caught up", caught_up)
    bench.fleet.stop([app], timeout_s=60)
    lines = lines_of(out)
    first = min(x["at"] for x in lines)
    done = max(x["at"] for x in lines if x["failed"] is None and x["records"])
    drain(sqs, queue_url)
    rate = processed_ids_count(lines) / float(done - first)
    print(f"backlog {kind:6s} round {round_no}: {total} records, {rate:,.0f}/s", flush=True)
    return rate


if __name__ == "__main__":
    sys.exit(main())
