"""``shardlease leader``: the leader in the foreground, one line per cycle on stdout.

The leader is built by :func:`worker_lib.leader.factory.build_leader_from_env` like in every other host; this module
only adds what a terminal needs — a preflight that fails with one clear line, the cycle lines, SIGTERM handling.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading

from worker_lib.core.config import AwsConfig
from worker_lib.core.env import environ
from worker_lib.core.streams import StreamSelection
from worker_lib.leader.factory import build_leader_from_env, preflight
from worker_lib.leader.leader import CycleReport
from worker_lib.leader.metrics_publisher import LeaderMetricsPublisher
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.telemetry.publisher import MetricsConfig


def summarize(report: CycleReport) -> str:
    """One human line per cycle."""
    if not report.leader:
        holder = report.current_leader or "nobody (lock contended)"
        return f"cycle {report.cycle}: not leader; lock held by {holder}"
    if report.error:
        return f"cycle {report.cycle}: failed: {report.error}"
    parts = [f"cycle {report.cycle}: leader {report.owner}"]
    sync = report.shard_sync
    if sync is not None:
        created, deleted = list(sync.created), list(sync.deleted)
        parts.append(
            f"shard sync: {sync.shards_seen} shards, "
            f"created {len(created)} lease(s){' ' + ','.join(created) if created else ''}, "
            f"deleted {len(deleted)}{' ' + ','.join(deleted) if deleted else ''}"
        )
    if report.assignment is not None:
        parts.append(report.assignment.summary())
    parts.append(f"{report.duration_ms} ms")
    return "; ".join(parts)


def run_leader_cli(
    *,
    app: str,
    stream: StreamSelection,
    aws_config: AwsConfig,
    shard_sync: ShardSyncConfig,
    once: bool,
    owner: str | None,
    as_json: bool,
) -> int:
    env = environ()  # the command's one read of the environment (the flags' settings are given)
    parts = build_leader_from_env(
        env, app=app, stream=stream, aws_config=aws_config, shard_sync=shard_sync, owner=owner
    )
    preflight(parts, app=app, stream=stream)

    # The leader's metrics as the Lambda publishes them, where SHARDLEASE_METRICS says (cloudwatch, emf, off).
    metrics = LeaderMetricsPublisher(MetricsConfig.from_env(env), app=app, aws_config=aws_config)

    def emit(report: CycleReport) -> None:
        metrics.cycle(report)
        line = json.dumps(report.to_dict(), default=str, sort_keys=True) if as_json else summarize(report)
        print(line, flush=True)

    if once:
        report = parts.leader.run_once()
        emit(report)
        return 1 if report.error else 0
    # SIGTERM (systemd, ECS, Kubernetes) stops the loop like Ctrl-C: the lock is released, so the next leader takes
    # over at once instead of after the lock's expiry.
    stop = threading.Event()
    with contextlib.suppress(ValueError):  # not the main thread: the host handles signals
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        parts.leader.run(on_cycle=emit, stop=stop)
    print("leader stopped; lock released", file=sys.stderr)
    return 0
