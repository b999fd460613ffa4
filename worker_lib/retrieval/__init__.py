"""Record retrieval: where a shard consumer's records come from (docs/design.md, "The retrieval seam").

One :class:`RecordSource` base owns what every source shares (start position, end of shard, child shards,
de-aggregation, the floor of records delivered already); polling (:class:`ShardRecordFetcher`) and enhanced fan-out
(:class:`ShardSubscriber`) are its two implementations, and :class:`RecordSources` opens the right one for a lease.
"""

from __future__ import annotations

from worker_lib.retrieval.config import RetrievalConfig, RetrievalMode
from worker_lib.retrieval.factory import ConsumerArns, KnownConsumerArns, RecordSources, application_consumers
from worker_lib.retrieval.fanout import ShardSubscriber, StreamConsumers, subscription_config
from worker_lib.retrieval.polling import ShardRecordFetcher
from worker_lib.retrieval.source import (
    RecordBatch,
    RecordSource,
    SourceArguments,
    child_shards_from_list_shards,
    iterator_start,
    record_from_response,
    user_records,
)

__all__ = [
    "ConsumerArns",
    "KnownConsumerArns",
    "RecordBatch",
    "RecordSource",
    "RecordSources",
    "RetrievalConfig",
    "RetrievalMode",
    "ShardRecordFetcher",
    "ShardSubscriber",
    "SourceArguments",
    "StreamConsumers",
    "application_consumers",
    "child_shards_from_list_shards",
    "iterator_start",
    "record_from_response",
    "subscription_config",
    "user_records",
]
