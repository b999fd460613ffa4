"""Settings of the leader's ``DesiredWorkers`` signal (docs/autoscaling.md)."""

from __future__ import annotations

from dataclasses import dataclass

from worker_lib.core.env import EnvSettings, env_optional_int, setting
from worker_lib.core.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ScalingConfig(EnvSettings):
    """How the leader sizes the fleet. Each setting has a ``SHARDLEASE_SCALING_*`` variable (:meth:`from_env`).

    target_utilization_pct: every worker should stay under this CPU utilisation (70; ``_TARGET_UTILIZATION_PCT``);
      without CPU reports, this share of ``max_throughput_per_host_kbps``.
    headroom_pct: the fleet is sized so that its average worker sits this share below the target (15, so 59.5 %
      at the default target): room for the spread a balanced fleet still has (a hot shard, noise) (``_HEADROOM_PCT``).
    scale_in_band_pct: hysteresis; the fleet shrinks only to a size whose average would sit this many points under
      the sizing point (5), so a load hovering at a boundary does not flap (``_SCALE_IN_BAND_PCT``).
    scale_in_cooldown_s: no scale-in sooner than this after any change (600; ``_SCALE_IN_COOLDOWN_S``).
    scale_out_cooldown_s: a scale-out waits this long after any change (180, about a new worker's start): the
      workers asked for are not in the measurement yet, and a fleet catching up on a backlog is pinned at 100 %
      until they are (``_SCALE_OUT_COOLDOWN_S``). A leader's first decision needs no cool-down to scale out.
    lag_threshold_ms: MillisBehindLatest above this, and growing since the last cycle, asks for more workers than
      the load alone does (60 000; ``_LAG_THRESHOLD_MS``); no scale-in while any lag is above it.
    lag_step_pct: a lag-driven scale-out adds this share of the fleet, at least one worker (25; ``_LAG_STEP_PCT``).
    min_workers / max_workers: bounds (1 / None = no bound but the lease count; ``_MIN_WORKERS`` / ``_MAX_WORKERS``).
      The signal never asks for more workers than there are leases.
    drain_least_loaded: while the fleet is larger than the signal, the least loaded workers (the ones named to
      remove) receive no new leases, so they hold the fewest when stopped (False; ``_DRAIN_LEAST_LOADED``). Turn it
      on only with a scaler that stops exactly those workers (``worker_lib.testing.scaler``, a custom one): ECS and
      KEDA choose the task or pod themselves, and starving workers they then keep would only unbalance the fleet.
    """

    target_utilization_pct: float = setting(70.0, "SHARDLEASE_SCALING_TARGET_UTILIZATION_PCT")
    headroom_pct: float = setting(15.0, "SHARDLEASE_SCALING_HEADROOM_PCT")
    scale_in_band_pct: float = setting(5.0, "SHARDLEASE_SCALING_SCALE_IN_BAND_PCT")
    scale_in_cooldown_s: int = setting(600, "SHARDLEASE_SCALING_SCALE_IN_COOLDOWN_S")
    scale_out_cooldown_s: int = setting(180, "SHARDLEASE_SCALING_SCALE_OUT_COOLDOWN_S")
    lag_threshold_ms: int = setting(60_000, "SHARDLEASE_SCALING_LAG_THRESHOLD_MS")
    lag_step_pct: float = setting(25.0, "SHARDLEASE_SCALING_LAG_STEP_PCT")
    min_workers: int = setting(1, "SHARDLEASE_SCALING_MIN_WORKERS")
    max_workers: int | None = setting(None, "SHARDLEASE_SCALING_MAX_WORKERS", env_optional_int)
    drain_least_loaded: bool = setting(False, "SHARDLEASE_SCALING_DRAIN_LEAST_LOADED")

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization_pct <= 100:
            raise ConfigError(f"scaling target_utilization_pct={self.target_utilization_pct} must be in (0, 100]")
        if not 0 <= self.headroom_pct < 100:
            raise ConfigError(f"scaling headroom_pct={self.headroom_pct} must be in [0, 100)")
        if not 0 <= self.scale_in_band_pct < self.sizing_point_pct:
            raise ConfigError(
                f"scaling scale_in_band_pct={self.scale_in_band_pct} must be at least 0 and below the sizing point "
                f"({self.sizing_point_pct:.1f} %)"
            )
        if self.scale_in_cooldown_s < 0 or self.scale_out_cooldown_s < 0:
            raise ConfigError("scaling cool-downs must not be negative")
        if self.lag_threshold_ms < 1 or self.lag_step_pct <= 0:
            raise ConfigError("scaling lag_threshold_ms and lag_step_pct must be positive")
        if self.min_workers < 1:
            raise ConfigError(f"scaling min_workers={self.min_workers} must be at least 1")
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ConfigError(f"scaling max_workers={self.max_workers} is below min_workers={self.min_workers}")

    @property
    def sizing_point_pct(self) -> float:
        """The average utilisation the fleet is sized for: the target less the headroom."""
        return self.target_utilization_pct * (1 - self.headroom_pct / 100)
