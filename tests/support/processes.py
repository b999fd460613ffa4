"""Real `shardlease` processes for end-to-end tests: started in their own sessions, always killed by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

from worker_lib.testing.commands import shardlease_command

REPO = Path(__file__).resolve().parents[2]

# Short timings so that end-to-end tests finish in seconds (lease 3 s, renew ~1 s, discover 0.2 s).
FAST_ENV = {
    "SHARDLEASE_FAILOVER_TIME_MS": "3000",
    "SHARDLEASE_DISCOVERY_INTERVAL_MS": "200",
    "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS": "100",
    "SHARDLEASE_PARENT_POLL_INTERVAL_MS": "500",
}


class ProcessGroup:
    """Processes started by one test; ``close()`` kills whatever is left (SIGKILL to each process group)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        full_env = {**os.environ, **FAST_ENV, **env, "PYTHONPATH": str(REPO)}
        log = (self.log_dir / f"{name}.log").open("wb")
        process = subprocess.Popen(
            shardlease_command(*args),
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def signal(self, name: str, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.processes[name].pid, sig)

    def wait(self, name: str, timeout_s: float) -> int:
        return self.processes[name].wait(timeout=timeout_s)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(encoding="utf-8", errors="replace")

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)


@contextlib.contextmanager
def process_group(log_dir: Path) -> Iterator[ProcessGroup]:
    group = ProcessGroup(log_dir)
    try:
        yield group
    finally:
        group.close()
