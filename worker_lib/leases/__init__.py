"""Leases: the store (KCL 3.x item format, conditional writes), the renewer with its fence, discovery and the
worker heartbeat (docs/design.md, docs/failover.md)."""
