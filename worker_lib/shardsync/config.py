"""Shard sync on the leader: where new leases start, how often, what is cleaned up."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from worker_lib.core.config import InitialPosition, parse_timestamp
from worker_lib.core.env import EnvSettings, env_parsed, setting
from worker_lib.core.errors import ConfigError

_position = env_parsed(lambda raw, _: InitialPosition.parse(raw))
_timestamp = env_parsed(lambda raw, _: parse_timestamp(raw))


@dataclass(frozen=True, kw_only=True)
class ShardSyncConfig(EnvSettings):
    """Shard sync on the leader.

    initial_position / initial_timestamp: where leases for newly discovered, non-descendant shards start.
    interval_ms: how often the leader syncs (KCL shardSyncIntervalMillis, 60 s).
    cleanup_enabled: delete finished leases once their children have started (KCL default on).
    delete_unknown_shard_leases: delete leases of shards that ListShards no longer returns (trimmed).
    former_stream_grace_ms: multi-stream applications: how long a stream that is no longer tracked (but still exists)
      keeps its leases before they are deleted, counted from the first sync that found it untracked (1 hour;
      negative: never delete them, KCL's NoLeaseDeletionStrategy). A stream deleted in Kinesis loses its leases at
      once. ``SHARDLEASE_FORMER_STREAM_GRACE_MS``; docs/multi-stream.md.
    """

    initial_position: InitialPosition = setting(InitialPosition.LATEST, "SHARDLEASE_INITIAL_POSITION", _position)  # noqa: RUF009 (a field specifier)
    initial_timestamp: datetime | None = setting(None, "SHARDLEASE_INITIAL_TIMESTAMP", _timestamp)  # noqa: RUF009 (a field specifier)
    interval_ms: int = setting(60_000, "SHARDLEASE_SHARD_SYNC_INTERVAL_MS")
    cleanup_enabled: bool = setting(True, "SHARDLEASE_LEASE_CLEANUP")
    delete_unknown_shard_leases: bool = setting(True, "SHARDLEASE_DELETE_UNKNOWN_SHARD_LEASES")
    list_shards_page_size: int = 1000
    former_stream_grace_ms: int = setting(3_600_000, "SHARDLEASE_FORMER_STREAM_GRACE_MS")

    def __post_init__(self) -> None:
        if self.initial_position is InitialPosition.AT_TIMESTAMP and self.initial_timestamp is None:
            raise ConfigError("initial position AT_TIMESTAMP needs a timestamp (--timestamp ISO)")
        if self.initial_position is not InitialPosition.AT_TIMESTAMP and self.initial_timestamp is not None:
            raise ConfigError("a timestamp is only valid with initial position AT_TIMESTAMP")
        if self.interval_ms < 1_000:
            raise ConfigError("shard sync interval_ms must be at least 1000")
        if not 1 <= self.list_shards_page_size <= 10_000:
            raise ConfigError("list_shards_page_size must be within 1..10000")
