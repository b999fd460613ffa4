"""The ``shardlease`` command line: the only package that prints (docs/design.md)."""

from __future__ import annotations

from worker_lib.cli.main import main

__all__ = ["main"]
