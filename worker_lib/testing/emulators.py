"""Local AWS emulators on loopback, started and stopped by PID.

* moto server (DynamoDB, Kinesis, CloudWatch): the default backend.
* kinesalite: Kinesis with faithful resharding data flow (moto routes writes to closed parents).
* dynalite: DynamoDB with realistic consumed capacity; a second opinion on moto.

Each emulator is a child process in its own session, bound to 127.0.0.1 on a port the OS picks (the child
reports it, so there is no race for a "free" port). :meth:`Emulator.stop` terminates the whole process group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from worker_lib.core.clock import SYSTEM_CLOCK
from worker_lib.core.errors import ShardleaseError

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent


class EmulatorError(ShardleaseError):
    """An emulator could not be started."""


@dataclass
class Emulator:
    name: str
    endpoint_url: str
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def is_running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate the emulator's process group; escalate to SIGKILL after ``timeout_s``."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout_s)
        if self.process.stdout:
            self.process.stdout.close()

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def find_node_module(name: str) -> Path:
    """Locate ``node_modules/<name>``: ``$SHARDLEASE_NODE_MODULES``, then upwards from the cwd and this package."""
    candidates: list[Path] = []
    if env := os.environ.get("SHARDLEASE_NODE_MODULES"):
        candidates.append(Path(env))
    for start in (Path.cwd(), _HERE):
        candidates.extend(p / "node_modules" for p in (start, *start.parents))
    for base in candidates:
        if (base / name / "package.json").is_file():
            return base / name
    raise EmulatorError(f"{name} is not installed: run `npm ci` in the project directory (needs Node.js)")


def _wait_ready(process: subprocess.Popen[bytes], name: str, timeout_s: float) -> int:
    assert process.stdout is not None
    deadline = SYSTEM_CLOCK.monotonic() + timeout_s
    buffer = b""
    while SYSTEM_CLOCK.monotonic() < deadline:
        if process.poll() is not None:
            raise EmulatorError(f"{name} exited with code {process.returncode} before it was ready")
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if not ready:
            continue
        chunk = os.read(process.stdout.fileno(), 4096)
        buffer += chunk
        for line in buffer.splitlines():
            if line.startswith(b"READY "):
                return int(line.split()[1])
    raise EmulatorError(f"{name} did not start within {timeout_s:.0f} s")


def _spawn(name: str, argv: list[str], timeout_s: float, log_path: Path | None) -> Emulator:
    stderr = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise EmulatorError(f"cannot start {name}: {exc.filename} not found") from exc
    finally:
        if log_path and stderr is not subprocess.DEVNULL:
            stderr.close()  # type: ignore[union-attr]
    try:
        port = _wait_ready(process, name, timeout_s)
    except BaseException:
        Emulator(name, "", process).stop()
        raise
    emulator = Emulator(name=name, endpoint_url=f"http://127.0.0.1:{port}", process=process)
    log.info("started %s pid=%d at %s", name, process.pid, emulator.endpoint_url)
    return emulator


def start_moto(*, timeout_s: float = 30.0, log_path: Path | None = None) -> Emulator:
    """A moto server (all services) in a child Python process."""
    return _spawn("moto", [sys.executable, "-m", "worker_lib.testing._moto_server"], timeout_s, log_path)


def _start_node(name: str, timeout_s: float, log_path: Path | None) -> Emulator:
    node = shutil.which("node")
    if node is None:
        raise EmulatorError(f"{name} needs Node.js (`node` is not on PATH)")
    module = find_node_module(name)
    return _spawn(name, [node, str(_HERE / "emulator.js"), str(module)], timeout_s, log_path)


def start_kinesalite(*, timeout_s: float = 20.0, log_path: Path | None = None) -> Emulator:
    return _start_node("kinesalite", timeout_s, log_path)


def start_dynalite(*, timeout_s: float = 20.0, log_path: Path | None = None) -> Emulator:
    return _start_node("dynalite", timeout_s, log_path)
