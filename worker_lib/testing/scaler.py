"""A local stand-in for ECS or KEDA in tests: it follows the leader's ``DesiredWorkers`` (docs/autoscaling.md) by
starting workers and stopping them with SIGTERM — the only way the scaling path stops a worker.

Each :meth:`LocalScaler.step` reads ``DesiredWorkers`` from CloudWatch (the maximum over the last few seconds, as a
target-tracking alarm or KEDA reads it; moto in tests), then starts workers up to it, or stops the surplus: the
workers the leader named in its ``DesiredWorkers`` item (the least loaded) first, then the newest. What starting and
stopping mean is the caller's (``start`` / ``stop`` callables): in the e2e test, ``shardlease worker`` processes of a
:class:`~worker_lib.testing.processes.ProcessFleet` and SIGTERM.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError
from worker_lib.tables.coordinator_items import DESIRED_WORKERS_KEY
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.telemetry.names import APPLICATION_DIMENSION, LeaderMetric

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScalerStep:
    desired: int | None
    started: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()


class LocalScaler:
    def __init__(
        self,
        *,
        cloudwatch: Any,
        state: CoordinatorStateStore,
        namespace: str,
        app: str,
        running: Callable[[], Sequence[str]],
        start: Callable[[str], None],
        stop: Callable[[str], None],
        window_s: float = 5.0,
        start_delay_s: float = 0.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``start_delay_s``: a worker asked for starts this long after (an ECS task's provisioning, a pod's
        scheduling and image pull; 0: at once). It counts toward the fleet from the request on, as a pending task
        counts toward an ECS service's running count, and a surplus cancels pending starts before it stops anyone."""
        self._cloudwatch = cloudwatch
        self._state = state
        self._namespace, self._app = namespace, app
        self._running, self._start, self._stop = running, start, stop
        self._window_s = window_s
        self._start_delay_s = start_delay_s
        self._clock = clock
        self._started = 0
        self._pending: list[tuple[float, str]] = []  # (due on the monotonic clock, name), oldest first
        self.history: list[tuple[float, int, int]] = []  # (monotonic, desired, running and pending after the step)

    def desired(self) -> int | None:
        """The newest DesiredWorkers: the maximum over the last ``window_s`` seconds; None if none was put."""
        now = dt.datetime.fromtimestamp(self._clock.wall(), dt.timezone.utc)
        with aws.translated("cloudwatch GetMetricStatistics", self._namespace):
            reply = self._cloudwatch.get_metric_statistics(
                Namespace=self._namespace,
                MetricName=LeaderMetric.DESIRED_WORKERS,
                Dimensions=[{"Name": APPLICATION_DIMENSION, "Value": self._app}],
                StartTime=now - dt.timedelta(seconds=self._window_s),
                EndTime=now + dt.timedelta(seconds=1),
                Period=60,
                Statistics=["Maximum"],
            )
        points = sorted(reply.get("Datapoints", []), key=lambda p: p["Timestamp"])
        return int(points[-1]["Maximum"]) if points else None

    @property
    def pending(self) -> tuple[str, ...]:
        """Workers asked for that have not started yet."""
        return tuple(name for _, name in self._pending)

    def _start_due(self) -> list[str]:
        """Start the pending workers whose delay has passed (a start without a delay is due at once)."""
        now = self._clock.monotonic()
        due = [name for at, name in self._pending if at <= now]
        self._pending = [(at, name) for at, name in self._pending if at > now]
        for name in due:
            self._start(name)
        return due

    def step(self) -> ScalerStep:
        started = self._start_due()
        try:
            desired = self.desired()
        except DependencyError as exc:
            log.warning("scaler: could not read DesiredWorkers: %s", exc)
            return ScalerStep(None, tuple(started))
        running = list(self._running())  # read after the starts above: they are in it
        fleet = len(running) + len(self._pending)
        stopped: list[str] = []
        if desired is not None and desired > fleet:
            for _ in range(desired - fleet):
                self._started += 1
                self._pending.append((self._clock.monotonic() + self._start_delay_s, f"scaled-{self._started}"))
            now_started = self._start_due()
            started += now_started
            fleet = len(running) + len(now_started) + len(self._pending)
        elif desired is not None and desired < fleet:
            surplus = fleet - desired
            while surplus and self._pending:  # not started yet: cancelled, nobody to stop
                self._pending.pop()
                surplus -= 1
            item = (self._state.get(DESIRED_WORKERS_KEY) or {}) if surplus else {}
            named = [w for w in item.get("remove") or [] if w in running]
            newest_first = [w for w in reversed(running) if w not in named]
            for worker in (named + newest_first)[:surplus]:
                self._stop(worker)  # SIGTERM: the worker hands its leases over itself
                stopped.append(worker)
            fleet = len(running) - len(stopped) + len(self._pending)
        if started or stopped:
            log.info("scaler: DesiredWorkers %s, started %s, stopped %s", desired, started, stopped)
        self.history.append((self._clock.monotonic(), desired if desired is not None else fleet, fleet))
        return ScalerStep(desired, tuple(started), tuple(stopped))
