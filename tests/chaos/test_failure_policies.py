"""The failure policies (docs/failures.md) with real `shardlease worker` processes, poison records and a SIGKILL.

Kinesis on kinesalite, DynamoDB, SQS, SNS and S3 on moto. The processor (tests/support/poison.py) is transactional:
a batch holding a poison record fails whole before anything of it is journaled, so the journal holds exactly what
was processed.

1. **skip-and-record, one application per destination kind** (SQS, SNS, S3) on one stream with poison records at
   seeded random positions in a steady flow; each application's worker is SIGKILLed at its first failed delivery
   (mid-retry) and started again. Every good record is processed (duplicates only after the kill), every poison
   record is in the destination (compared one by one, by sequence number) and never processed, order per shard
   holds, and every shard goes on past each poison record. How long a shard stalls at a poison record is a speed
   figure (recorded here; bench/failures.py measures it under skip-and-record); here it is only held to the
   liveness bound of the policy's configured retries.
2. **stop-shard and retry**: one poison record; the stopped shard stops exactly at it (everything before processed,
   nothing after), is shown by ``shardlease status`` and assigned to nobody; the retrying shard holds at it while
   its lease moves; the other shard never waits: every record it got is processed while the poison record still
   cannot be. Once the processor is fixed, the retrying shard passes by itself and the stopped one after
   ``shardlease resume-shard``; nothing is lost or processed twice.

Every wait is a liveness bound derived from the configured timings (tests/support/stalls.py); the fixed sleeps let
the flow go on for a while (real time is what holding a shard happens in).
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

from tests.support.chaos import Line, Timings, chaos_seed, check_journal, record_figures
from tests.support.chaos_fleet import ChaosFleet
from tests.support.poison import PROCESSOR, is_poison
from tests.support.processes import EMBEDDED_LEADER_ENV, FAST_ENV, shardlease_run
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.processing.config import FailureConfig
from worker_lib.retrieval.stream_arns import stream_arn_of
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.producers import Producer, shard_hash_keys
from worker_lib.testing.streams import create_stream, record_positions

pytestmark = [pytest.mark.kinesalite, pytest.mark.heavy]

ACCOUNT, REGION = "123456789012", "us-east-1"
POISON_EVERY = 60  # one record in 60 is poison (seeded)
TIMINGS = Timings.of({**FAST_ENV, **EMBEDDED_LEADER_ENV})
# A poison record's policy at its documented defaults: its deliveries with the backoff between them (0.5 s + 1 s;
# the bisection down to it costs no backoff), then the next read.
POLICY = FailureConfig()
POLICY_EXPECTED_S = sum(POLICY.retry_backoff_s(n) for n in range(1, POLICY.max_attempts)) + TIMINGS.idle_s
# A kill in between: the restarted worker (the only one, so the leader too) takes the lock and its leases again.
KILLED_EXPECTED_S = TIMINGS.leader_takeover_s + TIMINGS.silent_worker_s + POLICY_EXPECTED_S
# A lease given up (policy retry) or resumed (resume-shard) is served again: the leader's next cycle, a notice.
REASSIGNED_EXPECTED_S = TIMINGS.cycle_s + TIMINGS.notice_s


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


LAMBDA_BATCH_INFO = {  # Lambda's on-failure record for Kinesis, as its documentation shows it
    "shardId",
    "startSequenceNumber",
    "endSequenceNumber",
    "approximateArrivalOfFirstRecord",
    "approximateArrivalOfLastRecord",
    "batchSize",
    "streamArn",
}


def recorded_sequences(
    reports: list[dict[str, Any]], records: dict[str, tuple[str, str]], stream_arn: str
) -> set[tuple[str, str]]:
    """The (shard, sequence number) of every record the reports cover: each report's range, as the stream holds it.
    Each report has Lambda's shape and names the stream by its ARN, as a redrive needs it (S3: each record too)."""
    covered: set[tuple[str, str]] = set()
    for report in reports:
        info = report["KinesisBatchInfo"]
        assert set(info) == LAMBDA_BATCH_INFO and info["streamArn"] == stream_arn
        low, high = int(info["startSequenceNumber"]), int(info["endSequenceNumber"])
        covered |= {(s, q) for s, q in records.values() if s == info["shardId"] and low <= int(q) <= high}
        assert report["requestContext"]["condition"] == "RetryAttemptsExhausted"
        assert report["shardlease"]["errorType"] == "ValueError" and report["shardlease"]["attempts"] == 3
        if "payload" in report:  # S3: the records themselves
            for item in report["payload"]["Records"]:
                assert base64.b64decode(item["kinesis"]["data"]).decode().startswith("r")
                assert item["eventSourceARN"] == stream_arn and item["eventSource"] == "aws:kinesis"
    return covered


def stalls(lines: list[Line], cuts: list[float]) -> list[tuple[str, float, bool]]:
    """For each poison record (its first FAIL line): how long its shard waited from that failure to the next record
    processed on it (a speed figure), and whether a kill fell in between (its failover then adds to the wait)."""
    out = []
    first_fail: dict[str, Line] = {}
    for line in lines:
        if line.kind == "FAIL":
            first_fail.setdefault(line.c, line)
    for poison, fail in first_fail.items():
        after = [x for x in lines if x.kind == "REC" and x.shard == fail.shard and x.index > fail.index]
        if not after:
            continue  # nothing was produced after it on that shard
        waited = after[0].t - fail.t
        killed = any(fail.t <= cut <= after[0].t for cut in cuts)
        out.append((poison, round(waited, 2), killed))
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


def applications(
    stack: contextlib.ExitStack,
    app_name: str,
    moto: str,
    stream: str,
    tmp_path: Path,
    *,
    envs: dict[str, dict[str, str]],
) -> dict[str, ChaosFleet]:
    """One :func:`application` ``<app_name>-<label>`` per label of ``envs``, each with its environment, all reading
    ``stream``; they end with ``stack``."""
    return {
        label: stack.enter_context(application(f"{app_name}-{label}", moto, stream, tmp_path, env))
        for label, env in envs.items()
    }


def test_skip_and_record_sends_each_poison_record_to_its_destination_across_a_kill_mid_retry(
    moto_endpoint: str, kinesalite_endpoint: str, app_name: str, destinations: Destinations, tmp_path: Path
) -> None:
    seed = chaos_seed()
    kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesalite_endpoint, max_attempts=3))
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 4)
    kinds = ("sqs", "sns", "s3")
    base = worker_env(tmp_path / "unused", kinesalite_endpoint, POISON_SEED=str(seed), POISON_EVERY=str(POISON_EVERY))
    envs = {
        kind: {
            **base,
            "SHARDLEASE_FAILURE_POLICY": "skip-and-record",
            "SHARDLEASE_FAILURE_DESTINATION": destinations.arn(kind),
        }
        for kind in kinds
    }
    with contextlib.ExitStack() as stack:
        fleets = applications(stack, app_name, moto_endpoint, stream, tmp_path, envs=envs)
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

        eventually(
            kill_failing,
            bound_s=hang_bound_s(TIMINGS.start_s + POISON_EVERY * producer.tick_s / producer.per_tick),
            what="a failed delivery in every application",
            step_s=0.05,
        )
        time.sleep(12.0)  # the flow goes on past the restarts: real time is what the stalls happen in
        producer.stop()
        records = record_positions(kinesis, stream)
        good = [r for r in producer.produced if not is_poison(r, seed=seed, every=POISON_EVERY)]
        poison = {records[r] for r in producer.produced if is_poison(r, seed=seed, every=POISON_EVERY)}
        assert poison, "the seed gave no poison record"
        recorded: dict[str, set[tuple[str, str]]] = {kind: set() for kind in kinds}
        stream_arn = stream_arn_of(kinesis, stream)

        def all_through() -> bool:
            for kind in kinds:
                recorded[kind] |= recorded_sequences(destinations.reports(kind), records, stream_arn)
            return all(f.processed_all(good) and recorded[k] >= poison for k, f in fleets.items())

        eventually(
            all_through,
            bound_s=hang_bound_s(KILLED_EXPECTED_S),
            what="every good record processed and every poison record in its destination",
            step_s=0.5,
        )
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
            # no shard hung at a poison record: each went on within the liveness bound of the policy's retries (the
            # kill's failover added); how long it stalled is the figure (bench/failures.py measures it)
            cuts = [at for times in fleet.cut_at().values() for at in times]
            waits = stalls(lines, cuts)
            bounds = {False: hang_bound_s(POLICY_EXPECTED_S), True: hang_bound_s(KILLED_EXPECTED_S)}
            late = [(p, waited, bounds[killed]) for p, waited, killed in waits if waited > bounds[killed]]
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
                    "max_stall_s": max((w for _, w, killed in waits if not killed), default=0.0),
                    "max_stall_across_kill_s": max((w for _, w, killed in waits if killed), default=0.0),
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
    figures: dict[str, Any] = {}
    envs = {policy: {**base, "SHARDLEASE_FAILURE_POLICY": policy} for policy in policies}
    with contextlib.ExitStack() as stack:
        fleets = applications(stack, app_name, moto_endpoint, stream, tmp_path, envs=envs)
        for fleet in fleets.values():
            fleet.start_chaos_worker("w1", processor=PROCESSOR)
        # GIVEN a steady flow on both shards, and one poison record on the first shard after a while
        producer = stack.enter_context(Producer(kinesis, stream, per_tick=2, tick_s=0.1, hash_keys=keys))
        eventually(
            lambda: len(producer.produced) >= 40,
            bound_s=hang_bound_s(40 * producer.tick_s / producer.per_tick),
            what="40 records produced",
        )
        poisoned_shard = kinesis.put_record(
            StreamName=stream, Data=b"poison-1", PartitionKey="p", ExplicitHashKey=keys[0]
        )["ShardId"]
        time.sleep(8.0)  # the flow goes on: real time is what holding a shard happens in
        stores = {
            policy: DynamoDBLeaseStore(
                f"{app_name}-{policy}", client=aws.client("dynamodb", AwsConfig(endpoint_url=moto_endpoint))
            )
            for policy in policies
        }

        def stopped_at_poison() -> bool:
            lease = stores["stop-shard"].get_lease(poisoned_shard)
            return lease is not None and lease.is_stopped

        def retrying_retaken() -> bool:
            lease = stores["retry"].get_lease(poisoned_shard)
            inits = [x for x in fleets["retry"].lines() if x.kind == "INIT" and x.shard == poisoned_shard]
            return lease is not None and lease.block is not None and len(inits) >= 2

        # (the stop: the policy's retries; the retrying lease given up after them and taken again)
        eventually(stopped_at_poison, bound_s=hang_bound_s(POLICY_EXPECTED_S), what="the stop-shard shard stopped")
        eventually(
            retrying_retaken,
            bound_s=hang_bound_s(POLICY_EXPECTED_S + REASSIGNED_EXPECTED_S),
            what="the retrying lease was not given up and taken again",
        )
        records = record_positions(kinesis, stream)
        poison_seq = int(records["poison-1"][1])
        # THEN the other shard never waited on it: every record it got so far is processed, while the poison record
        # still cannot be (the processor is not fixed yet)
        other_records = {r for r, (s, _) in records.items() if s != poisoned_shard}
        eventually(
            lambda: all(fleet.processed_all(other_records) for fleet in fleets.values()),
            bound_s=hang_bound_s(TIMINGS.idle_s),
            what="the other shard's records processed while the poison record holds its shard",
        )
        before_fix = {policy: fleet.lines() for policy, fleet in fleets.items()}
        assert not any(x.kind == "REC" and x.c == "poison-1" for lines in before_fix.values() for x in lines)
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
            # (how long the other shard went without a record meanwhile is a figure)
            other = [x.t for x in before_fix[policy] if x.kind == "REC" and x.shard != poisoned_shard]
            figures[f"{policy}_other_shard_max_gap_s"] = round(
                max((b - a for a, b in itertools.pairwise(other)), default=0.0), 2
            )
        # WHEN the processor is fixed, and the stopped shard is resumed by an operator
        fixed.touch()
        eventually(
            lambda: any(x.kind == "REC" and x.c == "poison-1" for x in fleets["retry"].lines()),
            bound_s=hang_bound_s(POLICY_EXPECTED_S + REASSIGNED_EXPECTED_S),
            what="the retrying shard passed the fixed poison record",
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
        eventually(
            lambda: all(f.processed_all(everything) for f in fleets.values()),
            bound_s=hang_bound_s(POLICY_EXPECTED_S + REASSIGNED_EXPECTED_S),
            what="everything processed after the fix and the resume",
        )
        for policy, fleet in fleets.items():
            assert fleet.stop_workers() == {"w1": 0}
            verdict = check_journal(fleet.lines(), everything, abnormal_pids=set())
            assert verdict.violations == [] and verdict.duplicated == 0, (policy, verdict.violations[:5])
        assert stores["stop-shard"].get_lease(poisoned_shard).block is None  # type: ignore[union-attr]
    record_figures("failure-policy-stop-shard-and-retry", figures)
