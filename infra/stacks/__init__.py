"""This repository's example stacks, built on the packaged construct ``worker_lib.cdk``."""

from __future__ import annotations

from infra.stacks.coordination_stack import ShardleaseStack

__all__ = ["ShardleaseStack"]
