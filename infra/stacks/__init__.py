"""Stacks built from the reusable constructs."""

from __future__ import annotations

from .coordination_stack import ShardleaseStack

__all__ = ["ShardleaseStack"]
