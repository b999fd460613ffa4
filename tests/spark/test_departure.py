"""The source runner's SIGTERM: Spark ends the runner that way when a query stops, and the source leaves as a
worker does (its coordinator's stop(): DEPARTING, leases given up, STOPPED), then exits 0 without a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.processes import REPO

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
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(marker)], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    # THEN the coordinator's stop() ran to the end, the process exited 0, and nothing was printed to stderr
    assert marker.read_text() == "departed"
    assert done.returncode == 0
    assert done.stdout.strip() == "ready"
    assert done.stderr == ""


RUNNER_HOLDING_A_LOCK = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from worker_lib.spark.source import depart_on_termination

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
    time.sleep(30)
    print("not reached", flush=True)
    """
)


def test_sigterm_inside_a_call_holding_a_lock_departs_once_the_call_is_done(tmp_path: Path) -> None:
    # GIVEN a runner whose main thread holds a lock the departure needs when SIGTERM arrives
    marker = tmp_path / "departed"
    started = time.monotonic()
    # WHEN it receives SIGTERM there
    done = subprocess.run(
        [sys.executable, "-c", RUNNER_HOLDING_A_LOCK, str(marker)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # THEN the call finished, the departure ran to its end right after (not at the 10 s deadline), and the process
    # exited 0 with nothing on stderr
    assert marker.read_text() == "departed"
    assert done.returncode == 0 and done.stderr == ""
    assert time.monotonic() - started < 8
