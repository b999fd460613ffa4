"""Lease timing (KCL failoverTimeMillis and what derives from it); docs/api.md lists the variables."""

from __future__ import annotations

from dataclasses import dataclass

from worker_lib.core.env import EnvSettings, setting
from worker_lib.core.errors import ConfigError
from worker_lib.leases.mode import AUTO, LivenessMode, parse_setting

LEASE_MODE_HEARTBEAT_MS = 1_000
WORKER_MODE_HEARTBEAT_MS = 2_000


@dataclass(frozen=True, kw_only=True)
class LeaseConfig(EnvSettings):
    """Lease timing (KCL: failoverTimeMillis and what derives from it).

    failover_time_ms: lease duration; a lease whose counter has not moved for this long is expired (10 000).
    epsilon_ms: safety margin subtracted from the renewal interval (25).
    heartbeat_interval_ms: the worker heartbeat (docs/failover.md): one write per worker per interval that lets
      the leader see a departed or dead worker within about a second and brings back its notices of new leases
      (default 1000, or a third of the failover time if that is shorter; ``SHARDLEASE_HEARTBEAT_INTERVAL_MS``;
      0 = off: KCL's pace, liveness judged per lease only). Between 100 and a third of the failover time. Left
      at its default it follows the liveness mode: 1000 ms in ``lease`` mode, 2000 ms in ``worker`` mode (where the
      heartbeat is the only liveness write; docs/liveness-modes.md), each capped at a third of the failover time.
    liveness_mode: ``lease`` (default; every lease renewed, KCL-compatible), ``worker`` (one heartbeat per worker,
      leases written only on change) or ``auto`` (follow the mode stored for the application); a process refuses
      to start when an explicit setting disagrees with the stored mode (``SHARDLEASE_LIVENESS_MODE``).
    mode_check_interval_ms: how often a worker re-reads the stored mode, to follow a switch (60 000;
      ``SHARDLEASE_LIVENESS_MODE_CHECK_MS``).
    throughput_update_interval_ms: in ``worker`` mode, how often a lease's ``throughputKBps`` may be rewritten —
      only when it changed by more than a fifth (and 1 KBps) since the value stored (60 000;
      ``SHARDLEASE_THROUGHPUT_UPDATE_INTERVAL_MS``). In ``lease`` mode it rides on every renewal, as in KCL.
    graceful_handoff_timeout_ms / graceful_handoff_enabled: a rebalancing move lets the old owner checkpoint and
      let go (KCL 3.x's graceful lease hand-off), forced after the timeout (30 000;
      ``SHARDLEASE_GRACEFUL_HANDOFF_TIMEOUT_MS``); disabled, leases move at once (``SHARDLEASE_GRACEFUL_HANDOFF``,
      true; KCL's isGracefulLeaseHandoffEnabled).
    """

    failover_time_ms: int = setting(10_000, "SHARDLEASE_FAILOVER_TIME_MS")
    epsilon_ms: int = 25
    graceful_handoff_timeout_ms: int = setting(30_000, "SHARDLEASE_GRACEFUL_HANDOFF_TIMEOUT_MS")
    graceful_handoff_enabled: bool = setting(True, "SHARDLEASE_GRACEFUL_HANDOFF")
    heartbeat_interval_ms: int = setting(-1, "SHARDLEASE_HEARTBEAT_INTERVAL_MS")  # -1: by mode, see below
    liveness_mode: str = setting(LivenessMode.LEASE.value, "SHARDLEASE_LIVENESS_MODE")
    mode_check_interval_ms: int = setting(60_000, "SHARDLEASE_LIVENESS_MODE_CHECK_MS")
    throughput_update_interval_ms: int = setting(60_000, "SHARDLEASE_THROUGHPUT_UPDATE_INTERVAL_MS")

    def __post_init__(self) -> None:
        if self.failover_time_ms < 1_000:
            raise ConfigError(f"failover_time_ms={self.failover_time_ms} is too short (minimum 1000)")
        object.__setattr__(self, "liveness_mode", parse_setting(self.liveness_mode))
        if self.heartbeat_interval_ms == 0 and self.liveness_mode != LivenessMode.LEASE.value:
            raise ConfigError(
                f"liveness mode {self.liveness_mode!r} needs the worker heartbeat: heartbeat_interval_ms must not be 0"
            )
        if self.mode_check_interval_ms < 1_000:
            raise ConfigError("mode_check_interval_ms must be at least 1000")
        if self.throughput_update_interval_ms < 1_000:
            raise ConfigError("throughput_update_interval_ms must be at least 1000")
        if self.heartbeat_interval_ms != -1 and (
            self.heartbeat_interval_ms != 0 and not 100 <= self.heartbeat_interval_ms <= self.failover_time_ms // 3
        ):
            raise ConfigError(
                f"heartbeat_interval_ms={self.heartbeat_interval_ms} must be 0 (off) or between 100 and a third of "
                f"failover_time_ms ({self.failover_time_ms // 3})"
            )
        if not 0 <= self.epsilon_ms < self.failover_time_ms // 3:
            raise ConfigError("epsilon_ms must be between 0 and a third of failover_time_ms")
        if self.graceful_handoff_timeout_ms < 0:
            raise ConfigError("graceful_handoff_timeout_ms must not be negative")

    def heartbeat_interval_for(self, mode: LivenessMode) -> int:
        """The beat interval in ``mode``: the configured one, or by default 1 s (``lease``) / 2 s (``worker``),
        at most a third of the failover time."""
        if self.heartbeat_interval_ms != -1:
            return self.heartbeat_interval_ms
        default = WORKER_MODE_HEARTBEAT_MS if mode is LivenessMode.WORKER else LEASE_MODE_HEARTBEAT_MS
        return min(default, self.failover_time_ms // 3)

    @property
    def quiet_after_lapse_ms(self) -> int:
        """How long a fenced ``worker``-mode worker stays silent so that the leader judges it gone: the failover time
        plus two beats (worker_lib/leases/heartbeat.py, ``HeartbeatLoop``)."""
        return self.failover_time_ms + 2 * self.heartbeat_interval_for(LivenessMode.WORKER)

    @property
    def follows_stored_mode(self) -> bool:
        return self.liveness_mode == AUTO

    @property
    def failover_s(self) -> float:
        return self.failover_time_ms / 1000

    @property
    def handoff_deadline_ms(self) -> int:
        """KCL: the leader forces a graceful hand-off after the hand-off timeout plus the failover time (40 s)."""
        return self.graceful_handoff_timeout_ms + self.failover_time_ms

    @property
    def renewer_interval_ms(self) -> int:
        """KCL: failover / 3 − epsilon (3308 ms by default)."""
        return self.failover_time_ms // 3 - self.epsilon_ms

    @property
    def assignment_interval_ms(self) -> int:
        """KCL: leaseAssignmentIntervalMillis = 2 × failover time (20 s)."""
        return 2 * self.failover_time_ms

    @property
    def heartbeat_enabled(self) -> bool:
        return self.heartbeat_interval_ms != 0
