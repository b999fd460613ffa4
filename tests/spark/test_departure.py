"""The source runner's SIGTERM: Spark ends the runner that way when a query stops, and the source leaves as a
worker does (its coordinator's stop(): DEPARTING, leases given up, STOPPED), then exits 0 without a traceback.

A runner process is a liveness bound on its departure's deadline (DEPARTURE_TIMEOUT_S: it ends by then whatever
happens); what is asserted — the departure ran to its end, the exit code, nothing on stderr — is exact."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.processes import REPO
from tests.support.stalls import hang_bound_s, stall_note
from worker_lib.spark.source import DEPARTURE_TIMEOUT_S


def run_runner(code: str, marker: Path) -> subprocess.CompletedProcess[str]:
    """Run a stand-in runner to its end: a liveness bound on its departure's deadline (DEPARTURE_TIMEOUT_S), the
    longest it lives after SIGTERM."""
    bound_s, started = hang_bound_s(DEPARTURE_TIMEOUT_S), time.monotonic()
    try:
        return subprocess.run(
            [sys.executable, "-c", code, str(marker)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=bound_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"the runner did not end within the liveness bound of {bound_s:.0f} s; {stall_note(started)}\n"
            f"{exc.stdout!r} {exc.stderr!r}"
        ) from None


RUNNER = textwrap.dedent(
    """
    import os, signal, sys, time
    from worker_lib.spark.source import depart_on_termination

    class Coordinator:
        def stop(self):
            time.sleep(0.2)  # a departure takes a few round trips
            open(sys.argv[1], "w").write("departed")

    depart_on_termination(Coordinator())
    print("ready", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # the runner is blocked reading its socket when Spark's SIGTERM arrives
    print("not reached", flush=True)
    """
)


def test_sigterm_departs_then_exits_quietly(tmp_path: Path) -> None:
    # GIVEN a process standing in for Spark's source runner, with the source's SIGTERM handler installed
    marker = tmp_path / "departed"
    # WHEN it receives SIGTERM while blocked
    done = run_runner(RUNNER, marker)
    # THEN the coordinator's stop() ran to the end, the process exited 0, and nothing was printed to stderr
    assert marker.read_text() == "departed"
    assert done.returncode == 0
    assert done.stdout.strip() == "ready"
    assert done.stderr == ""


RUNNER_HOLDING_A_LOCK = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import worker_lib.spark.source as source
    from worker_lib.spark.source import depart_on_termination

    source.DEPARTURE_TIMEOUT_S = 3600.0  # no deadline to end the process: only the departure can
    lock = threading.Lock()  # a coordinator lock, held by the main thread inside a call (e.g. latestOffset)

    class Coordinator:
        def stop(self):
            with lock:
                open(sys.argv[1], "w").write("departed")

    depart_on_termination(Coordinator())
    print("ready", flush=True)
    with lock:
        os.kill(os.getpid(), signal.SIGTERM)  # Spark stops the query while the runner answers a call
        time.sleep(0.3)  # the rest of that call
    threading.Event().wait()  # blocked reading Spark's socket, for good
    print("not reached", flush=True)
    """
)


def test_sigterm_inside_a_call_holding_a_lock_departs_once_the_call_is_done(tmp_path: Path) -> None:
    # GIVEN a runner whose main thread holds a lock the departure needs when SIGTERM arrives, and no deadline that
    # could end the process instead of the departure (a handler waiting for the departure there would wait for itself
    # for good: a hang, not an exit)
    marker = tmp_path / "departed"
    # WHEN it receives SIGTERM there
    done = run_runner(RUNNER_HOLDING_A_LOCK, marker)
    # THEN the call finished, the departure ran to its end right after and ended the process (nothing else could),
    # which exited 0 with nothing on stderr
    assert marker.read_text() == "departed"
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.strip() == "ready"
