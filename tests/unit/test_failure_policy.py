"""The failure policy's rules (worker_lib.processing.failures): attempts, bisection, partial batch results, record
age and the action at the end, on one batch, with the consumer's I/O recorded in memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest

from worker_lib.core.errors import ConfigError
from worker_lib.core.models import KinesisRecord
from worker_lib.processing.config import DestinationKind, DestinationSpec, FailureAction, FailureConfig
from worker_lib.processing.failures import (
    RECORD_AGE_EXCEEDED,
    RETRIES_EXHAUSTED,
    BatchDelivery,
    Delivered,
    Failure,
    RecordFailedError,
    failure_from_exception,
    failure_from_result,
)

NOW = 1_800_000_000.0


def records(count: int, *, start: int = 1, arrived: float = NOW) -> list[KinesisRecord]:
    return [
        KinesisRecord(
            data=b"x",
            partition_key="k",
            sequence_number=str(1000 + n),
            approximate_arrival_timestamp=datetime.fromtimestamp(arrived, timezone.utc),
        )
        for n in range(start, start + count)
    ]


@dataclass
class Ports:
    """Records what the delivery asks of the consumer; ``fails`` decides each call's outcome."""

    fails: Callable[[Sequence[KinesisRecord]], Failure | None]
    calls: list[list[str]] = field(default_factory=list)
    processed: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    recorded: list[tuple[str, list[str], int]] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    interrupt_after_waits: int | None = None

    def process(self, batch: Sequence[KinesisRecord], *, at_shard_end: bool) -> Failure | None:
        self.calls.append([r.sequence_number for r in batch])
        failure = self.fails(batch)
        done = batch if failure is None else batch[: failure.first_failed]
        self.processed += [r.sequence_number for r in done]
        return failure

    def checkpoint(self, record: KinesisRecord) -> None:
        self.checkpoints.append(record.sequence_number)

    def record(self, batch: Sequence[KinesisRecord], *, condition: str, attempts: int, error: Failure | None) -> None:
        self.recorded.append((condition, [r.sequence_number for r in batch], attempts))

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return self.interrupt_after_waits is None or len(self.waits) <= self.interrupt_after_waits

    def blocked(self, batch: Sequence[KinesisRecord], *, attempts: int, failure: Failure | None) -> None:
        self.blocks.append(attempts if failure is not None else 0)


def poison(*sequence_numbers: str) -> Callable[[Sequence[KinesisRecord]], Failure | None]:
    """A processor that raises on any batch holding one of these records."""

    def fails(batch: Sequence[KinesisRecord]) -> Failure | None:
        if any(r.sequence_number in sequence_numbers for r in batch):
            return Failure(ValueError("bad record"))
        return None

    return fails


def deliver(config: FailureConfig, ports: Ports, batch: list[KinesisRecord]) -> tuple[Delivered, BatchDelivery]:
    delivery = BatchDelivery(config=config, ports=ports, lease_key="shardId-0", now=NOW)
    return delivery.run(batch), delivery


DESTINATION = "arn:aws:sqs:us-east-1:123456789012:failed"


def test_a_poison_record_is_isolated_by_bisection_recorded_and_passed() -> None:
    # GIVEN skip-and-record at its defaults (bisection on, 3 attempts) and a batch of 16 with record 1011 bad
    config = FailureConfig(on_failure="skip-and-record", destination=DESTINATION)
    ports = Ports(fails=poison("1011"))
    # WHEN the batch is delivered
    outcome, delivery = deliver(config, ports, records(16))
    # THEN every other record is processed once, in order; 1011 alone goes to the destination after 3 attempts
    assert outcome is Delivered.DONE
    assert ports.processed == [str(1000 + n) for n in range(1, 17) if n != 11]
    assert ports.recorded == [(RETRIES_EXHAUSTED, ["1011"], 3)]
    assert ports.checkpoints == ["1011"]  # past it, once it is in the destination
    assert ports.waits == [0.5, 1.0]  # backoff only between attempts on the one record, not for the splits
    assert delivery.stats.bisections == 4 and delivery.stats.recorded == 1
    assert ports.blocks == [1, 0]  # marked at the first failure, cleared once through


def test_retry_gives_the_lease_up_without_a_checkpoint_and_without_splitting() -> None:
    # GIVEN the default policy (retry; no bisection)
    ports = Ports(fails=poison("1003"))
    # WHEN the batch keeps failing
    outcome, _ = deliver(FailureConfig(), ports, records(8))
    # THEN it is delivered whole 3 times, nothing is checkpointed or recorded, and the lease is to be given up
    assert outcome is Delivered.GIVE_UP
    assert len(ports.calls) == 3 and all(len(call) == 8 for call in ports.calls)
    assert ports.checkpoints == [] and ports.recorded == []


def test_stop_shard_stops_at_the_failing_record_after_processing_those_before_it() -> None:
    ports = Ports(fails=poison("1005"))
    outcome, delivery = deliver(FailureConfig(on_failure="stop-shard"), ports, records(8))
    assert outcome is Delivered.STOP_SHARD
    assert delivery.stopped_at is not None and delivery.stopped_at.sequence_number == "1005"
    assert ports.processed == ["1001", "1002", "1003", "1004"]
    assert "1005" not in ports.checkpoints and ports.recorded == []


def test_a_partial_result_checkpoints_what_came_before_and_retries_from_the_named_record() -> None:
    # GIVEN a processor that reports record 1004 as the first failure, once, then succeeds
    seen: list[int] = []

    def fails(batch: Sequence[KinesisRecord]) -> Failure | None:
        seen.append(len(batch))
        if len(seen) == 1:
            return failure_from_exception(RecordFailedError(batch[3]), batch)
        return None

    ports = Ports(fails=fails)
    # WHEN a batch of 6 is delivered under the default policy
    outcome, _ = deliver(FailureConfig(), ports, records(6))
    # THEN 1001..1003 are checkpointed, and only 1004..1006 are delivered again
    assert outcome is Delivered.DONE
    assert ports.checkpoints == ["1003"]
    assert ports.calls[1] == ["1004", "1005", "1006"]
    assert ports.processed == [str(n) for n in range(1001, 1007)]


def test_lambda_style_batch_item_failures_name_the_lowest_record() -> None:
    batch = records(5)
    failure = failure_from_result(
        {"batchItemFailures": [{"itemIdentifier": "1004"}, {"itemIdentifier": "1002"}]}, batch
    )
    assert failure is not None and failure.first_failed == 1
    assert failure_from_result({"batchItemFailures": []}, batch) is None
    assert failure_from_result(None, batch) is None
    unknown = failure_from_result({"batchItemFailures": [{"itemIdentifier": "999"}]}, batch)
    assert unknown is not None and unknown.first_failed == 0  # Lambda: an unknown identifier fails the batch


def test_records_older_than_the_maximum_age_go_to_the_destination_unprocessed() -> None:
    # GIVEN 3 records that arrived 2 hours ago, then 2 fresh ones, and a one-hour maximum age
    config = FailureConfig(max_record_age_s=3600, destination=DESTINATION)
    batch = records(3, arrived=NOW - 7200) + records(2, start=4)
    ports = Ports(fails=poison())
    outcome, delivery = deliver(config, ports, batch)
    # THEN the old ones are recorded and checkpointed past, the fresh ones processed
    assert outcome is Delivered.DONE
    assert ports.recorded == [(RECORD_AGE_EXCEEDED, ["1001", "1002", "1003"], 0)]
    assert ports.checkpoints == ["1003"]
    assert ports.processed == ["1004", "1005"]
    assert delivery.stats.expired == 3


def test_a_wait_cut_short_interrupts_the_delivery() -> None:
    ports = Ports(fails=poison("1001"), interrupt_after_waits=0)
    outcome, _ = deliver(FailureConfig(), ports, records(2))
    assert outcome is Delivered.INTERRUPTED
    assert len(ports.calls) == 1


def test_skip_logs_and_moves_on_without_a_destination() -> None:
    ports = Ports(fails=poison("1002"))
    outcome, delivery = deliver(FailureConfig(on_failure="skip", max_attempts=1), ports, records(3))
    assert outcome is Delivered.DONE
    assert delivery.stats.skipped == 3 and ports.recorded == [] and ports.checkpoints == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_failure": "skip-and-record"}, "needs a failure destination"),
        ({"max_record_age_s": 60}, "needs a failure destination"),
        ({"on_failure": "sometimes"}, "expected retry, skip-and-record, stop-shard or skip"),
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"destination": "https://sqs.us-east-1.amazonaws.com/1/q"}, "invalid failure destination"),
    ],
)
def test_invalid_policies_are_refused_with_one_line(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        FailureConfig(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(error.value)


def test_destinations_parse_from_arns_and_s3_urls() -> None:
    assert DestinationSpec.parse(DESTINATION).kind is DestinationKind.SQS
    assert DestinationSpec.parse("arn:aws:sns:eu-west-1:123456789012:failed.fifo").kind is DestinationKind.SNS
    s3 = DestinationSpec.parse("s3://my-bucket/failed/records")
    assert (s3.kind, s3.bucket, s3.prefix) == (DestinationKind.S3, "my-bucket", "failed/records/")
    assert DestinationSpec.parse("arn:aws:s3:::my-bucket").prefix == ""


def test_the_environment_sets_the_policy_and_the_older_names_still_work() -> None:
    config = FailureConfig.from_env(
        {
            "SHARDLEASE_FAILURE_POLICY": "skip-and-record",
            "SHARDLEASE_FAILURE_DESTINATION": "s3://b-1/x",
            "SHARDLEASE_MAX_ATTEMPTS": "5",
            "SHARDLEASE_BISECT": "false",
            "SHARDLEASE_MAX_RECORD_AGE_S": "600",
        }
    )
    assert (config.action, config.max_attempts, config.bisects, config.max_record_age_s) == (
        FailureAction.SKIP_AND_RECORD,
        5,
        False,
        600,
    )
    older = FailureConfig.from_env({"SHARDLEASE_PROCESSOR_FAILURE_POLICY": "stop", "SHARDLEASE_PROCESSOR_RETRIES": "1"})
    assert (older.action, older.max_attempts, older.bisects) == (FailureAction.RETRY, 2, False)
