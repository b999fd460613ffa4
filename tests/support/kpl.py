"""The independent KPL encoder (aws-kinesis-agg) the aggregation tests check our decoder against."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any


@functools.cache
def reference_encoder() -> Any:
    """``aws_kinesis_agg.aggregator`` (the independent KPL encoder), imported without keeping the entries the
    package inserts at the front of ``sys.path`` on import."""
    saved = list(sys.path)
    try:
        return importlib.import_module("aws_kinesis_agg.aggregator")
    finally:
        sys.path[:] = saved


def put_aggregate(kinesis: Any, stream: str, parts: list[bytes]) -> str:
    """One KPL aggregate built by aws-kinesis-agg (an independent encoder), put with PutRecord; its sequence."""
    aggregator = reference_encoder().RecordAggregator()
    for i, part in enumerate(parts):
        assert aggregator.add_user_record(f"user-{i}", part) is None
    partition_key, explicit_hash_key, payload = aggregator.clear_and_get().get_contents()
    kwargs = {"ExplicitHashKey": explicit_hash_key} if explicit_hash_key else {}
    return str(
        kinesis.put_record(StreamName=stream, Data=payload, PartitionKey=partition_key, **kwargs)["SequenceNumber"]
    )
