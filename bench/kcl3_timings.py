"""The ``kcl`` configuration of the benchmarks (bench/failover.py, bench/cost_model.py): KCL 3.x's timings and read
pattern, set by environment on every worker and the leader — our code, not KCL's Java code.

No worker heartbeat and no leader reads between full cycles (the leader scans every 20 s, as KCL's), GSI discovery
every 9 975 ms per worker (KCL's only way to learn of new leases), a 30 s leader lock heartbeated every 10 s, and no
takeover wait. Both benchmarks run this leader as a Lambda with a 60 s timeout, so it leads until the deadline less
the 10 s margin (50 s of every minute; the 65 s default term does not bind).
"""

from __future__ import annotations

KCL_ENV: dict[str, str] = {
    "SHARDLEASE_HEARTBEAT_INTERVAL_MS": "0",  # no worker heartbeat
    "SHARDLEASE_LEADER_FAST_TICK_MS": "0",  # no fast leader reads between cycles
    "SHARDLEASE_DISCOVERY_INTERVAL_MS": "9975",  # KCL's GSI discovery interval
    "SHARDLEASE_LEADER_LOCK_DURATION_MS": "30000",
    "SHARDLEASE_LEADER_HEARTBEAT_MS": "10000",
    "SHARDLEASE_LEADER_TAKEOVER_WAIT_MS": "0",
}
