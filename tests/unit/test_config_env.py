"""Configuration read from the environment: the per-process CPU metric choice and shard-sync flags."""

from __future__ import annotations

import pytest

from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import ConfigError
from worker_lib.workermetrics.cpu import ProcessCpu, cpu_metric_from_env


def test_process_cpu_is_the_share_of_host_cpus_used_by_this_process() -> None:
    # GIVEN a process that used 1.5 CPU-seconds in 1 s of wall time on a 4-CPU host
    clock = ManualClock()
    used = iter([10.0, 11.5])
    metric = ProcessCpu(clock=clock, cpus=4, cpu_seconds=lambda: next(used))
    # WHEN it is sampled twice, one second apart
    first = metric.sample()
    clock.advance(1.0)
    second = metric.sample()
    # THEN the first sample is 0 (no baseline) and the second 1.5 / 1 / 4 = 37.5 %
    assert first == 0.0 and second == pytest.approx(37.5)


def test_cpu_metric_selection_by_environment() -> None:
    assert cpu_metric_from_env({"SHARDLEASE_CPU_METRIC": "none"}) is None
    assert isinstance(cpu_metric_from_env({"SHARDLEASE_CPU_METRIC": "process"}), ProcessCpu)
    with pytest.raises(ConfigError, match="SHARDLEASE_CPU_METRIC"):
        cpu_metric_from_env({"SHARDLEASE_CPU_METRIC": "gpu"})


def test_shard_sync_cleanup_flags_come_from_the_environment() -> None:
    from worker_lib.config import ShardSyncConfig

    config = ShardSyncConfig.from_env(
        {"SHARDLEASE_LEASE_CLEANUP": "off", "SHARDLEASE_DELETE_UNKNOWN_SHARD_LEASES": "0"}
    )
    assert (config.cleanup_enabled, config.delete_unknown_shard_leases) == (False, False)
    assert ShardSyncConfig.from_env({}).cleanup_enabled
    with pytest.raises(ConfigError, match="SHARDLEASE_LEASE_CLEANUP"):
        ShardSyncConfig.from_env({"SHARDLEASE_LEASE_CLEANUP": "maybe"})
