"""Real `shardlease` processes for end-to-end tests: started in their own sessions, always killed by PID."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.stalls import eventually, hang_bound_s, stall_note
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


def ms_s(env: Mapping[str, str], name: str) -> float:
    """The ``*_MS`` setting ``name`` of ``env``, in seconds."""
    return int(env[name]) / 1000


# The settings above in seconds: what the liveness bounds of the tests that run with them are derived from
# (tests/support/stalls.py, ``hang_bound_s``; docs/testing.md, "Time bounds").
FAILOVER_S = ms_s(FAST_ENV, "SHARDLEASE_FAILOVER_TIME_MS")  # a lease not renewed for this long has expired
DISCOVERY_S = ms_s(FAST_ENV, "SHARDLEASE_DISCOVERY_INTERVAL_MS")  # a worker looks for leases assigned to it
READ_S = ms_s(FAST_ENV, "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS")  # a shard's reader between two empty reads
PARENT_POLL_S = ms_s(FAST_ENV, "SHARDLEASE_PARENT_POLL_INTERVAL_MS")  # a child shard waits for its parents
LEADER_LOCK_S = ms_s(LEADER_TIMINGS, "SHARDLEASE_LEADER_LOCK_DURATION_MS")
LEADER_SKEW_S = ms_s(LEADER_TIMINGS, "SHARDLEASE_MAX_CLOCK_SKEW_MS")
SHARD_SYNC_S = ms_s(LEADER_TIMINGS, "SHARDLEASE_SHARD_SYNC_INTERVAL_MS")
REPORT_S = ms_s(LEADER_TIMINGS, "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS")
EMBEDDED_CYCLE_S = ms_s(EMBEDDED_LEADER_ENV, "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS")

PROCESS_START_S = 3.0
"""Not a setting: a ``shardlease`` process importing worker_lib and boto3 and making its first calls (about 1.5 s on
an idle 2-core machine), the part of every process test's wait that no timing configures."""

EMULATORS_START_S = 5.0
"""Not a setting: local emulators (moto, and kinesalite on node) start and answer."""

DEMO_OVERHEAD_S = 20.0
"""Not a setting: ``shardlease demo``'s work around its timeline (its emulators starting, tables, the drain of the
last records, every worker's graceful stop, the dashboard picture), about 15 s on an idle 2-core machine."""

CORES = os.cpu_count() or 1


def fleet_start_s(processes: int) -> float:
    """``processes`` started at once: each start is mostly CPU (imports), so they share the machine's cores."""
    return PROCESS_START_S * max(1.0, processes / CORES)


LEADER_TAKEOVER_S = LEADER_LOCK_S + LEADER_SKEW_S
"""A leader that died is replaced: its lock expires and a contender waits out the clock-skew bound."""


def first_read_s(processes: int = 1) -> float:
    """``processes`` fresh workers with an embedded leader read every shard: they start, the leader syncs the shards
    into leases and assigns them, their owners find them and read."""
    return fleet_start_s(processes) + SHARD_SYNC_S + EMBEDDED_CYCLE_S + DISCOVERY_S + READ_S


KILL_FAILOVER_S = LEADER_TAKEOVER_S + FAILOVER_S + EMBEDDED_CYCLE_S + DISCOVERY_S + READ_S
"""A worker (possibly the leader) killed: the leader is replaced, its leases expire, the leader assigns them, their
new owner finds them and reads. The speed itself is bench/failover.py's (``kill``, ``leader``)."""

GRACEFUL_STOP_S = FAILOVER_S / 3 + READ_S
"""A worker on SIGTERM: its consumers finish the batch in hand and checkpoint, its leases are given up (within a
renewal interval, a third of the failover time) and it exits."""

HANDOVER_S = GRACEFUL_STOP_S + EMBEDDED_CYCLE_S + DISCOVERY_S + READ_S
"""Shards given up on SIGTERM are read by another worker: stop, assignment, discovery, read (bench/failover.py
``term``)."""


def eventually_showing(
    predicate: Callable[[], bool], *, bound_s: float, what: str, detail: Callable[[], object]
) -> float:
    """:func:`~tests.support.stalls.eventually`, with ``detail()`` (a process's log tail, what is still missing)
    added to the failure message."""
    try:
        return eventually(predicate, bound_s=bound_s, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{detail()}") from None


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
    """Run ``command`` to its end, capturing its output as text; never raises on a non-zero exit (the test asserts
    on ``returncode``). ``timeout_s`` is a liveness bound: a command still running then fails the test with what
    the timer probe saw meanwhile (a starved machine told from a hung command)."""
    started = time.monotonic()
    try:
        return subprocess.run(
            [str(part) for part in command],
            cwd=cwd,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        parts = (p.decode(errors="replace") if isinstance(p, bytes) else p or "" for p in (exc.stdout, exc.stderr))
        output = "".join(parts)[-3000:]
        raise AssertionError(
            f"{' '.join(str(p) for p in command)[:200]}: still running after its liveness bound of {timeout_s:.0f} s;"
            f" {stall_note(started)}\n{output}"
        ) from exc


STARTUP_TIMEOUT_S = 15.0
"""A worker's default ``SHARDLEASE_STARTUP_TIMEOUT_MS``: how long it retries an endpoint that does not answer."""

CLI_BOUND_S = hang_bound_s(PROCESS_START_S + STARTUP_TIMEOUT_S)
"""The liveness bound of one short ``shardlease`` command run to its end: a process start, and at most the startup
timeout spent retrying an endpoint."""


def shardlease_run(*args: str, timeout: float = CLI_BOUND_S) -> subprocess.CompletedProcess[str]:
    """``shardlease <args>`` with this interpreter, run to its end (``timeout``: its liveness bound)."""
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
    command = shardlease_command(*args, log_level="WARNING")
    done = run_command(command, timeout_s=CLI_BOUND_S, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode != 0:
        raise RuntimeError(f"shardlease {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary
