"""The fleet sizes itself (docs/autoscaling.md), end to end on moto: a `shardlease leader` process publishing
DesiredWorkers to CloudWatch, a local scaler (worker_lib.testing.scaler) starting `shardlease worker` processes and
stopping them with SIGTERM, a producer that doubles its rate, then halves it.

The workers report no CPU (``SHARDLEASE_CPU_METRIC=none``: on a shared 2-core test machine a process's CPU says more
about its neighbours than about its load), so the demand is the leases' throughput against
``SHARDLEASE_MAX_THROUGHPUT_PER_HOST_KBPS`` = 100. Each worker has a capacity of 65 records/s (the journal
processor's ``SHARDLEASE_TEST_RECORDS_PER_S``) and reads 20 records a call:

* the fleet starts at its floor of 2 workers (``SHARDLEASE_SCALING_MIN_WORKERS``), before any record is written,
  so there is no backlog to catch up with; 80 records/s of 1 KB over 6 shards (demand 80 KB/s at the 59.5 % sizing
  point) needs no more;
* 160 records/s: 2 workers would need 80 records/s each; they read 130 KB/s, which asks for 3;
* back at 80 records/s the scale-in band allows 2 again. Cool-downs of 3 s (out) and 8 s (in).

A worker the scaler asks for starts 5 s later (an ECS task provisions for longer). What is proved here is what only
real processes show: the leader publishes DesiredWorkers, the fleet grows with the load and shrinks after it by
SIGTERM, nothing is lost, every stopped worker exits 0 and no lease stays without a live owner. Waits are liveness
bounds derived from these settings (tests/support/stalls.py). The sizing rules themselves (demand from throughput,
the sizing point, cool-downs, the scale-in band, lag, bounds) are proved exactly on a fake clock in
tests/unit/test_desired_workers.py, the scaler's delayed starts and cancellations in tests/unit/test_local_scaler.py,
a day of load in tests/unit/test_autoscale_sim.py; lag and cost figures are bench/autoscale.py's. The lag the
workers report is printed here as a figure, never asserted (it is a speed).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.journal_processor import PROCESSOR, read_journal
from tests.support.processes import (
    DISCOVERY_S,
    FAILOVER_S,
    GRACEFUL_STOP_S,
    LEADER_TIMINGS,
    PROCESS_START_S,
    READ_S,
    eventually_showing,
    fleet_start_s,
    ms_s,
    process_group,
)
from tests.support.recording import owners
from tests.support.stalls import hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import DependencyError
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.producers import Producer, shard_hash_keys
from worker_lib.testing.scaler import LocalScaler
from worker_lib.testing.streams import create_stream
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

NAMESPACE = "Autoscale"
REPORTS = {
    "SHARDLEASE_CPU_METRIC": "none",
    "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "1000",
    "SHARDLEASE_WORKER_METRICS_FIRST_REPORT_DELAY_MS": "200",
}
SCALING = {
    "SHARDLEASE_METRICS": "cloudwatch",
    "SHARDLEASE_METRICS_NAMESPACE": NAMESPACE,
    "SHARDLEASE_METRICS_FLUSH_INTERVAL_MS": "1000",
    "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "1000",
    "SHARDLEASE_LEADER_FAST_TICK_MS": "250",
    "SHARDLEASE_MAX_THROUGHPUT_PER_HOST_KBPS": "100",
    "SHARDLEASE_SCALING_SCALE_OUT_COOLDOWN_S": "3",
    "SHARDLEASE_SCALING_SCALE_IN_COOLDOWN_S": "8",
    "SHARDLEASE_SCALING_MIN_WORKERS": "2",
    "SHARDLEASE_SCALING_MAX_WORKERS": "4",
    "SHARDLEASE_SCALING_DRAIN_LEAST_LOADED": "true",
}
CAPACITY = {"SHARDLEASE_TEST_RECORDS_PER_S": "65", "SHARDLEASE_MAX_RECORDS": "20"}
START_DELAY_S = 5.0  # a new worker starts this long after the scaler asked for it
SCALER_STEP_S = 1.0  # the scaler reads DesiredWorkers this often
SCALER_WINDOW_S = 5.0  # … as the maximum over this window (LocalScaler's default, as an alarm's period)
SHARDS = 6
PER_TICK, TICK_S = 8, 0.1  # 80 records/s, doubled to 160

# The settings above in seconds, and what each phase is expected to take with them
MIN_WORKERS = int(SCALING["SHARDLEASE_SCALING_MIN_WORKERS"])
MAX_WORKERS = int(SCALING["SHARDLEASE_SCALING_MAX_WORKERS"])
CYCLE_S = ms_s(SCALING, "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS")
FLUSH_S = ms_s(SCALING, "SHARDLEASE_METRICS_FLUSH_INTERVAL_MS")
REPORT_S = ms_s(REPORTS, "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS")
RENEWAL_S = FAILOVER_S / 3  # a lease's throughput is written with its renewal
OUT_COOLDOWN_S = float(SCALING["SHARDLEASE_SCALING_SCALE_OUT_COOLDOWN_S"])
IN_COOLDOWN_S = float(SCALING["SHARDLEASE_SCALING_SCALE_IN_COOLDOWN_S"])
CAPACITY_PER_S = float(CAPACITY["SHARDLEASE_TEST_RECORDS_PER_S"])
RATE_PER_S = PER_TICK / TICK_S
SHARD_SYNC_S = ms_s(LEADER_TIMINGS, "SHARDLEASE_SHARD_SYNC_INTERVAL_MS")

ASKED_TO_READING_S = FLUSH_S + SCALER_STEP_S + START_DELAY_S + CYCLE_S + DISCOVERY_S + READ_S
"""A DesiredWorkers decision is published, the scaler reads it and starts a worker after its delay, the leader
assigns it leases, it finds and reads them (its own start: ``fleet_start_s``)."""
FLOOR_S = PROCESS_START_S + SHARD_SYNC_S + CYCLE_S + ASKED_TO_READING_S + fleet_start_s(MIN_WORKERS)
"""The leader starts, makes the leases, asks for the floor, which starts and reads."""
GROW_S = RENEWAL_S + REPORT_S + CYCLE_S + OUT_COOLDOWN_S + ASKED_TO_READING_S + PROCESS_START_S
"""The doubled rate shows in the leases' throughput, a cycle sizes the fleet after the scale-out cool-down, and the
new worker starts and reads."""
BACKLOG = (2 * RATE_PER_S - MIN_WORKERS * CAPACITY_PER_S) * GROW_S  # what the floor falls behind meanwhile
DRAIN_S = BACKLOG / ((MIN_WORKERS + 1) * CAPACITY_PER_S - RATE_PER_S)  # … and three catch up with at the base rate
SHRINK_S = DRAIN_S + RENEWAL_S + CYCLE_S + IN_COOLDOWN_S + SCALER_WINDOW_S + SCALER_STEP_S + GRACEFUL_STOP_S
"""The backlog drains, the halved throughput shows, the scale-in cool-down passes, the scaler's window forgets the
larger figure, and the surplus worker stops."""
HANDOVER_S = GRACEFUL_STOP_S + CYCLE_S + DISCOVERY_S + READ_S  # a stopped worker's leases read elsewhere

FLOOR_BOUND_S = hang_bound_s(FLOOR_S)
GROW_BOUND_S = hang_bound_s(GROW_S)
SHRINK_BOUND_S = hang_bound_s(SHRINK_S)
HANDOVER_BOUND_S = hang_bound_s(HANDOVER_S)
"""Also the bound on how long a lease may go without a live owner during the scale-in."""
TEST_BOUND_S = FLOOR_BOUND_S + 2 * HANDOVER_BOUND_S + GROW_BOUND_S + SHRINK_BOUND_S + 3 * HANDOVER_BOUND_S

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(int(TEST_BOUND_S) + 120)]


class Poller:
    """Calls ``sample()`` every ``interval_s`` on a thread of its own until ``close()`` (subclasses set their state
    before calling this constructor: the thread starts in it)."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def sample(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Idle(Poller):
    """The longest time any lease went without a live owner, polled every 0.2 s while ``watching`` is set."""

    def __init__(self, store: DynamoDBLeaseStore, live: Any) -> None:
        self.store, self.live = store, live
        self.watching = threading.Event()
        self.longest = 0.0
        self._since: dict[str, float] = {}
        super().__init__(0.2)

    def sample(self) -> None:
        if not self.watching.is_set():
            self._since.clear()
            return
        now, live = time.monotonic(), set(self.live())
        for key, owner in owners(self.store).items():
            if owner in live:
                self._since.pop(key, None)
            else:
                self.longest = max(self.longest, now - self._since.setdefault(key, now))


class Lag(Poller):
    """The worst ``MillisBehindLatest`` the live workers report (their worker-metrics rows), with how many run,
    polled every 0.5 s: a figure, printed."""

    def __init__(self, rows: WorkerMetricsStore, live: Callable[[], list[str]]) -> None:
        self.rows, self.live = rows, live
        self.series: list[tuple[float, int, int]] = []  # (monotonic, worst lag ms, workers running)
        super().__init__(0.5)

    def sample(self) -> None:
        live = set(self.live())
        try:
            rows = [row for row in self.rows.list_all() if row.worker_id in live]
        except DependencyError:
            return
        worst = max((max(row.lag_ms.values(), default=0) for row in rows), default=0)
        self.series.append((time.monotonic(), worst, len(live)))

    def worst_since(self, since: float, *, running: int | None = None) -> int:
        return max((ms for at, ms, n in self.series if at >= since and running in (None, n)), default=0)


def test_the_fleet_grows_with_the_load_and_shrinks_after_it_losing_nothing(
    moto_aws: AwsConfig, moto_endpoint: str, app_name: str, tmp_path: Path
) -> None:
    ddb, kinesis = aws.client("dynamodb", moto_aws), aws.client("kinesis", moto_aws)
    cloudwatch = aws.client("cloudwatch", moto_aws)
    ensure_tables(app_name, ddb)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, SHARDS)
    store = DynamoDBLeaseStore(app_name, client=ddb)
    journal = tmp_path / "journal.txt"
    journal.touch()
    args = ["--app", app_name, "--stream", stream, "--endpoint-url", moto_endpoint]
    stopped: set[str] = set()
    with process_group(tmp_path) as group:
        group.start_shardlease("leader", "leader", *args, env={**LEADER_TIMINGS, **REPORTS, **SCALING})

        def running() -> list[str]:
            return [p.name for p in group.live("worker") if p.name.startswith("scaled-") and p.name not in stopped]

        def start(name: str) -> None:
            env = {**REPORTS, **CAPACITY, "SHARDLEASE_LEADER_MODE": "none", "SHARDLEASE_TEST_JOURNAL": str(journal)}
            group.start_shardlease(name, "worker", *args, "--processor", PROCESSOR, "--worker-id", name, env=env)

        def stop(name: str) -> None:
            stopped.add(name)
            group.signal(name, signal.SIGTERM)

        def served() -> bool:
            """Every lease is owned by a running worker."""
            held = owners(store)
            return len(held) == SHARDS and all(owner in running() for owner in held.values())

        def readers() -> set[int]:
            return {r[0] for r in read_journal(journal)}

        scaler = LocalScaler(
            cloudwatch=cloudwatch,
            state=CoordinatorStateStore(app_name, client=ddb),
            namespace=NAMESPACE,
            app=app_name,
            running=running,
            start=start,
            stop=stop,
            start_delay_s=START_DELAY_S,
        )
        done = threading.Event()

        def scale() -> None:
            while not done.wait(SCALER_STEP_S):
                scaler.step()

        scaling = threading.Thread(target=scale, daemon=True)
        idle = Idle(store, running)
        lag = Lag(WorkerMetricsStore(app_name, client=ddb), running)
        keys = shard_hash_keys(kinesis, stream)
        producer = Producer(kinesis, stream, per_tick=PER_TICK, tick_s=TICK_S, hash_keys=keys, payload_bytes=1000)
        doubled = time.monotonic()
        try:
            scaling.start()
            # GIVEN the fleet at its floor of 2 workers serving every lease, before any record is written
            eventually_showing(
                lambda: len(running()) == MIN_WORKERS and served(),
                bound_s=FLOOR_BOUND_S,
                what=f"the scaler started the floor of {MIN_WORKERS} workers and they hold every lease",
                detail=lambda: (scaler.history[-5:], group.log("leader")[-2000:]),
            )
            with producer:
                # AND ~80 KB/s, which both of them read
                eventually_showing(
                    lambda: len(readers()) == MIN_WORKERS,
                    bound_s=HANDOVER_BOUND_S,
                    what="both workers process records",
                    detail=lambda: scaler.history[-5:],
                )
                # WHEN the producer doubles its rate
                producer.per_tick = 2 * PER_TICK
                doubled = time.monotonic()
                # THEN the fleet grows to 3 (the two cannot keep up: they read 130 KB/s, which asks for 3)
                grew_s = eventually_showing(
                    lambda: len(running()) >= MIN_WORKERS + 1 and served(),
                    bound_s=GROW_BOUND_S,
                    what="the fleet grew past its floor, every lease served",
                    detail=lambda: [(round(at - doubled, 1), d, r) for at, d, r in scaler.history][-30::3],
                )
                # WHEN it halves it again, THEN it shrinks back to 2, by SIGTERM to the worker the leader named, and no
                # lease goes without a live owner for longer than a hand-over's liveness bound meanwhile
                producer.per_tick = PER_TICK
                halved = time.monotonic()
                idle.watching.set()
                shrank_s = eventually_showing(
                    lambda: len(running()) == MIN_WORKERS,
                    bound_s=SHRINK_BOUND_S,
                    what=f"the fleet shrank back to {MIN_WORKERS}",
                    detail=lambda: [(round(at - halved, 1), d, r) for at, d, r in scaler.history][-30::3],
                )
                eventually_showing(
                    served,
                    bound_s=HANDOVER_BOUND_S,
                    what="the stopped workers' leases served",
                    detail=lambda: owners(store),
                )
                idle.watching.clear()
            produced = set(producer.produced)

            def processed() -> set[str]:
                return {r[4].split("|", 1)[0] for r in read_journal(journal)}  # the id before the padding

            # AND every record produced was processed
            eventually_showing(
                lambda: produced <= processed(),
                bound_s=HANDOVER_BOUND_S,
                what="every record processed",
                detail=lambda: f"{len(produced - processed())} missing",
            )
        finally:
            done.set()
            scaling.join(timeout=10)
            idle.close()
            lag.close()
        print(f"scaler history (desired, running): {[(d, r) for _, d, r in scaler.history][::5]}")
        worst_s = lag.worst_since(doubled) / 1000
        worst_at_floor_s = lag.worst_since(doubled, running=MIN_WORKERS) / 1000
        print(
            f"figures: grew past {MIN_WORKERS} {grew_s:.0f} s after the doubling, back to {MIN_WORKERS} "
            f"{shrank_s:.0f} s after the halving; worst lag after the doubling {worst_s:.1f} s (while {MIN_WORKERS} "
            f"ran {worst_at_floor_s:.1f} s); the longest a lease went without a live owner during the scale-in "
            f"{idle.longest:.1f} s (bench/autoscale.py: the sizing over a day; bench/failover.py `term`: hand-overs)"
        )
        assert idle.longest <= HANDOVER_BOUND_S, idle.longest
        # AND each stopped worker left cleanly on its SIGTERM
        assert stopped and all(group.wait(name, timeout_s=HANDOVER_BOUND_S) == 0 for name in stopped)
        # AND the fleet never went over its maximum (it may overshoot the 3 needed by one for a moment: a lease that
        # moved reads its backlog faster than the producer writes)
        assert MIN_WORKERS + 1 <= max(r for _, _, r in scaler.history) <= MAX_WORKERS
        assert "DesiredWorkers" in group.log("leader")
