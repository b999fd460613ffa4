"""Poison records under the skip-and-record failure policy, against a clean run of the same records.

Real `shardlease worker` processes (embedded leader); Kinesis on kinesalite, leases and the failure destination (an
SQS queue) on moto. One stream of ``--shards`` shards gets a backlog of ``--records-per-shard`` 100-byte records
each, with one poison record per 10 000 at seeded random positions, and a producer keeps writing ``--rate``
records a second (never poison) for the whole run. Then, ``--rounds`` times, alternating, an application reads
the stream from TRIM_HORIZON with the policy at its documented defaults (3 attempts, 0.5 s backoff doubling,
bisection) and batches of up to 1 000 records (``SHARDLEASE_MAX_RECORDS``):

* **clean**: the processor takes every record;
* **poison**: the same processor fails a batch that holds a poison record (a transactional processor: nothing of
  the batch is written).

Figures: **throughput** — records processed per second from the first delivery until every shard is past its
backlog (caught up); **stall** — for each poison record, the time from its first failed delivery to the next
record processed on its shard; every poison record must reach the queue, and no other record.

    .venv/bin/python bench/failures.py [--shards 8] [--records-per-shard 5000] [--rate 200] [--rounds 2]

The last line: ``poison records: 1 per 10k, policy skip-and-record: shard stalled max S s, throughput T× of a clean
run``.
"""

from __future__ import annotations

import argparse
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
from worker_lib.tables.admin import ensure_tables  # noqa: E402
from worker_lib.testing.emulators import start_kinesalite, start_moto  # noqa: E402
from worker_lib.testing.processes import ProcessFleet  # noqa: E402
from worker_lib.testing.producers import Producer, shard_hash_keys  # noqa: E402
from worker_lib.testing.streams import create_stream, list_all_shards  # noqa: E402

PROCESSOR = "failures_support.processor:Poisoned"
POISON_PER = 10_000
REGION, ACCOUNT = "us-east-1", "123456789012"


def fill(kinesis: Any, stream: str, per_shard: int, poison: set[int]) -> tuple[dict[str, int], dict[int, str]]:
    """The backlog: record n (id ``b<n>``) to shard n mod shards; each shard's last sequence number, and the
    sequence number of each poison record."""
    keys = shard_hash_keys(kinesis, stream)
    total = per_shard * len(keys)
    shard_of = {s["HashKeyRange"]["StartingHashKey"]: s["ShardId"] for s in list_all_shards(kinesis, stream)}
    last: dict[str, int] = {}
    poison_sequence: dict[int, str] = {}
    for start in range(0, total, 500):
        entries = [
            {
                "Data": f"b{n:07d}|".encode() + (b"x" * 90),
                "PartitionKey": f"k{n}",
                "ExplicitHashKey": keys[n % len(keys)],
            }
            for n in range(start, min(total, start + 500))
        ]
        reply = kinesis.put_records(StreamName=stream, Records=entries)
        assert reply.get("FailedRecordCount", 0) == 0, "the backlog could not be written"
        for n, (entry, result) in enumerate(zip(entries, reply["Records"], strict=True), start=start):
            shard = shard_of[entry["ExplicitHashKey"]]
            last[shard] = max(last.get(shard, 0), int(result["SequenceNumber"]))
            if n in poison:
                poison_sequence[n] = result["SequenceNumber"]
    return last, poison_sequence


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def caught_up(lines: list[dict[str, Any]], last: dict[str, int]) -> float | None:
    """When every shard's processed records reached its backlog's last record (monotonic), else None."""
    reached: dict[str, float] = {}
    for line in lines:
        if line["failed"] is None and line["last"] is not None and int(line["last"]) >= last[line["shard"]]:
            reached.setdefault(line["shard"], line["at"])
    return max(reached.values()) if set(reached) == set(last) else None


def start_run(
    fleet: ProcessFleet,
    *,
    work: Path,
    moto: str,
    kinesalite: str,
    stream: str,
    app: str,
    poison_ids: list[str],
    queue_arn: str,
) -> Path:
    """Start the application's worker; the file its processor journals to."""
    ensure_tables(app, aws.client("dynamodb", AwsConfig(endpoint_url=moto)))
    out = work / f"{app}.jsonl"
    env = {
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench'}",
        "SHARDLEASE_LEADER_MODE": "embedded",
        "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
        "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesalite,
        "SHARDLEASE_MAX_RECORDS": "1000",
        "SHARDLEASE_FAILURE_POLICY": "skip-and-record",
        "SHARDLEASE_FAILURE_DESTINATION": queue_arn,
        "BENCH_OUT": str(out),
        "BENCH_POISON": ",".join(poison_ids),
    }
    argv = ["--app", app, "--stream", stream, "--endpoint-url", moto, "--processor", PROCESSOR]
    fleet.start_shardlease(app, "worker", *argv, env=env)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--records-per-shard", type=int, default=5_000)
    parser.add_argument("--rate", type=int, default=200, help="records per second written during the runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=20240607)
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before the runs", flush=True)
    total = args.shards * args.records_per_shard
    rng = random.Random(args.seed)
    poison_numbers = set(rng.sample(range(total), max(1, total // POISON_PER)))
    poison_ids = sorted(f"b{n:07d}" for n in poison_numbers)
    with tempfile.TemporaryDirectory(prefix="bench-failures-") as tmp:
        work = Path(tmp)
        with start_moto(log_path=work / "moto.log") as moto, start_kinesalite(log_path=work / "kinesalite.log") as kl:
            kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kl.endpoint_url, read_timeout_s=60))
            sqs = aws.client("sqs", AwsConfig(endpoint_url=moto.endpoint_url, region=REGION))
            stream = f"bench-fail-{uuid.uuid4().hex[:6]}"
            create_stream(kinesis, stream, args.shards)
            queue_url = sqs.create_queue(QueueName=f"{stream}-failed")["QueueUrl"]
            queue_arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{stream}-failed"
            started = time.monotonic()
            last, poison_sequence = fill(kinesis, stream, args.records_per_shard, poison_numbers)
            print(f"backlog: {total} records, poison {', '.join(poison_ids)}, in {time.monotonic() - started:.0f} s")
            throughput: dict[str, list[float]] = {"clean": [], "poison": []}
            stalls: list[float] = []
            per_tick = max(1, args.rate // 10)
            with (
                Producer(kinesis, stream, per_tick=per_tick, tick_s=0.1, prefix="s", name="steady"),
                ProcessFleet(work, env=dict(os.environ), cwd=REPO, log_level="WARNING") as fleet,
            ):
                for round_no in range(args.rounds):
                    for kind in ("clean", "poison"):
                        app = f"{stream}-{kind}-{round_no}"
                        chosen = poison_ids if kind == "poison" else []
                        out = start_run(
                            fleet,
                            work=work,
                            moto=moto.endpoint_url,
                            kinesalite=kl.endpoint_url,
                            stream=stream,
                            app=app,
                            poison_ids=chosen,
                            queue_arn=queue_arn,
                        )
                        deadline = time.monotonic() + 600
                        done_at = None
                        while done_at is None and time.monotonic() < deadline:
                            time.sleep(0.2)
                            done_at = caught_up(lines_of(out), last)
                        if done_at is None:
                            raise SystemExit(f"{app}: not caught up within 600 s")
                        fleet.stop([app], timeout_s=60)
                        lines = lines_of(out)
                        first = min(line["at"] for line in lines)
                        processed = sum(x["records"] for x in lines if x["failed"] is None and x["at"] <= done_at)
                        rate = processed / (done_at - first)
                        throughput[kind].append(rate)
                        run_stalls = []
                        for poison in chosen:
                            fails = [x for x in lines if x["failed"] == poison]
                            if not fails:
                                raise SystemExit(f"{app}: poison record {poison} was never delivered")
                            t0, shard = fails[0]["at"], fails[0]["shard"]
                            after = [
                                x["at"]
                                for x in lines
                                if x["shard"] == shard and x["failed"] is None and x["records"] and x["at"] > t0
                            ]
                            run_stalls.append(min(after) - t0)
                        stalls += run_stalls
                        reported = sorted(set(drain(sqs, queue_url)))
                        expected = sorted(poison_sequence[n] for n in poison_numbers) if chosen else []
                        if reported != expected:
                            raise SystemExit(f"{app}: the queue names records {reported}, expected {expected}")
                        window = done_at - first
                        stall_text = f"; stalls {', '.join(f'{s:.2f}' for s in run_stalls)} s" if run_stalls else ""
                        said = f"{kind:6s} round {round_no}: {processed} records in {window:.1f} s = {rate:,.0f}/s"
                        print(said + stall_text, flush=True)
    ratio = statistics.median(throughput["poison"]) / statistics.median(throughput["clean"])
    print(f"load average after the runs: {os.getloadavg()[0]:.2f}")
    print(
        f"poison records: 1 per 10k, policy skip-and-record: shard stalled max {max(stalls):.1f} s, "
        f"throughput {ratio:.2f}× of a clean run"
    )
    return 0


def drain(sqs: Any, queue_url: str) -> list[str]:
    """The sequence numbers the queue's reports name (each report's range: one record each here), emptying it."""
    ids: list[str] = []
    while True:
        got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not got:
            return ids
        for message in got:
            report = json.loads(message["Body"])
            info = report["KinesisBatchInfo"]
            if info["startSequenceNumber"] != info["endSequenceNumber"]:
                raise SystemExit(f"a report covers more than one record: {info}")
            ids.append(info["startSequenceNumber"])
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


if __name__ == "__main__":
    sys.exit(main())
