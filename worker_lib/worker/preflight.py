"""The worker's start check: its tables and streams can be reached, before anything starts.

A missing table or stream or rejected credentials fail at once with one typed error; an unreachable or throttling
endpoint is retried (:mod:`worker_lib.core.backoff`) until the startup timeout, each probe with one attempt and short
timeouts, so that a worker that cannot start says so within about 25 s (docs/worker.md).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from worker_lib.core import aws
from worker_lib.core.backoff import Backoff, Retry
from worker_lib.core.clock import Clock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import EndpointUnreachableError, StreamMissingError, TableMissingError, ThrottledError
from worker_lib.core.streams import parse_stream_entry
from worker_lib.leases.mode import LivenessMode, check_start
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.retrieval.factory import ConsumerArns
from worker_lib.tables.admin import check_layout, check_schema
from worker_lib.tables.schema import coordinator_state_table_name, lease_table_name, worker_metrics_table_name
from worker_lib.worker.config import WorkerConfig

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# A probe that cannot reach its endpoint is tried again after 0.5 s, 1 s, 2 s, then every 4 s: one worker, a few
# calls, so no jitter.
PROBE_BACKOFF = Backoff(base_s=0.5, max_s=4.0)


def probe_config(aws_config: AwsConfig) -> AwsConfig:
    """The start check's AWS settings: one attempt and short timeouts, so that a wrong endpoint fails within
    seconds."""
    return replace(
        aws_config,
        max_attempts=1,
        connect_timeout_s=min(aws_config.connect_timeout_s, 5.0),
        read_timeout_s=min(aws_config.read_timeout_s, 5.0),
    )


class StoppedBeforeStart(Exception):
    """A shutdown signal came while :class:`Preflight` waited for an endpoint."""


@dataclass(kw_only=True)
class Preflight:
    """Checks once that a worker's tables, streams, liveness mode and fan-out consumers are in place.

    dynamodb / kinesis: clients made for probing (:func:`probe_config`). consumers: with fan-out, where the stream
    consumers are registered (or found). stop: the worker's stop event; set while waiting, the check raises
    :class:`StoppedBeforeStart`.
    """

    config: WorkerConfig
    dynamodb: Any
    kinesis: Any
    modes: LivenessModeStore
    consumers: ConsumerArns | None
    stop: threading.Event
    clock: Clock
    done: bool = field(default=False, init=False)

    def run(self) -> None:
        """The check (see :meth:`Worker.preflight <worker_lib.worker.worker.Worker.preflight>`); nothing once done."""
        if self.done:
            return
        config = self.config
        layout = config.table_layout
        tables = [lease_table_name(config.app)]
        if not layout.single:
            tables.append(worker_metrics_table_name(config.app))
            if config.leader_mode == "embedded":
                tables.append(coordinator_state_table_name(config.app))
        deadline = self.clock.monotonic() + config.startup_timeout_ms / 1000
        describe = self.dynamodb.describe_table
        specs = {spec.table_name(config.app): spec for spec in layout.specs()}
        for table in tables:
            reply = self._probe("dynamodb DescribeTable", table, functools.partial(describe, TableName=table), deadline)
            # A table created by hand or by another tool with other keys fails here, not at the first write.
            check_schema(specs[table], config.app, reply.get("Table", {}))
        streams = [parse_stream_entry(entry)[0] for entry in config.streams]
        for stream in streams:
            try:
                self._probe(
                    "kinesis DescribeStreamSummary",
                    stream,
                    functools.partial(self.kinesis.describe_stream_summary, StreamName=stream),
                    deadline,
                )
            except StreamMissingError as exc:
                if not config.multi_stream:
                    raise
                # One deleted stream must not keep a multi-stream worker from the others (its leases are cleaned up).
                log.warning("%s; the other streams are consumed", exc)
        check_layout(config.app, self.dynamodb, layout)
        self._check_liveness_mode()
        if self.consumers is not None:
            # Registering (or finding) the consumer now turns a missing permission into one line at start.
            for stream in streams:
                self.consumers.arn_for(stream)
        self.done = True

    def _check_liveness_mode(self) -> None:
        """Refuse to start in the other liveness mode (docs/liveness-modes.md). Without a CoordinatorState table
        only ``lease`` mode can run (nothing else can be judged)."""
        setting = self.config.lease.liveness_mode
        try:
            stored = self.modes.read()
        except TableMissingError:
            if setting != LivenessMode.LEASE.value:
                raise
            log.warning("no %s table: running in liveness mode lease", self.modes.table_name)
            return
        check_start(setting, stored, who=f"worker {self.config.worker_id}")

    def _probe(self, operation: str, resource: str, call: Callable[[], _T], deadline: float) -> _T:
        retry = Retry(backoff=PROBE_BACKOFF, clock=self.clock, stop=self.stop)
        while True:
            try:
                with aws.translated(operation, resource):
                    return call()
            except (EndpointUnreachableError, ThrottledError) as exc:
                delay = retry.failed()
                if self.clock.monotonic() + delay >= deadline:
                    waited = self.config.startup_timeout_ms / 1000
                    raise type(exc)(f"{exc} (still failing after {waited:g} s; is the endpoint right?)") from exc
                log.info("worker %s waiting for %s: %s", self.config.worker_id, resource, exc)
                if not retry.wait(delay):  # stopped while it waited: do not wait out the startup timeout
                    raise StoppedBeforeStart from exc
