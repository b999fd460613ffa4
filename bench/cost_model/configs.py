"""The configurations measured side by side (``lease``, ``worker``, ``kcl``): the environment each sets on every
worker and the leader, its liveness mode and title, and the leader Lambda's budget and schedule.

Everything that differs between configurations is here, so a new configuration is one entry per table.
"""

from __future__ import annotations

from kcl3_timings import KCL_ENV

from worker_lib.leases.mode import LivenessMode

MODE_ENV = "SHARDLEASE_LIVENESS_MODE"
CONFIG_MODE = {"lease": LivenessMode.LEASE, "worker": LivenessMode.WORKER, "kcl": LivenessMode.LEASE}
CONFIG_ENV: dict[str, dict[str, str]] = {
    "lease": {MODE_ENV: LivenessMode.LEASE.value},
    "worker": {MODE_ENV: LivenessMode.WORKER.value},
    "kcl": {**KCL_ENV, MODE_ENV: LivenessMode.LEASE.value},
}
CONFIG_TITLE = {"lease": "lease mode", "worker": "worker mode", "kcl": "KCL timings"}
CONFIG_ALIASES = {"ours": "lease"}  # the name of the lease-mode configuration before liveness modes existed
LAMBDA_BUDGET_S = {"lease": 80.0, "worker": 80.0, "kcl": 60.0}  # the leader function's timeout per configuration
SCHEDULE_S = 60.0  # EventBridge rate(1 minute)
# Settings the bench controls: unset in every configuration unless it gives them (``environment``).
MANAGED_ENV = frozenset(
    {
        *KCL_ENV,
        MODE_ENV,
        "SHARDLEASE_LIVENESS_MODE_CHECK_MS",
        "SHARDLEASE_THROUGHPUT_UPDATE_INTERVAL_MS",
        "SHARDLEASE_FAILOVER_TIME_MS",
    }
)
