"""Shard sync: KCL's hierarchy rules as pure functions (hierarchy, children), the shard detector and the syncer that
writes leases (docs/shard-sync.md)."""
