"""Command lines of ``shardlease`` processes, for tests, the demo and benchmarks that start real workers and leaders.

They run the CLI with the current interpreter (``python -m worker_lib.cli``), so a test's virtualenv is the
process's virtualenv; the caller starts them (own session, killed by PID) and gives their environment.
"""

from __future__ import annotations

import sys


def shardlease_command(*args: str, log_level: str = "INFO") -> list[str]:
    """``python -m worker_lib.cli --log-level LEVEL <args>``."""
    return [sys.executable, "-m", "worker_lib.cli", "--log-level", log_level, *args]


def worker_command(
    *,
    app: str,
    stream: str,
    processor: str,
    worker_id: str,
    initial_position: str | None = None,
    log_level: str = "INFO",
) -> list[str]:
    """``shardlease worker`` for one worker process."""
    args = ["worker", "--app", app, "--stream", stream, "--processor", processor, "--worker-id", worker_id]
    if initial_position is not None:
        args += ["--initial-position", initial_position]
    return shardlease_command(*args, log_level=log_level)


def leader_command(
    *, app: str, stream: str, leader_id: str, initial_position: str | None = None, log_level: str = "INFO"
) -> list[str]:
    """``shardlease leader`` for one leader process."""
    args = ["leader", "--app", app, "--stream", stream, "--worker-id", leader_id]
    if initial_position is not None:
        args += ["--initial-position", initial_position]
    return shardlease_command(*args, log_level=log_level)
