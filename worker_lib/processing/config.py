"""Configuration of record retrieval (polling GetRecords), in the style of :mod:`worker_lib.config`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from worker_lib.config import _env, _env_int
from worker_lib.core.errors import ConfigError

GET_RECORDS_LIMIT = 10_000  # the Kinesis maximum for GetRecords' Limit
KINESIS_MIN_CALL_INTERVAL_MS = 200  # Kinesis allows 5 GetRecords calls per second per shard


@dataclass(frozen=True, kw_only=True)
class RetrievalConfig:
    """How a shard consumer polls GetRecords.

    max_records: GetRecords ``Limit`` (KCL maxRecords, 10 000 = the Kinesis maximum).
    idle_time_between_reads_ms: wait after a read that returned nothing and was not behind the tip of the
      shard (KCL idleTimeBetweenReadsInMillis; 1000).
    min_interval_between_calls_ms: least time between two GetRecords calls on one shard (200 = the Kinesis
      limit of 5 calls/s per shard; lower values are rejected).
    throttle_backoff_base_ms / throttle_backoff_max_ms: after ProvisionedThroughputExceeded / LimitExceeded the
      next call waits base × 2^(n−1) for the n-th consecutive throttle, capped at max (500 / 10 000).
    """

    max_records: int = GET_RECORDS_LIMIT
    idle_time_between_reads_ms: int = 1_000
    min_interval_between_calls_ms: int = KINESIS_MIN_CALL_INTERVAL_MS
    throttle_backoff_base_ms: int = 500
    throttle_backoff_max_ms: int = 10_000

    def __post_init__(self) -> None:
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

    def throttle_backoff_s(self, consecutive_throttles: int) -> float:
        """Seconds to wait after the ``consecutive_throttles``-th throttled call in a row (≥ 1)."""
        exponent = min(max(consecutive_throttles, 1) - 1, 30)
        delay_ms: int = min(self.throttle_backoff_base_ms << exponent, self.throttle_backoff_max_ms)
        return delay_ms / 1000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetrievalConfig:
        e = _env(env)
        return cls(
            max_records=_env_int(e, "SHARDLEASE_MAX_RECORDS", GET_RECORDS_LIMIT),
            idle_time_between_reads_ms=_env_int(e, "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS", 1_000),
            min_interval_between_calls_ms=_env_int(
                e, "SHARDLEASE_MIN_INTERVAL_BETWEEN_CALLS_MS", KINESIS_MIN_CALL_INTERVAL_MS
            ),
            throttle_backoff_base_ms=_env_int(e, "SHARDLEASE_THROTTLE_BACKOFF_BASE_MS", 500),
            throttle_backoff_max_ms=_env_int(e, "SHARDLEASE_THROTTLE_BACKOFF_MAX_MS", 10_000),
        )
