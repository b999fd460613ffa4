"""Record processing: the processor protocol, one shard consumer per lease, GetRecords retrieval and KPL
de-aggregation (docs/worker.md)."""
