"""Configuration of lease assignment on the leader (KCL 3.x defaults: docs/kcl-compatibility.md; docs/assignment.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from worker_lib.core.env import env_lower, env_optional_float, env_optional_int, read_settings, setting
from worker_lib.core.errors import ConfigError
from worker_lib.workermetrics.config import WorkerMetricsConfig

Strategy = Literal["variance", "count"]
STRATEGIES: tuple[str, ...] = ("variance", "count")


def _strategy(env: Mapping[str, str], name: str, default: str) -> str:
    strategy = env_lower(env, name, default)
    if strategy not in STRATEGIES:
        raise ConfigError(f"invalid {name} {strategy!r}: expected variance or count")
    return strategy


def _report_interval_s(env: Mapping[str, str], name: str, default: float) -> float:
    """The workers' report interval, from their own setting (``name``), so that leader and workers agree."""
    return WorkerMetricsConfig.from_env(env).report_interval_ms / 1000


@dataclass(frozen=True, kw_only=True)
class AssignmentConfig:
    """How the leader assigns and balances leases. Defaults are KCL 3.x's unless noted.

    strategy: ``"variance"`` (KCL 3.x worker-utilisation-aware, default) or ``"count"`` (lease count, KCL 3.4.3+
      LeaseAssignmentStrategy.LEASE_COUNT); ``SHARDLEASE_ASSIGNMENT_STRATEGY``.
    rebalance_threshold_pct: a worker outside fleet average × (1 ± t/100) triggers balancing (10);
      ``SHARDLEASE_REBALANCE_THRESHOLD_PCT``.
    rebalance_min_gap_pct: the band is never narrower than ± this many points of the metric (2; ours only, not
      KCL): at low utilisation 10 % of the average is measurement noise, and balancing on it moves leases back
      and forth; ``SHARDLEASE_REBALANCE_MIN_GAP_PCT``.
    dampening_pct: share of a donor's excess moved in one balancing run (60; KCL code default — the deep-dive
      document says 80, the Java tests use 80); ``SHARDLEASE_DAMPENING_PCT``.
    balancing_frequency: balance on every Nth run (3: runs 1, 4, 7, …); ``SHARDLEASE_BALANCING_FREQUENCY``.
    ema_alpha: smoothing of the worker metric lists (0.5); ``SHARDLEASE_WORKER_METRICS_EMA_ALPHA``.
    max_leases_for_worker: hard cap per worker (None = unlimited); ``SHARDLEASE_MAX_LEASES_FOR_WORKER``.
    max_throughput_per_host_kbps: a worker at or above this total receives nothing more (None = unlimited);
      ``SHARDLEASE_MAX_THROUGHPUT_PER_HOST_KBPS``.
    allow_throughput_overshoot: when no donor lease fits the amount to move, move the smallest one (True);
      ``SHARDLEASE_ALLOW_THROUGHPUT_OVERSHOOT``.
    dynamic_cap: a dynamic maximum: leases per worker ≤ min(dynamic_cap, ceil(shards / workers)),
      recomputed on every decision from the snapshot's live shard and assignable-worker counts (never cached,
      so it follows resharding and fleet changes without restarts). None = off (default). Under the variance
      strategy it is a strict count cap on top of load balancing — see docs/assignment.md before enabling;
      ``SHARDLEASE_DYNAMIC_MAX_LEASES`` (e.g. 80).
    worker_report_interval_s: how often workers write metrics (30); a worker is inactive after 2 missed reports.
      From the workers' own setting, ``SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS``
      (:class:`~worker_lib.workermetrics.config.WorkerMetricsConfig`), so that leader and workers agree.
    The lease duration and the hand-off timeout are the lease settings' (:class:`~worker_lib.leases.config.
    LeaseConfig`: ``failover_time_ms``, ``graceful_handoff_timeout_ms``): the leader is given both.
    kcl_compatible: False (default) uses this project's refinements of the variance decider (docs/assignment.md,
      "Where we differ"); True reproduces KCL 3.x decisions, quirks included; ``SHARDLEASE_KCL_COMPATIBLE``.
    """

    strategy: Strategy = setting("variance", "SHARDLEASE_ASSIGNMENT_STRATEGY", _strategy)  # noqa: RUF009 (a field specifier)
    rebalance_threshold_pct: float = setting(10.0, "SHARDLEASE_REBALANCE_THRESHOLD_PCT")
    rebalance_min_gap_pct: float = setting(2.0, "SHARDLEASE_REBALANCE_MIN_GAP_PCT")
    dampening_pct: float = setting(60.0, "SHARDLEASE_DAMPENING_PCT")
    balancing_frequency: int = setting(3, "SHARDLEASE_BALANCING_FREQUENCY")
    ema_alpha: float = setting(0.5, "SHARDLEASE_WORKER_METRICS_EMA_ALPHA")
    max_leases_for_worker: int | None = setting(None, "SHARDLEASE_MAX_LEASES_FOR_WORKER", env_optional_int)
    max_throughput_per_host_kbps: float | None = setting(
        None, "SHARDLEASE_MAX_THROUGHPUT_PER_HOST_KBPS", env_optional_float
    )
    allow_throughput_overshoot: bool = setting(True, "SHARDLEASE_ALLOW_THROUGHPUT_OVERSHOOT")
    dynamic_cap: int | None = setting(None, "SHARDLEASE_DYNAMIC_MAX_LEASES", env_optional_int)
    # The workers' own setting: leader and workers agree.
    worker_report_interval_s: float = setting(30.0, "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS", _report_interval_s)
    kcl_compatible: bool = setting(False, "SHARDLEASE_KCL_COMPATIBLE")

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"invalid assignment strategy {self.strategy!r}: expected variance or count")
        if not 0 <= self.rebalance_threshold_pct <= 100 or math.isnan(self.rebalance_threshold_pct):
            raise ConfigError(f"rebalance_threshold_pct={self.rebalance_threshold_pct} must be within 0..100")
        if not 0 <= self.rebalance_min_gap_pct <= 100 or math.isnan(self.rebalance_min_gap_pct):
            raise ConfigError(f"rebalance_min_gap_pct={self.rebalance_min_gap_pct} must be within 0..100")
        if not 0 < self.dampening_pct <= 100:
            raise ConfigError(f"dampening_pct={self.dampening_pct} must be within 1..100")
        if self.balancing_frequency < 1:
            raise ConfigError(f"balancing_frequency={self.balancing_frequency} must be at least 1")
        if not 0 < self.ema_alpha <= 1:
            raise ConfigError(f"ema_alpha={self.ema_alpha} must be within (0, 1]")
        if self.max_leases_for_worker is not None and self.max_leases_for_worker < 1:
            raise ConfigError(f"max_leases_for_worker={self.max_leases_for_worker} must be at least 1 (or None)")
        if self.max_throughput_per_host_kbps is not None and not self.max_throughput_per_host_kbps > 0:
            raise ConfigError(
                f"max_throughput_per_host_kbps={self.max_throughput_per_host_kbps} must be positive (or None)"
            )
        if self.dynamic_cap is not None and self.dynamic_cap < 1:
            raise ConfigError(f"dynamic_cap={self.dynamic_cap} must be at least 1 (or None to disable)")
        if not self.worker_report_interval_s > 0:
            raise ConfigError(f"worker_report_interval_s={self.worker_report_interval_s} must be positive")

    def is_balancing_run(self, run_number: int) -> bool:
        """KCL's run counter: balance on runs 1, 1 + f, 1 + 2f, … of a leadership term."""
        return (run_number - 1) % self.balancing_frequency == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> AssignmentConfig:
        """The environment's settings; ``overrides`` that are not ``None`` win (a worker's own report interval)."""
        return read_settings(cls, env, **overrides)


def effective_cap(config: AssignmentConfig, *, shard_count: int, worker_count: int) -> int | None:
    """The per-worker lease cap for one decision: ``max_leases_for_worker`` and, when enabled, the dynamic
    ``min(dynamic_cap, ceil(shards / workers))`` — whichever is lower. None = unlimited.

    Recomputed from live counts on every call; with no assignable worker the dynamic part is not applied.
    """
    caps: list[int] = []
    if config.max_leases_for_worker is not None:
        caps.append(config.max_leases_for_worker)
    if config.dynamic_cap is not None and worker_count > 0:
        per_worker = max(1, -(-shard_count // worker_count))
        caps.append(min(config.dynamic_cap, per_worker))
    return min(caps) if caps else None
