"""How a leader invocation reports what it did: Powertools when installed, the standard library otherwise.

With ``aws-lambda-powertools`` (the ``powertools`` extra, or the Lambda layer the CDK construct attaches): a
structured Logger line per cycle and per invocation, the cycle's metrics (:mod:`worker_lib.leader.cycle_metrics`)
as one CloudWatch EMF document per cycle, per-worker gauges as one EMF line per worker, and the Tracer around the
handler. Without it the same two log lines go through :mod:`logging` and no metrics are published (a warning says
so once): the leader itself works the same.

Environment: ``POWERTOOLS_METRICS_NAMESPACE`` (default :data:`~worker_lib.telemetry.names.DEFAULT_NAMESPACE`),
``SHARDLEASE_PER_WORKER_METRICS`` (``true``: per-worker lease and throughput gauges).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

from worker_lib.core.env import env_bool
from worker_lib.leader.cycle_metrics import RunOutcome, cycle_metrics, report_fields, worker_metrics
from worker_lib.leader.leader import CycleReport
from worker_lib.telemetry.names import APPLICATION_DIMENSION, DEFAULT_NAMESPACE, LEADER_SERVICE, WORKER_DIMENSION

log = logging.getLogger(__name__)

Handler = TypeVar("Handler", bound=Callable[..., Any])


class InvocationLog(Protocol):
    """What one invocation reports, cycle by cycle and at its end."""

    def cycle(self, report: CycleReport) -> None: ...

    def end(self, outcome: RunOutcome) -> None: ...


class Observer(Protocol):
    """Made once per container; :meth:`begin` once per invocation (invocations may overlap in tests)."""

    def wrap(self, handler: Handler) -> Handler: ...

    def begin(self, env: Mapping[str, str], *, app: str, stream: str, owner: str) -> InvocationLog: ...


class _LoggingInvocation:
    def __init__(self, extra: Mapping[str, str]) -> None:
        self._extra = dict(extra)

    def cycle(self, report: CycleReport) -> None:
        log.info("leader cycle", extra={**self._extra, "cycle": report_fields(report)})

    def end(self, outcome: RunOutcome) -> None:
        log.info("leader invocation done", extra={**self._extra, **outcome.headline()})


def per_worker_metrics(env: Mapping[str, str]) -> bool:
    """``SHARDLEASE_PER_WORKER_METRICS`` (true): the Lambda leader also publishes one metric per worker."""
    return env_bool(env, "SHARDLEASE_PER_WORKER_METRICS", True)


class LoggingObserver:
    """No Powertools: log lines through :mod:`logging`, no metrics."""

    _warned = False

    def __init__(self, *, powertools_expected: bool = True) -> None:
        self._powertools_expected = powertools_expected  # False: a host that runs the handler without Lambda's tools

    def wrap(self, handler: Handler) -> Handler:
        return handler

    def begin(self, env: Mapping[str, str], *, app: str, stream: str, owner: str) -> InvocationLog:
        per_worker_metrics(env)  # a bad value fails the same with or without Powertools
        if self._powertools_expected and not LoggingObserver._warned:
            LoggingObserver._warned = True
            log.warning("aws-lambda-powertools is not installed (extra 'powertools'): leader metrics not published")
        return _LoggingInvocation({"application": app, "stream": stream, "owner": owner})


class _PowertoolsInvocation:
    def __init__(self, observer: PowertoolsObserver, *, namespace: str, app: str, per_worker: bool) -> None:
        from aws_lambda_powertools import Metrics

        self._observer, self._namespace, self._app, self._per_worker = observer, namespace, app, per_worker
        self._metrics = Metrics(namespace=namespace)

    def cycle(self, report: CycleReport) -> None:
        from aws_lambda_powertools.metrics import MetricUnit, single_metric

        self._observer.logger.info("leader cycle", extra={"cycle": report_fields(report)})
        metrics = self._metrics
        if metrics.dimension_set.get(APPLICATION_DIMENSION) != self._app:  # a flush clears it; re-adding warns
            metrics.add_dimension(name=APPLICATION_DIMENSION, value=self._app)
        for value in cycle_metrics(report):
            metrics.add_metric(name=value.name, unit=MetricUnit(value.unit), value=value.value)
        metrics.flush_metrics()  # one EMF document per cycle, time-stamped when the cycle ended
        if not self._per_worker:
            return
        for value in worker_metrics(report):
            with single_metric(
                name=value.name,
                unit=MetricUnit(value.unit),
                value=value.value,
                namespace=self._namespace,
                default_dimensions={APPLICATION_DIMENSION: self._app},
            ) as metric:
                metric.add_dimension(name=WORKER_DIMENSION, value=str(value.worker))

    def end(self, outcome: RunOutcome) -> None:
        self._observer.logger.info("leader invocation done", extra=outcome.headline())


class PowertoolsObserver:
    """Powertools Logger, Metrics (EMF) and Tracer; raises ImportError when Powertools is not installed."""

    def __init__(self) -> None:
        from aws_lambda_powertools import Logger, Tracer

        self.logger = Logger(service=LEADER_SERVICE)
        self.tracer = Tracer(service=LEADER_SERVICE)

    def wrap(self, handler: Handler) -> Handler:
        return cast("Handler", self.tracer.capture_lambda_handler(handler))

    def begin(self, env: Mapping[str, str], *, app: str, stream: str, owner: str) -> InvocationLog:
        namespace = env.get("POWERTOOLS_METRICS_NAMESPACE") or DEFAULT_NAMESPACE
        per_worker = per_worker_metrics(env)
        self.logger.append_keys(application=app, stream=stream, owner=owner)
        return _PowertoolsInvocation(self, namespace=namespace, app=app, per_worker=per_worker)


def make_observer() -> Observer:
    """Powertools when importable, else :class:`LoggingObserver`."""
    try:
        return PowertoolsObserver()
    except ImportError:
        return LoggingObserver()
