"""PySpark integration: a Structured Streaming source through which a Spark application joins the fleet as a
worker (docs/spark.md).

    from worker_lib.spark import register
    register(spark)
    df = spark.readStream.format("shardlease").option("app", "orders").option("stream", "orders").load()

pyspark is imported only by :func:`register` and :mod:`worker_lib.spark.source` (the ``spark`` extra).
"""

from __future__ import annotations

from typing import Any

SOURCE_NAME = "shardlease"


def register(spark: Any) -> None:
    """Register the ``shardlease`` source with a SparkSession (one line naming the ``spark`` extra without pyspark)."""
    from worker_lib.core.extras import require

    require("pyspark.sql.datasource", extra="spark", what="the Spark source")
    from worker_lib.spark.source import ShardleaseDataSource

    spark.dataSource.register(ShardleaseDataSource)


__all__ = ["SOURCE_NAME", "register"]
