"""The fleet sizes itself (docs/autoscaling.md), end to end on moto: a `shardlease leader` process publishing
DesiredWorkers to CloudWatch, a local scaler (worker_lib.testing.scaler) starting `shardlease worker` processes and
stopping them with SIGTERM, a producer that doubles its rate, then halves it.

The workers report no CPU (``SHARDLEASE_CPU_METRIC=none``: on a shared 2-core test machine a process's CPU says more
about its neighbours than about its load), so the demand is the leases' throughput against
``SHARDLEASE_MAX_THROUGHPUT_PER_HOST_KBPS`` = 100. Each worker has a capacity of 65 records/s (the journal
processor's ``SHARDLEASE_TEST_RECORDS_PER_S``) and reads 20 records a call, so ``MillisBehindLatest`` shows a backlog:

* 80 records/s of 1 KB over 6 shards: 2 workers (demand 80 KB/s at the 59.5 % sizing point), 40 records/s each;
* 160 records/s: 2 workers would need 80 records/s each, so they fall behind; they read 130 KB/s, which already
  asks for 3, and at 3 (2 shards, 53 records/s each) the backlog drains: lag grows, then recovers;
* back at 80 records/s the scale-in band allows 2 again. Cool-downs of 3 s (out) and 8 s (in).

A worker the scaler asks for starts 5 s later (an ECS task provisions for longer): the doubled rate has time to show
as lag before help arrives, and the start's own backlog (one worker at first) is caught up before the rate doubles.
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
from tests.support.processes import LEADER_TIMINGS, process_group
from tests.support.recording import owners
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import DependencyError
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.producers import Producer, shard_hash_keys
from worker_lib.testing.scaler import LocalScaler
from worker_lib.testing.streams import create_stream
from worker_lib.testing.waiting import wait_until
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

pytestmark = pytest.mark.slow

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
    "SHARDLEASE_SCALING_MAX_WORKERS": "4",
    "SHARDLEASE_SCALING_DRAIN_LEAST_LOADED": "true",
}


CAPACITY = {"SHARDLEASE_TEST_RECORDS_PER_S": "65", "SHARDLEASE_MAX_RECORDS": "20"}
BEHIND_MS = 1_000  # fallen behind: a backlog of a second or more
CAUGHT_UP_MS = 500  # a 20-record read at 13–27 records/s per shard is under a second behind at worst
START_DELAY_S = 5.0  # a new worker starts this long after the scaler asked for it


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
    polled every 0.5 s."""

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

    def now(self) -> int:
        return self.series[-1][1] if self.series else 0

    def worst_since(self, since: float, *, running: int | None = None) -> int:
        return max((ms for at, ms, n in self.series if at >= since and running in (None, n)), default=0)

    def steady(self, running: int, for_s: float) -> bool:
        """``running`` workers and caught up for the last ``for_s`` seconds."""
        now = time.monotonic()
        recent = [(ms, n) for at, ms, n in self.series if at >= now - for_s]
        return len(recent) >= 2 * for_s - 2 and all(ms < CAUGHT_UP_MS and n == running for ms, n in recent)

    def around(self, at: float) -> list[tuple[float, int, int]]:
        return [(round(t - at, 1), ms, n) for t, ms, n in self.series if t >= at - 5][::2]


def test_the_fleet_grows_with_the_load_and_shrinks_after_it_losing_nothing(
    moto_aws: AwsConfig, moto_endpoint: str, app_name: str, tmp_path: Path
) -> None:
    ddb, kinesis = aws.client("dynamodb", moto_aws), aws.client("kinesis", moto_aws)
    cloudwatch = aws.client("cloudwatch", moto_aws)
    ensure_tables(app_name, ddb)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 6)
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
            while not done.wait(1.0):
                scaler.step()

        scaling = threading.Thread(target=scale, daemon=True)
        idle = Idle(store, running)
        lag = Lag(WorkerMetricsStore(app_name, client=ddb), running)
        keys = shard_hash_keys(kinesis, stream)
        producer = Producer(kinesis, stream, per_tick=8, tick_s=0.1, hash_keys=keys, payload_bytes=1000)
        try:
            scaling.start()
            with producer:
                # GIVEN ~80 KB/s: the fleet settles at 2 workers, caught up with the backlog it started with
                assert wait_until(lambda: lag.steady(2, 5), timeout_s=150), (scaler.history[-5:], lag.series[-5:])
                # WHEN the producer doubles its rate
                producer.per_tick = 16
                doubled = time.monotonic()
                # THEN the fleet falls behind: the two cannot keep up, and a new worker starts 5 s after it is asked
                # for, as a task provisions, then takes its leases over (the worker's prefetched batches hide the
                # first seconds of it: a fetch measures the lag, not the processor)
                assert wait_until(lambda: lag.worst_since(doubled) >= BEHIND_MS, timeout_s=40), str(
                    (lag.around(doubled), [(round(at - doubled, 1), d, r) for at, d, r in scaler.history][-30::3])
                )
                # AND the fleet grows to 3, with which the backlog drains: the lag recovers at the doubled rate
                assert wait_until(lambda: len(running()) >= 3, timeout_s=60), scaler.history[-5:]
                assert wait_until(lambda: lag.steady(len(running()), 2), timeout_s=90), lag.around(doubled)
                recovered = time.monotonic()
                # WHEN it halves it again, THEN it shrinks back to 2, by SIGTERM to the worker the leader named,
                # and no lease goes without a live owner for more than 5 s meanwhile
                producer.per_tick = 8
                idle.watching.set()
                assert wait_until(lambda: len(running()) == 2, timeout_s=90), scaler.history[-5:]
                assert wait_until(lambda: all(o in running() for o in owners(store).values()), timeout_s=15)
                idle.watching.clear()
            produced = set(producer.produced)

            def processed() -> set[str]:
                return {r[4].split("|", 1)[0] for r in read_journal(journal)}  # the id before the padding

            # AND every record produced was processed
            assert wait_until(lambda: produced <= processed(), timeout_s=60, step_s=1), len(produced - processed())
        finally:
            done.set()
            scaling.join(timeout=10)
            idle.close()
            lag.close()
        print(f"scaler history (desired, running): {[(d, r) for _, d, r in scaler.history][::5]}")
        print(
            f"lag after the rate doubled: worst {lag.worst_since(doubled) / 1000:.1f} s (while 2 workers ran "
            f"{lag.worst_since(doubled, running=2) / 1000:.1f} s), back under "
            f"{CAUGHT_UP_MS / 1000:.1f} s {recovered - doubled:.0f} s after the doubling"
        )
        print(f"longest a lease went without a live owner during scale-in: {idle.longest:.1f} s")
        assert idle.longest <= 5.0
        # AND each stopped worker left cleanly on its SIGTERM
        assert stopped and all(group.wait(name, timeout_s=30) == 0 for name in stopped)
        # (it may overshoot by one for a moment: a lease that moved reads its backlog faster than the producer writes)
        assert 3 <= max(r for _, _, r in scaler.history) <= 4
        assert "DesiredWorkers" in group.log("leader")
