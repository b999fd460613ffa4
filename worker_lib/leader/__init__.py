"""The leader: lock, state store, the loop with its typed cycle report, the one factory, the cycle metrics and
the Lambda handler (docs/leader-lock.md, docs/failover.md)."""
