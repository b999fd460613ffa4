"""MultiLangProcessor against real child processes that behave well and badly (tests/support/multilang_child.py).

The checkpointer is the only stand-in: an in-memory one applying the real checkpoint rules
(tests/support/checkpointers.py), so that each bad behaviour's table row — what the child does, what it gets, what
is checkpointed — is checked without a lease table; the daemon with real tables is tests/e2e/test_multilang.py.
The last test runs children under an in-process worker on moto, to see the failure policy apply to them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.checkpointers import RecordingCheckpointer
from tests.support.processes import PROCESS_START_S, REPO, eventually_showing
from tests.support.recording import stream_with_leases
from tests.support.stalls import hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import SHARD_END, Checkpoint, KinesisRecord
from worker_lib.leases.config import LeaseConfig
from worker_lib.multilang import ChildRegistry, ChildSpec, MultiLangProcessor
from worker_lib.multilang.child import ChildFailedError
from worker_lib.multilang.processor import ChildBatchFailedError
from worker_lib.processing.config import FailureConfig
from worker_lib.processing.destinations import SqsDestination
from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.worker.worker import Worker, WorkerConfig

SHARD = "shardId-000000000007"
READ_MS, DISCOVERY_MS = 100, 200
EXIT_BOUND_S = hang_bound_s(0.0)  # liveness: a child killed, or told to stop, exits (no timing: the floor)


def batch(start: int, count: int) -> list[KinesisRecord]:
    return [
        KinesisRecord(data=f"r{n}".encode(), partition_key=f"k{n}", sequence_number=str(1000 + n))
        for n in range(start, start + count)
    ]


def deliver(processor: MultiLangProcessor, checkpointer: RecordingCheckpointer, records: list[KinesisRecord]) -> None:
    checkpointer.largest_permitted = records[-1].checkpoint
    processor.process_records(ProcessRecordsInput(shard_id=SHARD, records=records, checkpointer=checkpointer))


def journal(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def registry() -> Iterator[ChildRegistry]:
    children = ChildRegistry()
    yield children
    children.close_all(0.0)


def make(tmp_path: Path, behaviour: str, registry: ChildRegistry, **spec: Any) -> MultiLangProcessor:
    env = {"PYTHONPATH": str(REPO), "MULTILANG_JOURNAL": str(tmp_path / "journal.jsonl"), "MULTILANG_FAIL_AT": "2"}
    command = (sys.executable, "-m", "tests.support.multilang_child", behaviour)
    return MultiLangProcessor(ChildSpec(command=command, cwd=REPO, env=env, **spec), registry=registry)


def test_a_good_child_sees_every_record_and_checkpoints_through_the_lease(
    tmp_path: Path, registry: ChildRegistry
) -> None:
    # GIVEN a child for one lease
    processor = make(tmp_path, "good", registry)
    checkpointer = RecordingCheckpointer()
    processor.initialize(InitializationInput(shard_id=SHARD, checkpoint=Checkpoint(sequence="TRIM_HORIZON")))
    # WHEN it gets two batches, then the shard ends
    deliver(processor, checkpointer, batch(0, 3))
    deliver(processor, checkpointer, batch(3, 2))
    checkpointer.largest_permitted = SHARD_END
    processor.shard_ended(ShardEndedInput(shard_id=SHARD, checkpointer=checkpointer))
    # THEN it saw every record once, its checkpoints went through the lease's checkpointer, SHARD_END last
    entries = journal(tmp_path / "journal.jsonl")
    assert [e["sequence"] for e in entries if e["kind"] == "record"] == [str(1000 + n) for n in range(5)]
    assert checkpointer.written == [Checkpoint(sequence="1002"), Checkpoint(sequence="1004"), SHARD_END]
    assert [e["error"] for e in entries if e["kind"] == "checkpoint"] == [None, None, None]
    # AND the child ended once the shard was done
    assert processor.child is None and not registry.live


def test_shutdown_requested_lets_the_child_checkpoint_then_says_lease_lost(
    tmp_path: Path, registry: ChildRegistry
) -> None:
    processor = make(tmp_path, "good", registry)
    checkpointer = RecordingCheckpointer()
    processor.initialize(InitializationInput(shard_id=SHARD, checkpoint=Checkpoint(sequence="LATEST")))
    deliver(processor, checkpointer, batch(0, 2))
    processor.shutdown_requested(ShutdownRequestedInput(shard_id=SHARD, checkpointer=checkpointer))
    actions = [e["action"] for e in journal(tmp_path / "journal.jsonl") if e["kind"] == "message"]
    assert actions == ["initialize", "shutdownRequested", "leaseLost"]  # KCL 3.x's sequence for a hand-off
    assert checkpointer.last_checkpoint == Checkpoint(sequence="1001")
    assert processor.child is None


def test_a_checkpoint_after_the_lease_was_lost_gets_kcls_shutdown_exception(
    tmp_path: Path, registry: ChildRegistry
) -> None:
    processor = make(tmp_path, "good", registry)
    checkpointer = RecordingCheckpointer()
    processor.initialize(InitializationInput(shard_id=SHARD, checkpoint=Checkpoint(sequence="LATEST")))
    checkpointer.lease_lost = True
    deliver(processor, checkpointer, batch(0, 2))
    errors = [e["error"] for e in journal(tmp_path / "journal.jsonl") if e["kind"] == "checkpoint"]
    assert errors == ["ShutdownException"] and checkpointer.written == []
    processor.lease_lost(LeaseLostInput(shard_id=SHARD))
    assert processor.child is None


def test_a_chatty_child_is_heard_not_misread(
    tmp_path: Path, registry: ChildRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a child that prints lines of its own on stdout and stderr around every message
    caplog.set_level("INFO", logger="worker_lib.multilang.stderr")
    processor = make(tmp_path, "chatty", registry)
    checkpointer = RecordingCheckpointer()
    processor.initialize(InitializationInput(shard_id=SHARD, checkpoint=Checkpoint(sequence="LATEST")))
    deliver(processor, checkpointer, batch(0, 2))
    processor.lease_lost(LeaseLostInput(shard_id=SHARD))
    # THEN its batches are processed, and its lines reach the log, each naming the shard
    assert checkpointer.written == [Checkpoint(sequence="1001")]
    lines = [r.getMessage() for r in caplog.records if r.name == "worker_lib.multilang.stderr"]
    assert f"[{SHARD}] (stdout) chatty child got processRecords" in lines
    assert f"[{SHARD}] chatty child stderr for processRecords" in lines


# The table of bad behaviours (docs/multilang.md): at its second batch the child ...
BAD_BEHAVIOURS = [
    ("crash", "exited with code 3"),  # ... exits in the middle of the batch
    ("garbage", "broke the protocol while handling processRecords: unknown action 'bogus'"),
    ("wrong-status", "a status for 'initialize' while processRecords was expected"),
    ("silent", "did not answer processRecords: 1 s without a line (timeoutInSeconds); killed"),
]


@pytest.mark.parametrize(("behaviour", "fragment"), BAD_BEHAVIOURS)
def test_a_child_that_fails_a_batch_is_replaced_and_the_batch_fails_with_one_line(
    tmp_path: Path, registry: ChildRegistry, behaviour: str, fragment: str
) -> None:
    # GIVEN a child that handles its first batch well and fails its second
    processor = make(tmp_path, behaviour, registry, response_timeout_s=1.0)
    checkpointer = RecordingCheckpointer()
    processor.initialize(InitializationInput(shard_id=SHARD, checkpoint=Checkpoint(sequence="LATEST")))
    deliver(processor, checkpointer, batch(0, 2))
    child = processor.child
    assert child is not None
    # WHEN the second batch is delivered
    with pytest.raises(ChildBatchFailedError) as caught:
        deliver(processor, checkpointer, batch(2, 2))
    # THEN one line names the shard and what the child did (the failure policy decides about the batch)
    message = str(caught.value)
    assert SHARD in message and fragment in message and "\n" not in message
    # AND the checkpoint stays at what the child confirmed (the first batch); the failed child is gone and a new
    # one, initialized at that checkpoint, took its place
    assert checkpointer.written == [Checkpoint(sequence="1001")]
    assert child.exit_code(wait_s=EXIT_BOUND_S) is not None
    replacement = processor.child
    assert replacement is not None and replacement is not child and registry.live == {replacement}
    starts = [e for e in journal(tmp_path / "journal.jsonl") if e.get("action") == "initialize"]
    assert [e["sequence"] for e in starts] == ["LATEST", "1001"]
    processor.lease_lost(LeaseLostInput(shard_id=SHARD))
    assert processor.child is None and not registry.live


def test_a_checkpoint_beyond_the_last_record_is_refused_with_kcls_illegal_argument(
    tmp_path: Path, registry: ChildRegistry
) -> None:
    processor = make(tmp_path, "beyond", registry)
    checkpointer = RecordingCheckpointer()
    processor.initialize(InitializationInput(shard_id=SHARD, checkpoint=Checkpoint(sequence="LATEST")))
    deliver(processor, checkpointer, batch(0, 2))
    deliver(processor, checkpointer, batch(2, 2))
    # THEN the request one past the batch got IllegalArgumentException and wrote nothing; the child went on
    answers = [(e["sequence"], e["error"]) for e in journal(tmp_path / "journal.jsonl") if e["kind"] == "checkpoint"]
    assert answers == [("1001", None), ("1004", "IllegalArgumentException"), ("1003", None)]
    assert checkpointer.written == [Checkpoint(sequence="1001"), Checkpoint(sequence="1003")]


def test_a_child_that_cannot_start_is_one_line(tmp_path: Path, registry: ChildRegistry) -> None:
    processor = MultiLangProcessor(ChildSpec(command=(str(tmp_path / "no-such-program"),)), registry=registry)
    with pytest.raises(ChildFailedError, match=f"multilang child for {SHARD} could not start: .*no-such-program"):
        processor.initialize(InitializationInput(shard_id=SHARD, checkpoint=Checkpoint(sequence="LATEST")))


def test_a_child_that_dies_on_a_poison_record_is_replaced_and_the_policy_sends_the_record_to_the_queue(
    tmp_path: Path, registry: ChildRegistry, ddb: Any, kinesis: Any, *, app_name: str, moto_aws: AwsConfig
) -> None:
    # GIVEN a worker whose children die on any batch holding a poison record, with skip-and-record to a queue
    stream, _, _ = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    datas = [b"poison-5" if n == 5 else f"r{n}".encode() for n in range(12)]
    kinesis.put_records(StreamName=stream, Records=[{"Data": d, "PartitionKey": "k"} for d in datas])
    sqs = aws.client("sqs", moto_aws)
    queue_url = sqs.create_queue(QueueName=f"{app_name}-failed")["QueueUrl"]
    queue_arn = f"arn:aws:sqs:us-east-1:123456789012:{app_name}-failed"
    config = WorkerConfig(
        app=app_name,
        stream=stream,
        worker_id="w1",
        lease=LeaseConfig(failover_time_ms=3_000),
        retrieval=RetrievalConfig(idle_time_between_reads_ms=READ_MS),
        failures=FailureConfig(on_failure="skip-and-record", destination=queue_arn, retry_backoff_ms=10),
        discovery_interval_ms=DISCOVERY_MS,
    )
    worker = Worker(
        config,
        lambda: make(tmp_path, "poison", registry),
        dynamodb=ddb,
        kinesis=kinesis,
        failure_destination=SqsDestination(sqs, queue_arn),
    )
    worker.start()
    try:
        # THEN every other record reaches a child once, in order; each death brought a new child in its place
        def handled() -> list[str]:
            return [e["data"] for e in journal(tmp_path / "journal.jsonl") if e["kind"] == "record"]

        # (a liveness bound: four children start one after the other, each within a discovery and a read)
        eventually_showing(
            lambda: len(handled()) >= 11,
            bound_s=hang_bound_s(4 * (PROCESS_START_S + (DISCOVERY_MS + READ_MS) / 1000)),
            what="11 records handled",
            detail=handled,
        )
        assert handled() == [d.decode() for d in datas if d != b"poison-5"]
        starts = [e for e in journal(tmp_path / "journal.jsonl") if e.get("action") == "initialize"]
        assert len(starts) >= 1 + 3  # the first child, and one per failed delivery of the poison record
        # AND the poison record alone is in the queue
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
        (report,) = [json.loads(m["Body"]) for m in messages]
        assert report["KinesisBatchInfo"]["batchSize"] == 1
        assert report["shardlease"]["errorType"] == "ChildBatchFailedError"
    finally:
        assert worker.shutdown(timeout_s=EXIT_BOUND_S)
