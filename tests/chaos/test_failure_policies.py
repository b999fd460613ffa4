"""The failure policies (docs/failures.md) with real `shardlease worker` processes, poison records and a SIGKILL.

Kinesis on kinesalite, DynamoDB, SQS, SNS and S3 on moto. The processor (tests/support/poison.py) is transactional:
a batch holding a poison record fails whole before anything of it is journaled, so the journal holds exactly what
was processed.

1. **skip-and-record, one application per destination kind** (SQS, SNS, S3) on one stream with poison records at
   seeded random positions in a steady flow; each application's worker is SIGKILLed at its first failed delivery
   (mid-retry) and started again. Every good record is processed (duplicates only after the kill), every poison
   record is in the destination (compared one by one, by sequence number) and never processed, order per shard
   holds, and no shard waits longer than the policy's bound past a poison record.
2. **stop-shard and retry**: one poison record; the stopped shard stops exactly at it (everything before processed,
   nothing after), is shown by ``shardlease status`` and assigned to nobody; the retrying shard holds at it while
   its lease moves; the other shard never waits. Once the processor is fixed, the retrying shard passes by itself
   and the stopped one after ``shardlease resume-shard``; nothing is lost or processed twice.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos import Line, chaos_seed, check_journal, record_figures
from tests.support.chaos_fleet import ChaosFleet
from tests.support.poison import PROCESSOR, is_poison
from tests.support.processes import EMBEDDED_LEADER_ENV, FAST_ENV, shardlease_run
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.producers import Producer, shard_hash_keys
from worker_lib.testing.streams import create_stream, record_positions
from worker_lib.testing.waiting import wait_until

pytestmark = pytest.mark.kinesalite

ACCOUNT, REGION = "123456789012", "us-east-1"
POISON_EVERY = 60  # one record in 60 is poison (seeded)
# skip-and-record at its documented defaults: 3 deliveries of the isolated record (0.5 s + 1 s of backoff), the
# bisection down to it without backoff, one send to the destination; plus the next read (0.1 s idle in tests).
POLICY_BOUND_S = 5.0
# After a SIGKILL the shard also waits for the failover (tests/chaos/test_chaos_processes.py, MAX_UNSERVED_S).
KILLED_BOUND_S = 12.0 + POLICY_BOUND_S


@dataclass
class Destinations:
    sqs: Any
    s3: Any
    queue_url: str
    topic_queue_url: str
    bucket: str
    topic_arn: str

    def arn(self, kind: str) -> str:
        return {
            "sqs": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{self.queue_url.rsplit('/', 1)[-1]}",
            "sns": self.topic_arn,
            "s3": f"s3://{self.bucket}/failed",
        }[kind]

    def reports(self, kind: str) -> list[dict[str, Any]]:
        """Every report the destination received so far (SQS and SNS: drained from their queue)."""
        if kind == "s3":
            listing = self.s3.list_objects_v2(Bucket=self.bucket, Prefix="failed/").get("Contents", [])
            return [json.loads(self.s3.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read()) for o in listing]
        url = self.queue_url if kind == "sqs" else self.topic_queue_url
        found: list[dict[str, Any]] = []
        while True:
            got = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
            if not got:
                return found
            for message in got:
                body = json.loads(message["Body"])
                found.append(json.loads(body["Message"]) if body.get("Type") == "Notification" else body)
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


@pytest.fixture
def destinations(moto_endpoint: str, app_name: str) -> Destinations:
    cfg = AwsConfig(endpoint_url=moto_endpoint, region=REGION)
    sqs, sns, s3 = (aws.client(name, cfg) for name in ("sqs", "sns", "s3"))
    queue_url = sqs.create_queue(QueueName=f"{app_name}-failed")["QueueUrl"]
    topic_queue_url = sqs.create_queue(QueueName=f"{app_name}-topic")["QueueUrl"]
    topic_arn = sns.create_topic(Name=f"{app_name}-failed")["TopicArn"]
    topic_queue_arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{app_name}-topic"
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=topic_queue_arn)
    bucket = f"{app_name.lower()}-failed"[:63]
    s3.create_bucket(Bucket=bucket)
    return Destinations(
        sqs=sqs, s3=s3, queue_url=queue_url, topic_queue_url=topic_queue_url, bucket=bucket, topic_arn=topic_arn
    )


def recorded_sequences(reports: list[dict[str, Any]], records: dict[str, tuple[str, str]]) -> set[tuple[str, str]]:
    """The (shard, sequence number) of every record the reports cover: each report's range, as the stream holds it."""
    covered: set[tuple[str, str]] = set()
    for report in reports:
        info = report["KinesisBatchInfo"]
        low, high = int(info["startSequenceNumber"]), int(info["endSequenceNumber"])
        covered |= {(s, q) for s, q in records.values() if s == info["shardId"] and low <= int(q) <= high}
        assert report["requestContext"]["condition"] == "RetryAttemptsExhausted"
        assert report["shardlease"]["errorType"] == "ValueError" and report["shardlease"]["attempts"] == 3
        if "payload" in report:  # S3: the records themselves
            for item in report["payload"]["Records"]:
                assert base64.b64decode(item["kinesis"]["data"]).decode().startswith("r")
    return covered


def stalls(lines: list[Line], cuts: list[float]) -> list[tuple[str, float, float]]:
    """For each poison record (its first FAIL line): how long its shard waited from that failure to the next record
    processed on it, and the bound that applies (longer if a kill fell in between)."""
    out = []
    first_fail: dict[str, Line] = {}
    for line in lines:
        if line.kind == "FAIL":
            first_fail.setdefault(line.c, line)
    for poison, fail in first_fail.items():
        after = [x for x in lines if x.kind == "REC" and x.shard == fail.shard and x.t > fail.t]
        if not after:
            continue  # nothing was produced after it on that shard
        waited = after[0].t - fail.t
        killed = any(fail.t <= cut <= after[0].t for cut in cuts)
        out.append((poison, round(waited, 2), KILLED_BOUND_S if killed else POLICY_BOUND_S))
    return out


def worker_env(journal: Path, kinesalite: str, **extra: str) -> dict[str, str]:
    return {
        **FAST_ENV,
        **EMBEDDED_LEADER_ENV,
        "SHARDLEASE_CHAOS_JOURNAL": str(journal),
        "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesalite,
        **extra,
    }


@contextlib.contextmanager
def application(name: str, moto: str, stream: str, tmp_path: Path, env: dict[str, str]) -> Iterator[ChaosFleet]:
    ensure_tables(name, aws.client("dynamodb", AwsConfig(endpoint_url=moto)))
    journal = tmp_path / f"{name}.journal"
    journal.touch()
    (tmp_path / name).mkdir()
    args = ["--app", name, "--stream", stream, "--endpoint-url", moto]
    with ChaosFleet(
        tmp_path / name, args=args, env={**env, "SHARDLEASE_CHAOS_JOURNAL": str(journal)}, journal=journal
    ) as fleet:
        yield fleet


def test_skip_and_record_sends_each_poison_record_to_its_destination_across_a_kill_mid_retry(
    moto_endpoint: str, kinesalite_endpoint: str, app_name: str, destinations: Destinations, tmp_path: Path
) -> None:
    seed = chaos_seed()
    kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesalite_endpoint, max_attempts=3))
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 4)
    kinds = ("sqs", "sns", "s3")
    base = worker_env(tmp_path / "unused", kinesalite_endpoint, POISON_SEED=str(seed), POISON_EVERY=str(POISON_EVERY))
    with contextlib.ExitStack() as stack:
        fleets = {
            kind: stack.enter_context(
                application(
                    f"{app_name}-{kind}",
                    moto_endpoint,
                    stream,
                    tmp_path,
                    {
                        **base,
                        "SHARDLEASE_FAILURE_POLICY": "skip-and-record",
                        "SHARDLEASE_FAILURE_DESTINATION": destinations.arn(kind),
                    },
                )
            )
            for kind in kinds
        }
        # GIVEN one worker per application, each with skip-and-record at its defaults and a destination of its own
        for fleet in fleets.values():
            fleet.start_chaos_worker("w1", processor=PROCESSOR)
        producer = Producer(kinesis, stream, per_tick=4, tick_s=0.1, hash_keys=shard_hash_keys(kinesis, stream))
        stack.enter_context(producer)
        # WHEN poison records come in a steady flow, and each worker is killed at its first failed delivery
        killed: set[str] = set()

        def kill_failing() -> bool:
            for kind, fleet in fleets.items():
                if kind not in killed and any(x.kind == "FAIL" for x in fleet.lines()):
                    fleet.kill(fleet.latest["w1"])
                    fleet.start_chaos_worker("w1", processor=PROCESSOR)
                    killed.add(kind)
            return len(killed) == len(kinds)

        assert wait_until(kill_failing, timeout_s=30, step_s=0.05), f"no failed delivery in {set(kinds) - killed}"
        time.sleep(12.0)  # the flow goes on past the restarts: real time is what the stalls are measured in
        producer.stop()
        records = record_positions(kinesis, stream)
        good = [r for r in producer.produced if not is_poison(r, seed=seed, every=POISON_EVERY)]
        poison = {records[r] for r in producer.produced if is_poison(r, seed=seed, every=POISON_EVERY)}
        assert poison, "the seed gave no poison record"
        recorded: dict[str, set[tuple[str, str]]] = {kind: set() for kind in kinds}

        def all_through() -> bool:
            for kind in kinds:
                recorded[kind] |= recorded_sequences(destinations.reports(kind), records)
            return all(f.processed_all(good) and recorded[k] >= poison for k, f in fleets.items())

        assert wait_until(all_through, timeout_s=60, step_s=0.5), {
            k: (len(poison - recorded[k]), len(set(good) - {x.c for x in f.lines() if x.kind == "REC"}))
            for k, f in fleets.items()
        }
        codes = {kind: fleet.stop_workers() for kind, fleet in fleets.items()}
        # THEN for each destination kind ...
        for kind, fleet in fleets.items():
            lines = fleet.lines()
            verdict = check_journal(lines, good, abnormal_pids=fleet.abnormal_pids())
            # every good record processed, in order per session, duplicates only after the kill
            assert verdict.violations == [], (kind, verdict.violations[:5])
            # every poison record in the destination, no other record, and none of them processed
            assert recorded[kind] == poison, kind
            assert not {x.c for x in lines if x.kind == "REC"} & {r for r in producer.produced if r not in good}
            # no shard waited past a poison record longer than the policy's bound (the kill's failover added)
            cuts = [at for times in fleet.cut_at().values() for at in times]
            waits = stalls(lines, cuts)
            late = [(p, waited, bound) for p, waited, bound in waits if waited > bound]
            assert late == [], (kind, late)
            assert codes[kind] == {"w1": 0}
            record_figures(
                f"failure-policy-skip-and-record-{kind}",
                {
                    "seed": seed,
                    "produced": len(producer.produced),
                    "poison": len(poison),
                    "reports": len(recorded[kind]),
                    "duplicated": verdict.duplicated,
                    "max_stall_s": max((w for _, w, b in waits if b == POLICY_BOUND_S), default=0.0),
                    "max_stall_across_kill_s": max((w for _, w, b in waits if b == KILLED_BOUND_S), default=0.0),
                },
            )


def test_stop_shard_stops_at_the_poison_record_and_retry_holds_there_until_the_processor_is_fixed(
    moto_endpoint: str, kinesalite_endpoint: str, app_name: str, tmp_path: Path
) -> None:
    kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesalite_endpoint, max_attempts=3))
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 2)
    keys = shard_hash_keys(kinesis, stream)
    fixed = tmp_path / "fixed"
    base = worker_env(tmp_path / "unused", kinesalite_endpoint, POISON_FIXED_FILE=str(fixed))
    policies = ("stop-shard", "retry")
    with contextlib.ExitStack() as stack:
        fleets = {
            policy: stack.enter_context(
                application(
                    f"{app_name}-{policy}",
                    moto_endpoint,
                    stream,
                    tmp_path,
                    {**base, "SHARDLEASE_FAILURE_POLICY": policy},
                )
            )
            for policy in policies
        }
        for fleet in fleets.values():
            fleet.start_chaos_worker("w1", processor=PROCESSOR)
        # GIVEN a steady flow on both shards, and one poison record on the first shard after a while
        producer = stack.enter_context(Producer(kinesis, stream, per_tick=2, tick_s=0.1, hash_keys=keys))
        assert wait_until(lambda: len(producer.produced) >= 40, timeout_s=30)
        poisoned_shard = kinesis.put_record(
            StreamName=stream, Data=b"poison-1", PartitionKey="p", ExplicitHashKey=keys[0]
        )["ShardId"]
        time.sleep(8.0)  # the flow goes on: real time is what holding a shard is measured in
        before_fix = {policy: fleet.lines() for policy, fleet in fleets.items()}
        stores = {
            policy: DynamoDBLeaseStore(
                f"{app_name}-{policy}", client=aws.client("dynamodb", AwsConfig(endpoint_url=moto_endpoint))
            )
            for policy in policies
        }
        records = record_positions(kinesis, stream)
        poison_seq = int(records["poison-1"][1])
        # THEN with stop-shard the shard stopped exactly at the poison record: assigned to nobody, shown as stopped
        stopped = stores["stop-shard"].get_lease(poisoned_shard)
        assert stopped is not None and stopped.is_stopped and stopped.lease_owner is None
        assert stopped.block is not None and int(stopped.block.at.sequence) == poison_seq
        status = json.loads(
            shardlease_run(
                "status", "--app", f"{app_name}-stop-shard", "--endpoint-url", moto_endpoint, "--json"
            ).stdout
        )
        assert [(b["lease"], b["state"]) for b in status["blocked"]] == [(poisoned_shard, "stopped")]
        # ... and with retry it holds at the poison record too, its lease given up and taken again meanwhile
        retrying = stores["retry"].get_lease(poisoned_shard)
        assert retrying is not None and retrying.block is not None and retrying.block.state == "retrying"
        inits = [x for x in before_fix["retry"] if x.kind == "INIT" and x.shard == poisoned_shard]
        assert len(inits) >= 2, "the retrying lease was not given up and taken again"
        for policy in policies:
            on_poisoned = [int(x.a) for x in before_fix[policy] if x.kind == "REC" and x.shard == poisoned_shard]
            expected = sorted(int(q) for s, q in records.values() if s == poisoned_shard and int(q) < poison_seq)
            if policy == "stop-shard":  # bisection: everything before it, nothing after
                assert sorted(set(on_poisoned)) == expected, policy
            else:  # whole batches: what came before the failing batch (maybe nothing), nothing after the poison
                assert sorted(set(on_poisoned)) == expected[: len(set(on_poisoned))], policy
            # the other shard never waited on it
            other = [x.t for x in before_fix[policy] if x.kind == "REC" and x.shard != poisoned_shard]
            assert max(b - a for a, b in itertools.pairwise(other)) < POLICY_BOUND_S, policy
        # WHEN the processor is fixed, and the stopped shard is resumed by an operator
        fixed.touch()
        assert wait_until(
            lambda: any(x.kind == "REC" and x.c == "poison-1" for x in fleets["retry"].lines()), timeout_s=30
        )
        assert not any(x.kind == "REC" and x.c == "poison-1" for x in fleets["stop-shard"].lines()), (
            "a stopped shard moved by itself"
        )
        resumed = shardlease_run(
            "resume-shard",
            "--app",
            f"{app_name}-stop-shard",
            "--shard",
            poisoned_shard,
            "--endpoint-url",
            moto_endpoint,
        )
        assert resumed.returncode == 0 and "resumed" in resumed.stdout
        producer.stop()
        everything = [*producer.produced, "poison-1"]
        # THEN both process everything, once: nothing lost, nothing twice, in order
        assert wait_until(lambda: all(f.processed_all(everything) for f in fleets.values()), timeout_s=40)
        for policy, fleet in fleets.items():
            assert fleet.stop_workers() == {"w1": 0}
            verdict = check_journal(fleet.lines(), everything, abnormal_pids=set())
            assert verdict.violations == [] and verdict.duplicated == 0, (policy, verdict.violations[:5])
        assert stores["stop-shard"].get_lease(poisoned_shard).block is None  # type: ignore[union-attr]
