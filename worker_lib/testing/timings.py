"""Fast timings for tests and the demo: the same protocol as production at about five times KCL's pace.

KCL's defaults (a lease expires after 10 s, discovery every 10 s, a leader cycle every 20 s) make failover tests
slow. Set these variables (``monkeypatch.setenv`` for each, or ``env={**os.environ, **FAST_TIMINGS}`` for a worker
process) to exercise the same rules in seconds; docs/api.md describes each variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

FAST_TIMINGS: Mapping[str, str] = MappingProxyType(
    {
        "SHARDLEASE_FAILOVER_TIME_MS": "3000",
        "SHARDLEASE_DISCOVERY_INTERVAL_MS": "500",
        "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS": "200",
        "SHARDLEASE_PARENT_POLL_INTERVAL_MS": "500",
        # The leader's activity window is 2 × the report interval: 6 s is generous, because a 2-core laptop running
        # emulators, a producer and several workers delays reports by seconds (the heartbeat, not the report, is
        # how a dead worker is noticed).
        "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "3000",
        "SHARDLEASE_WORKER_METRICS_FIRST_REPORT_DELAY_MS": "500",
        "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "2000",
        "SHARDLEASE_LEADER_DEADLINE_MARGIN_MS": "1500",
        "SHARDLEASE_LEADER_LOCK_DURATION_MS": "6000",
        "SHARDLEASE_LEADER_HEARTBEAT_MS": "2000",
        "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "4000",
        "SHARDLEASE_BALANCING_FREQUENCY": "2",
        "SHARDLEASE_GRACEFUL_HANDOFF_TIMEOUT_MS": "5000",
    }
)
