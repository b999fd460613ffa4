"""The driver's own use of the retrieval seam: the fan-out consumers its executors read through, and the probe
that tells whether an idle shard has something new.

The driver resolves (and, if missing, registers) the application's stream consumer once and hands the ARNs to
its executors in :class:`~worker_lib.spark.planning.ReadSettings`; probing always polls (one small GetRecords per
idle shard, at most once per ``idle_probe_interval_ms``), whatever the retrieval mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from worker_lib.core.clock import Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.streams import stream_name_of
from worker_lib.retrieval import RecordSources, RetrievalConfig, StreamConsumers, application_consumers
from worker_lib.spark.options import SourceOptions
from worker_lib.spark.planning import ReadSettings, ShardReadTask, SourceOffset
from worker_lib.spark.reading import start_timestamp

log = logging.getLogger(__name__)

PROBE_RECORDS = 10  # a probe only asks whether anything is there


class DriverReads:
    """The driver's consumers and probes. kinesis: gives the driver's client (made on first use)."""

    def __init__(self, options: SourceOptions, kinesis: Callable[[], Any], *, clock: Clock) -> None:
        self._options = options
        self._kinesis = kinesis
        self._clock = clock
        self._consumers: StreamConsumers | None = None
        self._last_probe: dict[str, float] = {}

    def fanout_consumers(self) -> tuple[tuple[str, str], ...]:
        """(stream, consumer ARN) of each stream with retrieval ``fanout`` (registered once if missing)."""
        retrieval = self._options.retrieval
        if not retrieval.fanout:
            return ()
        if self._consumers is None:
            self._consumers = application_consumers(
                retrieval, app=self._options.app, kinesis_client=self._kinesis(), clock=self._clock
            )
        streams = self._options.streams or (self._options.stream,)
        return tuple((stream, self._consumers.arn_for(stream)) for stream in streams)

    def any_new(self, candidate: SourceOffset, settings: ReadSettings) -> bool:
        """Whether any idle shard has something new (one small GetRecords each, at most once per probe interval)."""
        now = self._clock.monotonic()
        interval = self._options.idle_probe_interval_ms / 1000
        sources = RecordSources(
            RetrievalConfig(max_records=PROBE_RECORDS), kinesis_client=self._kinesis(), clock=self._clock
        )
        for key, shard in sorted(candidate.shards.items()):
            if now - self._last_probe.get(key, -1e18) < interval:
                continue
            self._last_probe[key] = now
            task = ShardReadTask(
                lease_key=key, position=shard.position, batch=0, run="", settings=settings, timestamp=shard.timestamp
            )
            try:
                source = sources.open(
                    stream_name_of(key, self._options.stream),
                    task.shard_id,
                    start=shard.position,
                    timestamp=start_timestamp(task),
                )
                try:
                    batch = source.fetch()
                finally:
                    source.close()
            except DependencyError as exc:
                log.warning("probing %s failed: %s", key, exc)
                return True  # let a real read find out
            if batch.records or batch.end_of_shard or (batch.millis_behind_latest or 0) > 0:
                return True
        return False
