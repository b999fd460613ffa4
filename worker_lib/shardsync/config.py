"""Shard sync on the leader: where new leases start, how often, what is cleaned up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from worker_lib.core.config import InitialPosition, parse_timestamp
from worker_lib.core.env import env_bool, env_int, env_str, environ
from worker_lib.core.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ShardSyncConfig:
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

    initial_position: InitialPosition = InitialPosition.LATEST
    initial_timestamp: datetime | None = None
    interval_ms: int = 60_000
    cleanup_enabled: bool = True
    delete_unknown_shard_leases: bool = True
    list_shards_page_size: int = 1000
    former_stream_grace_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if self.initial_position is InitialPosition.AT_TIMESTAMP and self.initial_timestamp is None:
            raise ConfigError("initial position AT_TIMESTAMP needs a timestamp (--timestamp ISO)")
        if self.initial_position is not InitialPosition.AT_TIMESTAMP and self.initial_timestamp is not None:
            raise ConfigError("a timestamp is only valid with initial position AT_TIMESTAMP")
        if self.interval_ms < 1_000:
            raise ConfigError("shard sync interval_ms must be at least 1000")
        if not 1 <= self.list_shards_page_size <= 10_000:
            raise ConfigError("list_shards_page_size must be within 1..10000")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ShardSyncConfig:
        e = environ(env)
        position = InitialPosition.parse(env_str(e, "SHARDLEASE_INITIAL_POSITION", "LATEST"))
        raw_ts = env_str(e, "SHARDLEASE_INITIAL_TIMESTAMP")
        return cls(
            initial_position=position,
            initial_timestamp=parse_timestamp(raw_ts) if raw_ts else None,
            interval_ms=env_int(e, "SHARDLEASE_SHARD_SYNC_INTERVAL_MS", 60_000),
            cleanup_enabled=env_bool(e, "SHARDLEASE_LEASE_CLEANUP", True),
            delete_unknown_shard_leases=env_bool(e, "SHARDLEASE_DELETE_UNKNOWN_SHARD_LEASES", True),
            former_stream_grace_ms=env_int(e, "SHARDLEASE_FORMER_STREAM_GRACE_MS", 3_600_000),
        )
