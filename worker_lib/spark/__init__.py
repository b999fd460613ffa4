"""PySpark integration: a Structured Streaming source through which a Spark application joins the fleet as a
worker (docs/spark.md).

    from worker_lib.spark import register
    register(spark)
    df = spark.readStream.format("shardlease").option("app", "orders").option("stream", "orders").load()
    ...
    stop_between_batches(query)  # rather than query.stop() in the middle of a micro-batch

pyspark is imported only by :func:`register` and :mod:`worker_lib.spark.source` (the ``spark`` extra).
"""

from __future__ import annotations

import re
from typing import Any

from worker_lib.core.errors import ConfigError
from worker_lib.spark.stopping import stop_between_batches

SOURCE_NAME = "shardlease"

# Streaming Python Data Sources with admission control (latestOffset(start, limit)) and Trigger.AvailableNow
# (SupportsTriggerAvailableNow) are Spark 4.2's; the `spark` extra asks for the same.
MIN_SPARK_VERSION = (4, 2)


def spark_version_problem(version: str) -> str | None:
    """One line saying why Spark ``version`` ("4.3.0", "4.2.0.dev1", "3.5.1-amzn-0") cannot run the source, or
    None when it can."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    if match is None:
        return f"cannot tell the Spark version from {version!r}; the shardlease source needs Spark >= 4.2"
    if (int(match.group(1)), int(match.group(2))) < MIN_SPARK_VERSION:
        return (
            f"the shardlease source needs Spark >= 4.2 (this is {version.strip()}): upgrade pyspark, or pick an "
            "EMR release with Spark 4.2 or later"
        )
    return None


def register(spark: Any) -> None:
    """Register the ``shardlease`` source with a SparkSession. Raises :class:`ConfigError` with one line on a Spark
    older than 4.2, and :class:`~worker_lib.core.errors.MissingExtraError` without pyspark."""
    from worker_lib.core.extras import require

    pyspark = require("pyspark", extra="spark", what="the Spark source")
    # The session's Spark (the JVM's, or the server's under Spark Connect) and the Python package must both do.
    for version in (str(getattr(pyspark, "__version__", "")), str(getattr(spark, "version", "") or "")):
        problem = spark_version_problem(version) if version else None
        if problem is not None:
            raise ConfigError(problem)
    require("pyspark.sql.datasource", extra="spark", what="the Spark source")
    from worker_lib.spark.source import ShardleaseDataSource

    spark.dataSource.register(ShardleaseDataSource)


__all__ = ["MIN_SPARK_VERSION", "SOURCE_NAME", "register", "spark_version_problem", "stop_between_batches"]
