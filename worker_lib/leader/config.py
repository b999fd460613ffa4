"""The leader lock and the leader loop; docs/leader-lock.md and docs/failover.md explain the defaults."""

from __future__ import annotations

from dataclasses import dataclass

from worker_lib.core.env import EnvSettings, setting
from worker_lib.core.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class LeaderLockConfig(EnvSettings):
    """The leader lock in ``<app>-CoordinatorState``.

    lease_duration_ms: how long a lock holder is leader after its last successful heartbeat (10 s). KCL uses
      120 s with observation-based expiry; ours is time-based so that a Lambda living < 1 min can take over
      from a dead leader at its first invocation (docs/leader-lock.md); 10 s bounds the leaderless time after a
      crash to about 12 s (docs/failover.md).
    heartbeat_interval_ms: how often the holder extends the lock (3 s; must be ≤ a third of the duration).
    max_clock_skew_ms: the bound we assume on wall-clock disagreement between hosts (1 s). A holder stops
      treating itself as leader this long before the expiry others will see.
    poll_interval_ms: how often a contender re-reads the lock while waiting (1 s).
    """

    lease_duration_ms: int = setting(10_000, "SHARDLEASE_LEADER_LOCK_DURATION_MS")
    heartbeat_interval_ms: int = setting(3_000, "SHARDLEASE_LEADER_HEARTBEAT_MS")
    max_clock_skew_ms: int = setting(1_000, "SHARDLEASE_MAX_CLOCK_SKEW_MS")
    poll_interval_ms: int = 1_000

    def __post_init__(self) -> None:
        if self.lease_duration_ms < 1_000:
            raise ConfigError("lease_duration_ms must be at least 1000")
        if not 0 < self.heartbeat_interval_ms * 3 <= self.lease_duration_ms:
            raise ConfigError("heartbeat_interval_ms must be positive and at most a third of lease_duration_ms")
        if not 0 <= self.max_clock_skew_ms < self.lease_duration_ms // 3:
            raise ConfigError("max_clock_skew_ms must be below a third of lease_duration_ms")
        if self.poll_interval_ms <= 0:
            raise ConfigError("poll_interval_ms must be positive")


@dataclass(frozen=True, kw_only=True)
class LeaderConfig(EnvSettings):
    """The leader loop (the same in the Lambda, an embedded thread and the CLI).

    cycle_interval_ms: time between assignment cycles (KCL leaseAssignmentIntervalMillis = 2 × failover, 20 s).
    max_consecutive_failures: leadership is released after this many failed cycles in a row (KCL: 3).
    deadline_margin_ms: a host with a time limit (Lambda) stops starting cycles this long before its deadline,
      so that it can finish the cycle in flight and release the lock for the next invocation (10 s).
    fast_tick_ms: between full cycles the leader reads the worker-metrics table this often and acts at once on a
      departed, silent or changed worker (docs/failover.md); 1000, or the cycle interval if that is shorter;
      ``SHARDLEASE_LEADER_FAST_TICK_MS``; 0 = off (KCL's pace: everything waits for the next full cycle).
    term_ms: how long one Lambda invocation leads before it releases the lock to the next one (65 000: the 1-minute
      schedule plus 5 s of overlap, so the next invocation is already waiting); ``SHARDLEASE_LEADER_TERM_MS``.
    takeover_wait_ms: an invocation that finds the lock held waits up to this long when the holder will release
      it (or its lock will expire) within that time, and takes over at once; otherwise it exits after one read
      (20 000); ``SHARDLEASE_LEADER_TAKEOVER_WAIT_MS``; 0 = always exit at once.
    """

    cycle_interval_ms: int = setting(20_000, "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS")
    max_consecutive_failures: int = setting(3, "SHARDLEASE_LEADER_MAX_FAILURES")
    deadline_margin_ms: int = setting(10_000, "SHARDLEASE_LEADER_DEADLINE_MARGIN_MS")
    fast_tick_ms: int = setting(-1, "SHARDLEASE_LEADER_FAST_TICK_MS")  # -1: min(1000, cycle_interval_ms)
    term_ms: int = setting(65_000, "SHARDLEASE_LEADER_TERM_MS")
    takeover_wait_ms: int = setting(20_000, "SHARDLEASE_LEADER_TAKEOVER_WAIT_MS")

    def __post_init__(self) -> None:
        if self.cycle_interval_ms < 100:
            raise ConfigError("leader cycle_interval_ms must be at least 100")
        if self.max_consecutive_failures < 1:
            raise ConfigError("max_consecutive_failures must be at least 1")
        if self.deadline_margin_ms < 0:
            raise ConfigError("deadline_margin_ms must not be negative")
        if self.fast_tick_ms == -1:
            object.__setattr__(self, "fast_tick_ms", min(1_000, self.cycle_interval_ms))
        if self.fast_tick_ms != 0 and not 100 <= self.fast_tick_ms <= self.cycle_interval_ms:
            raise ConfigError(
                f"fast_tick_ms={self.fast_tick_ms} must be 0 (off) or between 100 and cycle_interval_ms "
                f"({self.cycle_interval_ms})"
            )
        if self.term_ms < 1_000:
            raise ConfigError(f"term_ms={self.term_ms} must be at least 1000")
        if self.takeover_wait_ms < 0:
            raise ConfigError(f"takeover_wait_ms={self.takeover_wait_ms} must not be negative")
