"""Real `shardlease` processes for end-to-end tests: started in their own sessions, always killed by PID."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from worker_lib.testing.commands import shardlease_command
from worker_lib.testing.processes import ProcessFleet

REPO = Path(__file__).resolve().parents[2]

# Short timings so that end-to-end tests finish in seconds (lease 3 s, renew ~1 s, discover 0.2 s).
FAST_ENV = {
    "SHARDLEASE_FAILOVER_TIME_MS": "3000",
    "SHARDLEASE_DISCOVERY_INTERVAL_MS": "200",
    "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS": "100",
    "SHARDLEASE_PARENT_POLL_INTERVAL_MS": "500",
}

# A leader's short timings for a test (lock 3 s, beat 1 s, skew bound 0.5 s, shard sync 1 s) and the workers'
# reports it reads (every second, the first after 0.2 s; each process's own CPU, as several share the machine).
LEADER_TIMINGS = {
    "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
    "SHARDLEASE_LEADER_LOCK_DURATION_MS": "3000",
    "SHARDLEASE_LEADER_HEARTBEAT_MS": "1000",
    "SHARDLEASE_MAX_CLOCK_SKEW_MS": "500",
    "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "1000",
    "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS": "1000",
    "SHARDLEASE_WORKER_METRICS_FIRST_REPORT_DELAY_MS": "200",
    "SHARDLEASE_CPU_METRIC": "process",
}

# Every worker process also runs the real leader loop (the lock picks one), with short timings for a test.
EMBEDDED_LEADER_ENV = {
    **LEADER_TIMINGS,
    "SHARDLEASE_LEADER_MODE": "embedded",
    "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "500",
}


def repo_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a test's processes: this one's, the short timings, ``extra``, and this checkout on the
    path (``--processor tests.support...`` must import)."""
    return {**os.environ, **FAST_ENV, **(extra or {}), "PYTHONPATH": str(REPO)}


@contextlib.contextmanager
def process_group(log_dir: Path) -> Iterator[ProcessFleet]:
    """Processes started by one test (:class:`~worker_lib.testing.ProcessFleet`, run from this checkout with
    :data:`FAST_ENV`); whatever is left is killed (SIGKILL to each process group) at the end."""
    with ProcessFleet(log_dir, env=repo_env(), cwd=REPO) as group:
        yield group


def run_command(
    command: Sequence[str | Path], *, timeout_s: float, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end (bounded by ``timeout_s``), capturing its output as text; never raises on a
    non-zero exit (the test asserts on ``returncode``)."""
    return subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def shardlease_run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``shardlease <args>`` with this interpreter, run to its end."""
    return run_command([sys.executable, "-m", "worker_lib.cli", *args], timeout_s=timeout)


# --- liveness modes (docs/liveness-modes.md) ----------------------------------------------------------------------

LIVENESS_MODES = ("lease", "worker")


def liveness_env(mode: str) -> dict[str, str]:
    """The setting every process of a fleet in ``mode`` runs with."""
    return {"SHARDLEASE_LIVENESS_MODE": mode}


def shardlease_liveness(app: str, endpoint: str, *, target: str | None = None) -> dict[str, Any]:
    """``shardlease liveness --app APP [--set TARGET] --json``, as an operator runs it: the stored mode, the target
    of a switch under way and what each heartbeating worker says it runs in. On a fresh application ``--set``
    records the mode (what a test does before its first process starts); on a running one it asks the leader for a
    switch. A non-zero exit raises with the command's stderr."""
    args = ["liveness", "--app", app, "--endpoint-url", endpoint, "--json"]
    if target is not None:
        args += ["--set", target]
    done = subprocess.run(
        shardlease_command(*args, log_level="WARNING"),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"shardlease {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary
