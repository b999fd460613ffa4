"""Command lines of ``shardlease`` processes, for tests, the demo and benchmarks that start real workers and leaders.

They run the CLI with the current interpreter (``python -m worker_lib.cli``), so a test's virtualenv is the
process's virtualenv; the caller starts them (own session, killed by PID: :class:`~worker_lib.testing.ProcessFleet`)
and gives their environment.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def shardlease_command(*args: str, log_level: str = "INFO") -> list[str]:
    """``python -m worker_lib.cli --log-level LEVEL <args>``."""
    return [sys.executable, "-m", "worker_lib.cli", "--log-level", log_level, *args]


def app_args(
    app: str, stream: str | Sequence[str], *, initial_position: str | None = None, endpoint_url: str | None = None
) -> list[str]:
    """``--app APP --stream S [--stream S2 …] [--initial-position P] [--endpoint-url URL]``."""
    args = ["--app", app]
    for name in [stream] if isinstance(stream, str) else stream:
        args += ["--stream", name]
    if initial_position is not None:
        args += ["--initial-position", initial_position]
    if endpoint_url is not None:
        args += ["--endpoint-url", endpoint_url]
    return args


def worker_command(
    *,
    app: str,
    stream: str | Sequence[str],
    processor: str,
    worker_id: str,
    initial_position: str | None = None,
    endpoint_url: str | None = None,
    log_level: str = "INFO",
) -> list[str]:
    """``shardlease worker`` for one worker process (``stream`` repeated for a multi-stream application)."""
    args = ["worker", *app_args(app, stream, initial_position=initial_position, endpoint_url=endpoint_url)]
    args += ["--processor", processor, "--worker-id", worker_id]
    return shardlease_command(*args, log_level=log_level)


def leader_command(
    *,
    app: str,
    stream: str | Sequence[str],
    leader_id: str,
    initial_position: str | None = None,
    endpoint_url: str | None = None,
    log_level: str = "INFO",
) -> list[str]:
    """``shardlease leader`` for one leader process."""
    args = app_args(app, stream, initial_position=initial_position, endpoint_url=endpoint_url)
    args = ["leader", *args, "--worker-id", leader_id]
    return shardlease_command(*args, log_level=log_level)
