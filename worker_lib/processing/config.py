"""Configuration of the shard consumers: record retrieval (polling GetRecords or enhanced fan-out), the consumer's
own timings, and what happens when the processor fails (the failure policy)."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from worker_lib.core.backoff import Backoff
from worker_lib.core.env import EnvSettings, env_int, env_optional_bool, env_str, parse_choice, setting
from worker_lib.core.errors import ConfigError
from worker_lib.core.imports import import_attr
from worker_lib.core.models import KinesisRecord

MAX_PARALLELISM = 256  # Lambda's ParallelizationFactor stops at 10; a Python lane is cheaper than an invocation
PARTITION_KEY = "partition-key"
EXPLICIT_HASH_KEY = "explicit-hash-key"

LaneKeyFunction = Callable[[KinesisRecord], str]


def _partition_key(record: KinesisRecord) -> str:
    return record.partition_key


def _explicit_hash_key(record: KinesisRecord) -> str:
    return record.explicit_hash_key or record.partition_key


def resolve_lane_key(value: str | LaneKeyFunction) -> LaneKeyFunction:
    """``partition-key``, ``explicit-hash-key``, ``module:attr`` or a function, as the function it names."""
    if callable(value):
        return value
    text = value.strip()
    if text.lower() in ("", PARTITION_KEY):
        return _partition_key
    if text.lower() == EXPLICIT_HASH_KEY:
        return _explicit_hash_key
    if ":" not in text:
        raise ConfigError(
            f"invalid lane key {value!r}: expected {PARTITION_KEY}, {EXPLICIT_HASH_KEY} or a function module:attr"
        )
    function = import_attr(text, what="lane key", example="mypkg.keys:customer_of")
    if not callable(function):
        raise ConfigError(f"invalid lane key {value!r}: {text} is a {type(function).__name__}, not a function")
    return cast(LaneKeyFunction, function)


class FailureAction(enum.Enum):
    """What happens once a failing batch has used its attempts (docs/failures.md).

    RETRY (default, KCL-compatible): the lease is given up without a checkpoint; the batch is read again from the
      checkpoint by this or another worker. Nothing is ever skipped; a poison record holds its shard until fixed.
    SKIP_AND_RECORD: the failing records go to the failure destination, the checkpoint moves past them, the shard
      goes on. Lambda's event source mapping with an on-failure destination.
    STOP_SHARD: the shard stops at the failing record, marked in the lease table (``shardlease status`` shows it)
      and never assigned again until ``shardlease resume-shard``; for processors where order is sacred.
    SKIP: the failing records are logged and skipped (at most once for them; not recommended).
    """

    RETRY = "retry"
    SKIP_AND_RECORD = "skip-and-record"
    STOP_SHARD = "stop-shard"
    SKIP = "skip"

    @classmethod
    def parse(cls, value: str | FailureAction, *, name: str = "failure policy") -> FailureAction:
        # "stop": the name this action had before stop-shard existed
        return parse_choice(cls, value, name=name, aliases={"stop": cls.RETRY})


class DestinationKind(enum.Enum):
    SQS = "sqs"
    SNS = "sns"
    S3 = "s3"


_DESTINATION_ARN = re.compile(r"^arn:aws[a-z-]*:(sqs|sns):[a-z0-9-]+:\d{12}:[A-Za-z0-9_.-]+$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True, kw_only=True)
class DestinationSpec:
    """A failure destination: an SQS queue or SNS topic ARN, or an S3 bucket (``arn:aws:s3:::bucket`` or
    ``s3://bucket/prefix/``)."""

    kind: DestinationKind
    arn: str = ""
    bucket: str = ""
    prefix: str = ""

    @classmethod
    def parse(cls, value: str, *, name: str = "failure destination") -> DestinationSpec:
        text = value.strip()
        match = _DESTINATION_ARN.match(text)
        if match:
            return cls(kind=DestinationKind(match.group(1)), arn=text)
        for scheme in ("s3://", "arn:aws:s3:::"):
            if text.startswith(scheme):
                bucket, _, prefix = text[len(scheme) :].partition("/")
                if _BUCKET.match(bucket):
                    prefix = prefix.strip("/")
                    return cls(kind=DestinationKind.S3, bucket=bucket, prefix=f"{prefix}/" if prefix else "")
        raise ConfigError(
            f"invalid {name} {value!r}: expected an SQS queue ARN, an SNS topic ARN, arn:aws:s3:::BUCKET or "
            "s3://BUCKET/PREFIX"
        )


_OLD_POLICY = "SHARDLEASE_PROCESSOR_FAILURE_POLICY"  # the policy's older name
_OLD_RETRIES = "SHARDLEASE_PROCESSOR_RETRIES"  # the older setting: attempts after the first


def _failure_policy(env: Mapping[str, str], name: str, default: FailureAction) -> FailureAction:
    if not env_str(env, name) and env_str(env, _OLD_POLICY):
        name = _OLD_POLICY
    return FailureAction.parse(env_str(env, name) or default, name=name)


def _max_attempts(env: Mapping[str, str], name: str, default: int) -> int:
    if env_str(env, _OLD_RETRIES):
        default = env_int(env, _OLD_RETRIES, 0) + 1
    return env_int(env, name, default)


@dataclass(frozen=True, kw_only=True)
class FailureConfig(EnvSettings):
    """What a shard consumer does when the processor fails on a batch: Lambda's event source mapping settings,
    for a KCL-style consumer (docs/failures.md; the rules are in :mod:`worker_lib.processing.failures`).

    on_failure: what happens once the attempts are spent (:class:`FailureAction`; ``retry``, KCL-compatible).
      ``SHARDLEASE_FAILURE_POLICY``.
    max_attempts: deliveries of a failing batch in all, first included (3; Lambda ``MaximumRetryAttempts`` + 1).
      ``SHARDLEASE_MAX_ATTEMPTS``.
    retry_backoff_ms / retry_backoff_max_ms: wait before the n-th retry: base × 2^(n−1), capped (500 / 10 000).
      ``SHARDLEASE_RETRY_BACKOFF_MS``.
    bisect: split a failing batch in two, down to the failing record (Lambda ``BisectBatchOnFunctionError``).
      None (default): on with ``skip-and-record`` and ``stop-shard``, off with ``retry`` and ``skip``, so the
      default changes nothing. ``SHARDLEASE_BISECT``.
    max_record_age_s: records that arrived longer ago than this are not processed but sent to the destination
      (Lambda ``MaximumRecordAgeInSeconds``; 0: no limit, the default). ``SHARDLEASE_MAX_RECORD_AGE_S``.
    destination: where records given up on go: an SQS queue ARN, an SNS topic ARN, or an S3 bucket
      (``s3://bucket/prefix``); required by ``skip-and-record`` and ``max_record_age_s``.
      ``SHARDLEASE_FAILURE_DESTINATION``.
    """

    # A name is accepted too: "skip-and-record".
    on_failure: FailureAction | str = setting(FailureAction.RETRY, "SHARDLEASE_FAILURE_POLICY", _failure_policy)  # noqa: RUF009 (a field specifier)
    max_attempts: int = setting(3, "SHARDLEASE_MAX_ATTEMPTS", _max_attempts)
    retry_backoff_ms: int = setting(500, "SHARDLEASE_RETRY_BACKOFF_MS")
    retry_backoff_max_ms: int = 10_000
    bisect: bool | None = setting(None, "SHARDLEASE_BISECT", env_optional_bool)
    max_record_age_s: int = setting(0, "SHARDLEASE_MAX_RECORD_AGE_S")
    destination: str = setting("", "SHARDLEASE_FAILURE_DESTINATION")

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_failure", FailureAction.parse(self.on_failure))
        if not 1 <= self.max_attempts <= 10_000:
            raise ConfigError(f"max_attempts={self.max_attempts} must be within 1..10000")
        if self.retry_backoff_ms <= 0:
            raise ConfigError("retry_backoff_ms must be positive")
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ConfigError("retry_backoff_max_ms must be at least retry_backoff_ms")
        if not 0 <= self.max_record_age_s <= 604_800:
            raise ConfigError(f"max_record_age_s={self.max_record_age_s} must be within 0..604800 (0: no limit)")
        spec = self.destination_spec
        if spec is None and self.on_failure is FailureAction.SKIP_AND_RECORD:
            raise ConfigError("failure policy skip-and-record needs a failure destination (SQS, SNS or S3)")
        if spec is None and self.max_record_age_s:
            raise ConfigError("max_record_age_s needs a failure destination: the records it skips must go somewhere")

    @property
    def action(self) -> FailureAction:
        return FailureAction.parse(self.on_failure)

    @property
    def destination_spec(self) -> DestinationSpec | None:
        return DestinationSpec.parse(self.destination) if self.destination else None

    @property
    def bisects(self) -> bool:
        if self.bisect is not None:
            return self.bisect
        return self.action in (FailureAction.SKIP_AND_RECORD, FailureAction.STOP_SHARD)

    def retry_backoff_s(self, failed_attempts: int) -> float:
        """Seconds to wait after the ``failed_attempts``-th failure of a batch (≥ 1); exact, no jitter: one consumer
        retries one batch."""
        return Backoff.of_ms(self.retry_backoff_ms, self.retry_backoff_max_ms).delay_s(failed_attempts)


@dataclass(frozen=True, kw_only=True)
class ConsumerConfig(EnvSettings):
    """One shard consumer (one per held lease).

    (What happens when ``process_records`` fails is :class:`FailureConfig`'s.)
    parent_poll_interval_ms: how often a child shard re-checks whether its parents have ended (KCL
      parentShardPollIntervalMillis, 10 000).
    shard_end_retry_interval_ms: how often SHARD_END handling is retried when a merge partner's lease is missing
      or the processor did not checkpoint SHARD_END (5000).
    error_backoff_ms: wait after an infrastructure error while reading (1000).
    deliver_empty_batches: call ``process_records`` for a read that returned no records too (KCL's
      callProcessRecordsEvenForEmptyRecordList; False; with one lane only); ``SHARDLEASE_DELIVER_EMPTY_BATCHES``.

    Lanes (docs/worker.md, "Parallelism: key-ordered lanes"):

    parallelism: lanes per shard, 1–256 (1: one batch at a time, KCL's behaviour). With more, the records of a shard
      are dealt to lanes by key, each lane delivers its records in order, and lanes run concurrently: records of one
      key keep their order, records of different keys do not. ``SHARDLEASE_PARALLELISM``.
    lane_key: what keeps records in one lane: ``partition-key`` (default; a KPL aggregate's user records by their
      own keys), ``explicit-hash-key`` (its explicit hash key, else its partition key), or a function
      ``key(record) -> str`` (``module:attr`` in the variable). ``SHARDLEASE_LANE_KEY``.
    max_records_in_flight: records read but not yet done, per shard, before the reader waits (10 000): the memory
      bound. ``SHARDLEASE_MAX_RECORDS_IN_FLIGHT``.
    lane_checkpoint_interval_ms: with lanes the consumer checkpoints the watermark (every record before it done)
      itself, at most this often (1 000), and at every stop, hand-off and shard end.
      ``SHARDLEASE_LANE_CHECKPOINT_INTERVAL_MS``.
    lane_drain_timeout_ms: at a stop, hand-off or lost lease, how long lanes in flight may finish before the
      watermark is checkpointed and the lease moves (10 000). ``SHARDLEASE_LANE_DRAIN_TIMEOUT_MS``.
    """

    parent_poll_interval_ms: int = setting(10_000, "SHARDLEASE_PARENT_POLL_INTERVAL_MS")
    shard_end_retry_interval_ms: int = 5_000
    error_backoff_ms: int = 1_000
    deliver_empty_batches: bool = setting(False, "SHARDLEASE_DELIVER_EMPTY_BATCHES")
    parallelism: int = setting(1, "SHARDLEASE_PARALLELISM")
    lane_key: str | LaneKeyFunction = setting(PARTITION_KEY, "SHARDLEASE_LANE_KEY")  # noqa: RUF009 (a field specifier)
    max_records_in_flight: int = setting(10_000, "SHARDLEASE_MAX_RECORDS_IN_FLIGHT")
    lane_checkpoint_interval_ms: int = setting(1_000, "SHARDLEASE_LANE_CHECKPOINT_INTERVAL_MS")
    lane_drain_timeout_ms: int = setting(10_000, "SHARDLEASE_LANE_DRAIN_TIMEOUT_MS")

    def __post_init__(self) -> None:
        for name in ("parent_poll_interval_ms", "shard_end_retry_interval_ms", "max_records_in_flight"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.error_backoff_ms < 0:
            raise ConfigError("error_backoff_ms must not be negative")
        if not 1 <= self.parallelism <= MAX_PARALLELISM:
            raise ConfigError(f"parallelism={self.parallelism} must be within 1..{MAX_PARALLELISM}")
        for name in ("lane_checkpoint_interval_ms", "lane_drain_timeout_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        object.__setattr__(self, "lane_key", resolve_lane_key(self.lane_key))

    @property
    def key_of(self) -> LaneKeyFunction:
        """The lane key of a record (``lane_key`` resolved)."""
        return cast(LaneKeyFunction, self.lane_key)
