"""The one place a lease's record source is made: polling or enhanced fan-out, as the :class:`RetrievalConfig` says.

The worker, the Spark driver and the Spark executors' reads all call :meth:`RecordSources.open`; none of them names
an implementation.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

import boto3

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig, InitialPosition
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import Checkpoint
from worker_lib.retrieval.config import RetrievalConfig
from worker_lib.retrieval.fanout import ShardSubscriber, StreamConsumers, subscription_config
from worker_lib.retrieval.polling import ShardRecordFetcher
from worker_lib.retrieval.source import RecordSource, SourceArguments


class ConsumerArns(Protocol):
    """Where a fan-out source finds its stream consumer: :class:`StreamConsumers`, or ARNs resolved beforehand."""

    def arn_for(self, stream: str) -> str: ...


class KnownConsumerArns:
    """Consumer ARNs resolved elsewhere (the Spark driver resolves them; its executors only read)."""

    def __init__(self, arns: Mapping[str, str]) -> None:
        self._arns = dict(arns)

    def arn_for(self, stream: str) -> str:
        try:
            return self._arns[stream]
        except KeyError:
            raise ConfigError(f"no fan-out consumer is known for stream {stream}") from None


def application_consumers(
    config: RetrievalConfig, *, app: str, kinesis_client: Any, clock: Clock = SYSTEM_CLOCK
) -> StreamConsumers:
    """The application's stream consumers: the configured ARN, else the consumer named after the application
    (registered if missing). The Spark driver resolves them so; its executors get the ARNs (:class:`KnownConsumerArns`).
    """
    return StreamConsumers(
        kinesis_client, consumer_name=config.consumer_name_for(app), consumer_arn=config.consumer_arn, clock=clock
    )


class RecordSources:
    """Opens the record source of a lease.

    config: polling or fan-out, and each one's settings. kinesis_client: GetRecords, ListShards, consumer
    registration. subscription_client: the client that holds subscriptions (a long read timeout; default
    ``kinesis_client``). consumers: with fan-out, who gives each stream's consumer ARN.
    """

    def __init__(
        self,
        config: RetrievalConfig,
        *,
        kinesis_client: Any,
        subscription_client: Any = None,
        consumers: ConsumerArns | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if config.fanout and consumers is None:
            raise ConfigError("retrieval fanout needs the stream consumers (StreamConsumers or their ARNs)")
        self.config = config
        self._kinesis = kinesis_client
        self._subscription_kinesis = subscription_client or kinesis_client
        self.consumers = consumers
        self._clock = clock

    @classmethod
    def for_application(
        cls,
        config: RetrievalConfig,
        *,
        app: str,
        aws_config: AwsConfig,
        kinesis_client: Any,
        boto3_session: boto3.Session | None = None,
        subscription_client: Any = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> RecordSources:
        """An application's sources: with fan-out, its stream consumer (the configured ARN, else the consumer named
        after the application, registered if missing) and a client with a subscription's read timeout."""
        if not config.fanout:
            return cls(config, kinesis_client=kinesis_client, clock=clock)
        consumers = application_consumers(config, app=app, kinesis_client=kinesis_client, clock=clock)
        subscriber = subscription_client or aws.client("kinesis", subscription_config(aws_config), boto3_session)
        return cls(
            config, kinesis_client=kinesis_client, subscription_client=subscriber, consumers=consumers, clock=clock
        )

    def open(
        self,
        stream: str,
        shard_id: str,
        *,
        start: Checkpoint | InitialPosition,
        timestamp: datetime | None = None,
        hash_range: tuple[int, int] | None = None,
    ) -> RecordSource:
        """A source reading ``shard_id`` of ``stream`` from ``start`` (see :class:`RecordSource`): a
        :class:`ShardSubscriber` with fan-out (its consumer ARN resolved now), else a :class:`ShardRecordFetcher`."""
        arguments = SourceArguments(
            kinesis_client=self._kinesis,
            start=start,
            timestamp=timestamp,
            clock=self._clock,
            config=self.config,
            hash_range=hash_range,
        )
        if self.consumers is None or not self.config.fanout:
            return ShardRecordFetcher(stream, shard_id, **arguments)
        arguments["kinesis_client"] = self._subscription_kinesis
        return ShardSubscriber(stream, shard_id, consumer_arn=self.consumers.arn_for(stream), **arguments)
