"""The leader Lambda, invoked by an EventBridge rule once a minute: ``worker_lib.leader.lambda_handler.handler``.

Thin by design: every decision lives in the leader package. One invocation

1. builds the leader from the environment (:func:`~worker_lib.leader.factory.build_leader_from_env`:
   ``SHARDLEASE_APP``, ``SHARDLEASE_STREAM`` and the ``from_env()`` of each config area; ``SHARDLEASE_LEADER_ID``
   names the lock owner, default ``<function name>:<request id>``), reusing the boto3 clients of earlier warm
   invocations (created on first use, never at import);
2. leads for ``LeaderConfig.term_ms`` (65 s: the 1-minute schedule plus 5 s of overlap) or until
   ``deadline_margin_ms`` before the invocation's deadline, whichever comes first, heartbeating the lock and
   announcing in it when it will release; the loop releases the lock when it returns;
3. if the lock is held elsewhere: waits for it when the holder will release it (or its lock will expire) within
   ``takeover_wait_ms`` — so consecutive invocations hand over with no leaderless gap (docs/failover.md) — and
   otherwise (a duplicate delivery, an embedded leader) returns ``{"leader": false, ...}`` after one lock read;
4. reports each cycle through Powertools when installed (:mod:`worker_lib.leader.observers`);
5. returns a JSON-able summary (:meth:`~worker_lib.leader.cycle_metrics.RunOutcome.to_dict`).

Its imports stay within what the leader needs, so that the Lambda asset can hold only that (docs/deploy.md).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from worker_lib.core.clock import SYSTEM_CLOCK
from worker_lib.core.config import AwsConfig
from worker_lib.core.env import env_str, environ
from worker_lib.leader.cycle_metrics import run_outcome
from worker_lib.leader.factory import ClientCache, app_and_stream, build_leader_from_env
from worker_lib.leader.leader import CycleReport
from worker_lib.leader.metrics_publisher import LeaderMetricsPublisher
from worker_lib.leader.observers import Observer, make_observer
from worker_lib.telemetry.publisher import MetricsConfig


class LambdaContext(Protocol):
    """The parts of the Lambda context the handler reads."""

    function_name: str
    aws_request_id: str

    def get_remaining_time_in_millis(self) -> int: ...


warm_clients = ClientCache()  # module state on purpose: it outlives the invocation in a warm container
observer = make_observer()


def invoke(
    context: LambdaContext,
    *,
    clients: ClientCache = warm_clients,
    stop: threading.Event | None = None,
    env: Mapping[str, str] | None = None,
    observing: Observer | None = None,
) -> dict[str, Any]:
    """One invocation. The handler passes only the context; ``clients``, ``stop``, ``env`` (default: the process
    environment) and ``observing`` (default: the container's observer) are seams for benchmarks and the demo."""
    env = environ(env)  # the invocation's one read of the environment: every setting below comes from this mapping
    app, stream = app_and_stream(env)
    owner = env_str(env, "SHARDLEASE_LEADER_ID") or f"{context.function_name}:{context.aws_request_id}"
    report = (observing or observer).begin(env, app=app, stream=stream.describe(), owner=owner)
    # The deadline is taken first, so that building the leader counts against the invocation's time.
    started = SYSTEM_CLOCK.monotonic()
    deadline = started + context.get_remaining_time_in_millis() / 1000
    warm = clients.get(AwsConfig.from_env(env))  # the settings are read once; the leader reuses them and the clients
    parts = build_leader_from_env(
        env,
        app=app,
        stream=stream,
        aws_config=warm.aws_config,
        owner=owner,
        dynamodb=warm.dynamodb,
        kinesis=warm.kinesis,
    )
    term_end = started + (parts.config.term_ms + parts.config.deadline_margin_ms) / 1000
    # In Lambda, Powertools publishes the metrics (EMF); SHARDLEASE_METRICS is for the handler run elsewhere (the
    # demo publishes to its local CloudWatch so that it can draw the dashboard).
    extra = MetricsConfig.from_env(env)
    published = LeaderMetricsPublisher(extra, app=app, aws_config=warm.aws_config) if extra.mode != "off" else None

    def on_cycle(cycle: CycleReport) -> None:
        report.cycle(cycle)
        if published is not None:
            published.cycle(cycle)

    reports = parts.leader.run(
        deadline_monotonic=min(deadline, term_end), on_cycle=on_cycle, exit_when_held=True, stop=stop
    )
    outcome = run_outcome(reports, owner=owner)
    report.end(outcome)
    return outcome.to_dict()


@observer.wrap
def handler(event: Mapping[str, Any] | None, context: LambdaContext) -> dict[str, Any]:
    return invoke(context)
