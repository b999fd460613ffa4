"""The README's first command, shortened: `shardlease demo` runs the whole fleet and reports nothing lost; Ctrl-C
stops everything it started and leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import DEMO_OVERHEAD_S, EMULATORS_START_S, PROCESS_START_S, ms_s, run_command
from tests.support.stalls import eventually, hang_bound_s, stall_note
from worker_lib.testing.timings import FAST_TIMINGS

REPO = Path(__file__).resolve().parents[2]

# The demo runs its fleet with FAST_TIMINGS. What the liveness bounds below are derived from (tests/support/stalls.py):
DURATION_S = 40.0  # --duration of the full run
SCHEDULE_STOP_S = 3.0  # on a signal the demo waits this long for a running leader invocation (demo/scenario.py)
HANDOVER_S = (
    ms_s(FAST_TIMINGS, "SHARDLEASE_FAILOVER_TIME_MS") / 3  # the SIGTERM'd worker gives its leases up in a renewal
    + ms_s(FAST_TIMINGS, "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS")  # the leader assigns them
    + ms_s(FAST_TIMINGS, "SHARDLEASE_DISCOVERY_INTERVAL_MS")  # their new owner finds them
    + ms_s(FAST_TIMINGS, "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS")  # and reads
)
DEMO_FLEET = ("--workers", "2", "--shards", "4")
RUN_BOUND_S = hang_bound_s(DURATION_S + DEMO_OVERHEAD_S)
HANDOVER_BOUND_S = hang_bound_s(HANDOVER_S)
START_BOUND_S = hang_bound_s(PROCESS_START_S + EMULATORS_START_S + PROCESS_START_S)  # the demo, its emulators, workers
STOP_BOUND_S = hang_bound_s(SCHEDULE_STOP_S + EMULATORS_START_S)  # a stop on a signal: the invocation, emulators


def descendants(pid: int) -> set[int]:
    """Every live process whose ancestry includes ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        children = {child for child, parent in parents.items() if parent in frontier} - found
        found |= children
        frontier = children
    return found


def is_running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def temp_dirs() -> set[str]:
    return {p.name for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("shardlease-demo-*")}


def communicate(process: subprocess.Popen[str], *, bound_s: float) -> tuple[str, str]:
    """The process's output once it exited; still running after ``bound_s`` (a liveness bound) fails the test."""
    asked = time.monotonic()
    try:
        return process.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the demo still runs {bound_s:.0f} s after the signal; {stall_note(asked)}") from None


@contextlib.contextmanager
def running_demo() -> Iterator[subprocess.Popen[str]]:
    """``shardlease demo`` of 2 workers and 4 shards, long enough to outlive the test, in a session of its own;
    whatever of it still runs at the end is killed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "worker_lib.cli", "demo", "--duration", "120", "--workers", "2", "--shards", "4"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        for pid in descendants(process.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.heavy
def test_the_demo_runs_the_fleet_and_loses_nothing() -> None:
    # WHEN the demo runs a shortened scenario (kill, add, split, merge) in a non-terminal
    started = time.monotonic()
    result = run_command(
        [sys.executable, "-m", "worker_lib.cli", "demo", "--duration", f"{DURATION_S:g}", *DEMO_FLEET],
        cwd=REPO,
        timeout_s=RUN_BOUND_S,
    )
    out = result.stdout
    # THEN it exits 0 with a report proving nothing was lost
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    produced = int(re.search(r"records produced\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    processed = int(re.search(r"records processed\s+(\d+) distinct", out).group(1))  # type: ignore[union-attr]
    assert produced > 1000 and processed == produced and "none lost" in out
    # AND the scripted events happened, the leader ran through the Lambda handler, and failover was measured
    for event in ("kill -9 demo-w1", "started worker demo-w3", "SIGTERM demo-w2", "split hot shard", "merged cold"):
        assert event in out, event
    assert "leader ran as: Lambda handler" in out
    assert re.search(r"failover\s+demo-w1: its shards resumed on other workers after [\d.]+ s", out)
    # AND the graceful stop handed its shards over (a figure, within a liveness bound derived from the timings: a
    # SIGTERM needs no expiry; the speed is bench/failover.py's `term`)
    handover = re.search(r"hand-over\s+demo-w2 \(SIGTERM\): its shards resumed on other workers after ([\d.]+) s", out)
    assert handover is not None, out[-3000:]
    assert float(handover.group(1)) < HANDOVER_BOUND_S, f"{handover.group(0)}; {stall_note(started)}"
    assert "Traceback" not in out + result.stderr
    # AND the report drew the dashboard's graphs from the run's metrics, and says where
    picture = re.search(r"dashboard picture \(the dashboard's graphs, from this run's metrics\): (\S+\.png)", out)
    assert picture is not None, out[-2000:]
    path = Path(picture.group(1))
    try:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 50_000
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.slow
@pytest.mark.heavy
def test_ctrl_c_stops_everything_the_demo_started() -> None:
    # GIVEN a running demo
    before = temp_dirs()
    with running_demo() as process:
        eventually(
            lambda: len(descendants(process.pid)) >= 4, bound_s=START_BOUND_S, what="emulators + workers started"
        )
        started = descendants(process.pid)
        assert len(started) >= 4
        time.sleep(3)  # let the demo run a moment (not a bound)
        # WHEN the user presses Ctrl-C
        process.send_signal(signal.SIGINT)
        _, err = communicate(process, bound_s=STOP_BOUND_S)
        # THEN it exits 130 with one line, every process it started is gone, and its temporary files too
        assert process.returncode == 130, err
        assert "interrupted" in err and "Traceback" not in err
        assert {pid for pid in started if is_running(pid)} == set()
        assert temp_dirs() <= before


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_everything_the_demo_started(signum: signal.Signals) -> None:
    # GIVEN a running demo whose workers are up (as `timeout`, CI cancellation or `docker stop` find it)
    before = temp_dirs()
    with running_demo() as process:
        eventually(
            lambda: len(descendants(process.pid)) >= 4, bound_s=START_BOUND_S, what="moto, kinesalite, 2 workers"
        )
        time.sleep(2)  # let the workers come up (not a bound)
        started = descendants(process.pid)
        assert len(started) >= 4
        # WHEN the signal reaches the demo's process only (not its group: docker stop signals PID 1 alone)
        process.send_signal(signum)
        # THEN it exits (within a liveness bound) 128 + the signal with one line, and every process it started is gone
        _, err = communicate(process, bound_s=STOP_BOUND_S)
        assert process.returncode == 128 + signum, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"stopped by {signum.name}" in lines[0], err
        assert {pid for pid in started if is_running(pid)} == set()
        assert temp_dirs() <= before
