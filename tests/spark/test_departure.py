"""The source runner's SIGTERM: Spark ends the runner that way when a query stops, and the source leaves as a
worker does (its coordinator's stop(): DEPARTING, leases given up, STOPPED), then exits 0 without a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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
