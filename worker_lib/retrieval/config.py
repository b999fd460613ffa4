"""How a shard consumer reads its records: polling GetRecords or enhanced fan-out (:class:`RetrievalConfig`)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from worker_lib.core.backoff import Backoff
from worker_lib.core.env import EnvSettings, env_parsed, parse_choice, setting
from worker_lib.core.errors import ConfigError

GET_RECORDS_LIMIT = 10_000  # the Kinesis maximum for GetRecords' Limit
KINESIS_MIN_CALL_INTERVAL_MS = 200  # Kinesis allows 5 GetRecords calls per second per shard


class RetrievalMode(enum.Enum):
    """How a shard consumer gets its records.

    POLLING: GetRecords (the default): the shard's 2 MB/s and 5 calls/s are shared by every polling application.
    FANOUT: enhanced fan-out (SubscribeToShard): records pushed over a subscription of the application's own
      stream consumer, with 2 MB/s per shard for this application alone and ≈ 70 ms latency; billed per
      consumer-shard-hour and per GB (docs/fanout.md).
    """

    POLLING = "polling"
    FANOUT = "fanout"

    @classmethod
    def parse(cls, value: str | RetrievalMode, *, name: str = "retrieval") -> RetrievalMode:
        return parse_choice(cls, value, name=name)


CONSUMER_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
_CONSUMER_ARN = re.compile(r"^arn:aws[a-z-]*:kinesis:[a-z0-9-]+:\d{12}:stream/[^/]+/consumer/[^/:]+:\d+$")


_mode = env_parsed(lambda raw, name: RetrievalMode.parse(raw, name=name))


@dataclass(frozen=True, kw_only=True)
class RetrievalConfig(EnvSettings):
    """How a shard consumer reads its records: polling GetRecords, or enhanced fan-out.

    max_records: GetRecords ``Limit`` (KCL maxRecords, 10 000 = the Kinesis maximum).
    idle_time_between_reads_ms: wait after a read that returned nothing and was not behind the tip of the
      shard (KCL idleTimeBetweenReadsInMillis; 1000).
    min_interval_between_calls_ms: least time between two GetRecords calls on one shard (200 = the Kinesis
      limit of 5 calls/s per shard; lower values are rejected).
    throttle_backoff_base_ms / throttle_backoff_max_ms: after ProvisionedThroughputExceeded / LimitExceeded the
      next call waits base × 2^(n−1) for the n-th consecutive throttle, capped at max (500 / 10 000).
    mode: ``polling`` (default) or ``fanout`` (:class:`RetrievalMode`; ``SHARDLEASE_RETRIEVAL``).
    consumer_name: with fan-out, the stream consumer's name (default: the application's name, as in KCL);
      registered if missing, never deregistered (``SHARDLEASE_FANOUT_CONSUMER_NAME``).
    consumer_arn: with fan-out, a consumer created beforehand (the CDK construct's): used as it is, nothing is
      registered (``SHARDLEASE_FANOUT_CONSUMER_ARN``; single-stream applications).
    fanout_buffer_events: with fan-out, how many pushed events wait per shard while the processor works on one
      (2): beyond that the subscription is not read, and Kinesis stops pushing (backpressure, bounded memory).
    """

    max_records: int = setting(GET_RECORDS_LIMIT, "SHARDLEASE_MAX_RECORDS")
    idle_time_between_reads_ms: int = setting(1_000, "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS")
    min_interval_between_calls_ms: int = setting(
        KINESIS_MIN_CALL_INTERVAL_MS, "SHARDLEASE_MIN_INTERVAL_BETWEEN_CALLS_MS"
    )
    throttle_backoff_base_ms: int = setting(500, "SHARDLEASE_THROTTLE_BACKOFF_BASE_MS")
    throttle_backoff_max_ms: int = setting(10_000, "SHARDLEASE_THROTTLE_BACKOFF_MAX_MS")
    # A name is accepted too: "polling", "fanout".
    mode: RetrievalMode | str = setting(RetrievalMode.POLLING, "SHARDLEASE_RETRIEVAL", _mode)  # noqa: RUF009 (a field specifier)
    consumer_name: str = setting("", "SHARDLEASE_FANOUT_CONSUMER_NAME")
    consumer_arn: str = setting("", "SHARDLEASE_FANOUT_CONSUMER_ARN")
    fanout_buffer_events: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", RetrievalMode.parse(self.mode))
        if self.consumer_name and not CONSUMER_NAME_PATTERN.match(self.consumer_name):
            raise ConfigError(
                f"invalid fan-out consumer name {self.consumer_name!r}: use 1-128 letters, digits, '_', '.' or '-'"
            )
        if self.consumer_arn and not _CONSUMER_ARN.match(self.consumer_arn):
            raise ConfigError(
                f"invalid fan-out consumer ARN {self.consumer_arn!r}: expected arn:aws:kinesis:…:stream/S/consumer/C:…"
            )
        if self.fanout_buffer_events < 1:
            raise ConfigError("fanout_buffer_events must be at least 1")
        if not 1 <= self.max_records <= GET_RECORDS_LIMIT:
            raise ConfigError(f"max_records={self.max_records} must be within 1..{GET_RECORDS_LIMIT}")
        if self.min_interval_between_calls_ms < KINESIS_MIN_CALL_INTERVAL_MS:
            raise ConfigError(
                f"min_interval_between_calls_ms={self.min_interval_between_calls_ms} is below "
                f"{KINESIS_MIN_CALL_INTERVAL_MS} (Kinesis allows 5 GetRecords calls per second per shard)"
            )
        if self.idle_time_between_reads_ms < 0:
            raise ConfigError("idle_time_between_reads_ms must not be negative")
        if self.throttle_backoff_base_ms <= 0:
            raise ConfigError("throttle_backoff_base_ms must be positive")
        if self.throttle_backoff_max_ms < self.throttle_backoff_base_ms:
            raise ConfigError("throttle_backoff_max_ms must be at least throttle_backoff_base_ms")

    @property
    def throttle_backoff(self) -> Backoff:
        """The wait after each throttled call: exact (one reader per shard), no jitter."""
        return Backoff.of_ms(self.throttle_backoff_base_ms, self.throttle_backoff_max_ms)

    def throttle_backoff_s(self, consecutive_throttles: int) -> float:
        """Seconds to wait after the ``consecutive_throttles``-th throttled call in a row (≥ 1)."""
        return self.throttle_backoff.delay_s(consecutive_throttles)

    @property
    def fanout(self) -> bool:
        """Whether records come by enhanced fan-out."""
        return self.mode is RetrievalMode.FANOUT

    def consumer_name_for(self, app: str) -> str:
        """The fan-out consumer's name: the configured one, else the application's (KCL's default)."""
        return self.consumer_name or app
