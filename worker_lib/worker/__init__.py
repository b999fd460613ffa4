"""The worker: the composition root users embed (``from worker_lib import Worker, WorkerConfig``; docs/worker.md)."""

from __future__ import annotations

from worker_lib.worker.worker import Worker, WorkerConfig

__all__ = ["Worker", "WorkerConfig"]
