"""Failure destinations: where the records a failure policy gives up on are kept (SQS, SNS, S3).

Each message is Lambda's on-failure record for Kinesis (``requestContext.condition``, ``KinesisBatchInfo`` with
the shard and the sequence range), so whatever already reads a Lambda event source mapping's destination reads
ours; a ``shardlease`` block adds the application, the worker, the stream, sub-sequence numbers, the attempts and
the error's type and message. S3 objects carry the records too (``payload``, Lambda's Kinesis event shape with the
data base64-encoded), SQS and SNS messages only the metadata (records can be re-read from the stream while it
retains them). An S3 object's key is derived from the shard and the sequence range, so a report sent twice (a
worker killed between sending and checkpointing) overwrites itself.

A destination raises :class:`~worker_lib.core.errors.DependencyError` when it cannot take the report; the consumer
retries and holds the shard meanwhile: nothing is checkpointed past records that are neither processed nor kept.
No record payload is ever logged.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import KinesisRecord
from worker_lib.processing.config import DestinationKind, DestinationSpec

if TYPE_CHECKING:
    import boto3

ERROR_MESSAGE_LIMIT = 1_000  # characters of the processor's error message kept in a report


@dataclass(frozen=True, kw_only=True)
class FailureReport:
    """Records a failure policy gave up on, and why."""

    application: str
    worker_id: str
    stream: str
    shard_id: str
    condition: str  # RetryAttemptsExhausted | RecordAgeExceeded
    attempts: int
    records: Sequence[KinesisRecord]
    error_type: str | None = None
    error_message: str | None = None
    stream_arn: str | None = None
    at: float = 0.0  # wall-clock seconds

    def document(self, *, with_records: bool) -> dict[str, Any]:
        first, last = self.records[0], self.records[-1]
        document: dict[str, Any] = {
            "requestContext": {
                "requestId": str(uuid.uuid4()),
                "condition": self.condition,
                "approximateInvokeCount": self.attempts,
            },
            "responseContext": {"functionError": "Unhandled"} if self.error_type else {},
            "version": "1.0",
            "timestamp": _iso(self.at),
            "KinesisBatchInfo": {
                "shardId": self.shard_id,
                "startSequenceNumber": first.sequence_number,
                "endSequenceNumber": last.sequence_number,
                "approximateArrivalOfFirstRecord": _iso_or_none(first.approximate_arrival_timestamp),
                "approximateArrivalOfLastRecord": _iso_or_none(last.approximate_arrival_timestamp),
                "batchSize": len(self.records),
                "streamArn": self.stream_arn,
            },
            "shardlease": {
                "application": self.application,
                "workerId": self.worker_id,
                "streamName": self.stream,
                "startSubSequenceNumber": first.sub_sequence_number,
                "endSubSequenceNumber": last.sub_sequence_number,
                "attempts": self.attempts,
                "errorType": self.error_type,
                "errorMessage": self.error_message,
            },
        }
        if with_records:
            document["payload"] = {"Records": [self._event_record(record) for record in self.records]}
        return document

    def _event_record(self, record: KinesisRecord) -> dict[str, Any]:
        arrival = record.approximate_arrival_timestamp
        return {
            "kinesis": {
                "kinesisSchemaVersion": "1.0",
                "partitionKey": record.partition_key,
                "sequenceNumber": record.sequence_number,
                "subSequenceNumber": record.sub_sequence_number,
                "data": base64.b64encode(record.data).decode("ascii"),
                "approximateArrivalTimestamp": None if arrival is None else _utc(arrival).timestamp(),
            },
            "eventSource": "aws:kinesis",
            "eventID": f"{self.shard_id}:{record.sequence_number}",
            "eventSourceARN": self.stream_arn,
        }

    @property
    def object_name(self) -> str:
        """The S3 key's last part: the shard and the sequence range (a report sent again overwrites itself)."""
        first, last = self.records[0], self.records[-1]
        return (
            f"{self.application}/{self.stream}/{self.shard_id}/"
            f"{first.sequence_number}-{first.sub_sequence_number}_{last.sequence_number}-{last.sub_sequence_number}.json"
        )


def describe_error(error: BaseException | None) -> tuple[str | None, str | None]:
    """The error's type name and its message's first line, cut to :data:`ERROR_MESSAGE_LIMIT` characters."""
    if error is None:
        return None, None
    lines = str(error).splitlines()
    return type(error).__name__, (lines[0] if lines else "")[:ERROR_MESSAGE_LIMIT]


class FailureDestination(Protocol):
    """Keeps a :class:`FailureReport`; raises a DependencyError when it cannot."""

    @property
    def description(self) -> str:
        """What it is, for logs (an ARN or an S3 URL; never a record)."""
        ...

    def send(self, report: FailureReport) -> None: ...


class SqsDestination:
    def __init__(self, client: Any, queue_arn: str) -> None:
        self._client = client
        self._arn = queue_arn
        self._url: str | None = None

    @property
    def description(self) -> str:
        return self._arn

    def _queue_url(self) -> str:
        if self._url is None:
            _, _, _, _, account, name = self._arn.split(":", 5)
            with aws.translated("sqs GetQueueUrl", self._arn):
                reply = self._client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)
            self._url = str(reply["QueueUrl"])
        return self._url

    def send(self, report: FailureReport) -> None:
        body = json.dumps(report.document(with_records=False))
        with aws.translated("sqs SendMessage", self._arn):
            self._client.send_message(QueueUrl=self._queue_url(), MessageBody=body)


class SnsDestination:
    def __init__(self, client: Any, topic_arn: str) -> None:
        self._client = client
        self._arn = topic_arn

    @property
    def description(self) -> str:
        return self._arn

    def send(self, report: FailureReport) -> None:
        body = json.dumps(report.document(with_records=False))
        with aws.translated("sns Publish", self._arn):
            self._client.publish(TopicArn=self._arn, Message=body)


class S3Destination:
    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix

    @property
    def description(self) -> str:
        return f"s3://{self._bucket}/{self._prefix}"

    def key_for(self, report: FailureReport) -> str:
        return f"{self._prefix}{report.object_name}"

    def send(self, report: FailureReport) -> None:
        body = json.dumps(report.document(with_records=True)).encode()
        with aws.translated("s3 PutObject", f"s3://{self._bucket}"):
            self._client.put_object(
                Bucket=self._bucket, Key=self.key_for(report), Body=body, ContentType="application/json"
            )


def make_destination(
    spec: DestinationSpec, aws_config: AwsConfig, boto3_session: boto3.Session | None = None
) -> FailureDestination:
    """The destination ``spec`` names, with a client of its own service."""
    if spec.kind is DestinationKind.SQS:
        return SqsDestination(aws.client("sqs", aws_config, boto3_session), spec.arn)
    if spec.kind is DestinationKind.SNS:
        return SnsDestination(aws.client("sns", aws_config, boto3_session), spec.arn)
    return S3Destination(aws.client("s3", aws_config, boto3_session), spec.bucket, spec.prefix)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _iso_or_none(moment: datetime | None) -> str | None:
    return None if moment is None else _iso(_utc(moment).timestamp())
