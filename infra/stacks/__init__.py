"""Stacks built from the reusable constructs."""

from __future__ import annotations

from infra.stacks.coordination_stack import ShardleaseStack

__all__ = ["ShardleaseStack"]
