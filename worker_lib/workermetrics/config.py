"""Configuration of the worker-metrics reporter (docs/kcl-compatibility.md: "Worker-metrics table", "Defaults")."""

from __future__ import annotations

from dataclasses import dataclass

from worker_lib.core.env import EnvSettings, setting
from worker_lib.core.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class WorkerMetricsConfig(EnvSettings):
    """How often worker metrics are sampled and written to ``<app>-WorkerMetricStats``.

    sample_interval_ms: how often every metric is sampled in memory (KCL 1000).
      ``SHARDLEASE_WORKER_METRICS_SAMPLE_INTERVAL_MS``.
    report_interval_ms: how often the average of the samples since the last report is appended to ``sts`` and
      the item written (KCL 30 000). The leader treats a worker as inactive when its ``lut`` is older than
      2 × this. ``SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS``.
    first_report_delay_ms: delay of the first write after start, so a new worker is visible to the leader
      quickly (KCL 2000). ``SHARDLEASE_WORKER_METRICS_FIRST_REPORT_DELAY_MS``.
    max_values: how many window averages ``sts[metric]`` keeps, newest last (KCL 10).
      ``SHARDLEASE_WORKER_METRICS_MAX_VALUES``.
    """

    sample_interval_ms: int = setting(1_000, "SHARDLEASE_WORKER_METRICS_SAMPLE_INTERVAL_MS")
    report_interval_ms: int = setting(30_000, "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS")
    first_report_delay_ms: int = setting(2_000, "SHARDLEASE_WORKER_METRICS_FIRST_REPORT_DELAY_MS")
    max_values: int = setting(10, "SHARDLEASE_WORKER_METRICS_MAX_VALUES")

    def __post_init__(self) -> None:
        if self.sample_interval_ms <= 0:
            raise ConfigError(f"sample_interval_ms must be positive, got {self.sample_interval_ms}")
        if self.report_interval_ms < self.sample_interval_ms:
            raise ConfigError(
                f"report_interval_ms ({self.report_interval_ms}) must be at least sample_interval_ms "
                f"({self.sample_interval_ms})"
            )
        if self.first_report_delay_ms < 0:
            raise ConfigError(f"first_report_delay_ms must not be negative, got {self.first_report_delay_ms}")
        if self.max_values < 1:
            raise ConfigError(f"max_values must be at least 1, got {self.max_values}")
