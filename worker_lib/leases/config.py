"""Lease timing (KCL failoverTimeMillis and what derives from it); docs/api.md lists the variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from worker_lib.core.env import env_int, environ
from worker_lib.core.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class LeaseConfig:
    """Lease timing (KCL: failoverTimeMillis and what derives from it).

    failover_time_ms: lease duration; a lease whose counter has not moved for this long is expired (10 000).
    epsilon_ms: safety margin subtracted from the renewal interval (25).
    max_leases_for_worker: hard cap per worker (None = unlimited, as KCL).
    heartbeat_interval_ms: the worker heartbeat (docs/failover.md): one write per worker per interval that lets
      the leader see a departed or dead worker within about a second and brings back its notices of new leases
      (default 1000, or a third of the failover time if that is shorter; ``SHARDLEASE_HEARTBEAT_INTERVAL_MS``;
      0 = off: KCL's pace, liveness judged per lease only). Between 100 and a third of the failover time.
    """

    failover_time_ms: int = 10_000
    epsilon_ms: int = 25
    max_leases_for_worker: int | None = None
    graceful_handoff_timeout_ms: int = 30_000
    graceful_handoff_enabled: bool = True
    heartbeat_interval_ms: int = -1  # -1: the default, min(1000, failover / 3)

    def __post_init__(self) -> None:
        if self.failover_time_ms < 1_000:
            raise ConfigError(f"failover_time_ms={self.failover_time_ms} is too short (minimum 1000)")
        if self.heartbeat_interval_ms == -1:
            object.__setattr__(self, "heartbeat_interval_ms", min(1_000, self.failover_time_ms // 3))
        if self.heartbeat_interval_ms != 0 and not 100 <= self.heartbeat_interval_ms <= self.failover_time_ms // 3:
            raise ConfigError(
                f"heartbeat_interval_ms={self.heartbeat_interval_ms} must be 0 (off) or between 100 and a third of "
                f"failover_time_ms ({self.failover_time_ms // 3})"
            )
        if not 0 <= self.epsilon_ms < self.failover_time_ms // 3:
            raise ConfigError("epsilon_ms must be between 0 and a third of failover_time_ms")
        if self.max_leases_for_worker is not None and self.max_leases_for_worker < 1:
            raise ConfigError("max_leases_for_worker must be at least 1")
        if self.graceful_handoff_timeout_ms < 0:
            raise ConfigError("graceful_handoff_timeout_ms must not be negative")

    @property
    def renewer_interval_ms(self) -> int:
        """KCL: failover / 3 − epsilon (3308 ms by default)."""
        return self.failover_time_ms // 3 - self.epsilon_ms

    @property
    def assignment_interval_ms(self) -> int:
        """KCL: leaseAssignmentIntervalMillis = 2 × failover time (20 s)."""
        return 2 * self.failover_time_ms

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LeaseConfig:
        e = environ(env)
        cap = env_int(e, "SHARDLEASE_MAX_LEASES_FOR_WORKER", 0)
        return cls(
            failover_time_ms=env_int(e, "SHARDLEASE_FAILOVER_TIME_MS", 10_000),
            max_leases_for_worker=cap or None,
            graceful_handoff_timeout_ms=env_int(e, "SHARDLEASE_GRACEFUL_HANDOFF_TIMEOUT_MS", 30_000),
            heartbeat_interval_ms=env_int(e, "SHARDLEASE_HEARTBEAT_INTERVAL_MS", -1),
        )

    @property
    def heartbeat_enabled(self) -> bool:
        return self.heartbeat_interval_ms > 0
