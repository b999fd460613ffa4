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
