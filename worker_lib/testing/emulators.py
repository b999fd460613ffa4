"""Local AWS emulators on loopback, started and stopped by PID.

* moto server (DynamoDB, Kinesis, CloudWatch): the default backend (Python; the ``demo`` extra installs it).
* kinesalite: Kinesis with faithful resharding data flow (moto routes writes to closed parents). Node.js; where
  it comes from is decided by :mod:`worker_lib.testing.node`.
* dynalite: DynamoDB with realistic consumed capacity; a second opinion on moto (Node.js, installed by you).

Each emulator is a child process in its own session, bound to 127.0.0.1 on a port the OS picks; the child writes
that port to a file, so there is no race for a "free" port. :meth:`Emulator.stop` ends the whole process group.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from worker_lib.core.clock import SYSTEM_CLOCK
from worker_lib.core.errors import MissingExtraError, ShardleaseError
from worker_lib.testing import node

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent


class EmulatorError(ShardleaseError):
    """An emulator could not be started."""


@dataclass
class Emulator:
    """A running emulator: its endpoint and its process. A context manager that stops it on exit."""

    name: str
    endpoint_url: str
    process: subprocess.Popen[bytes]
    source: str = ""  # where its code came from (for Node emulators: see worker_lib.testing.node)

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

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _last_line(log_path: Path | None) -> str:
    if log_path is None or not log_path.is_file():
        return ""
    lines = log_path.read_text(errors="replace").strip().splitlines()
    return f": {lines[-1][:200]}" if lines else ""


def _wait_ready(
    process: subprocess.Popen[bytes], name: str, port_file: Path, timeout_s: float, log_path: Path | None
) -> int:
    deadline = SYSTEM_CLOCK.monotonic() + timeout_s
    while SYSTEM_CLOCK.monotonic() < deadline:
        if port_file.is_file():
            return int(port_file.read_text().strip())
        if process.poll() is not None:
            raise EmulatorError(
                f"{name} exited with code {process.returncode} before it was ready{_last_line(log_path)}"
            )
        SYSTEM_CLOCK.sleep(0.05)
    raise EmulatorError(f"{name} did not start within {timeout_s:.0f} s")


def _spawn(name: str, argv: list[str], timeout_s: float, log_path: Path | None, source: str = "") -> Emulator:
    """Start ``argv + [port_file]``-style launchers: ``{port_file}`` in ``argv`` is replaced by a fresh path."""
    with tempfile.TemporaryDirectory(prefix=f"shardlease-{name}-") as scratch:
        port_file = Path(scratch) / "port"
        argv = [str(port_file) if arg == "{port_file}" else arg for arg in argv]
        stderr = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, start_new_session=True
            )
        except FileNotFoundError as exc:
            raise EmulatorError(f"cannot start {name}: {exc.filename} not found") from exc
        finally:
            if log_path and stderr is not subprocess.DEVNULL:
                stderr.close()  # type: ignore[union-attr]
        try:
            port = _wait_ready(process, name, port_file, timeout_s, log_path)
        except BaseException:
            Emulator(name, "", process).stop()
            raise
    emulator = Emulator(name=name, endpoint_url=f"http://127.0.0.1:{port}", process=process, source=source)
    log.info("started %s pid=%d at %s", name, process.pid, emulator.endpoint_url)
    return emulator


def start_moto(*, timeout_s: float = 30.0, log_path: Path | None = None) -> Emulator:
    """A moto server (all services) in a child Python process. Needs moto (``pip install 'shardlease[demo]'``)."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        raise MissingExtraError("the moto emulator (worker_lib.testing)", "demo")
    argv = [sys.executable, "-m", "worker_lib.testing._moto_server", "{port_file}"]
    return _spawn("moto", argv, timeout_s, log_path, source=f"moto {_version('moto')}")


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "?"


def _start_node(name: str, timeout_s: float, log_path: Path | None) -> Emulator:
    node_bin = shutil.which("node")
    if node_bin is None:
        raise EmulatorError(f"{name} needs Node.js 18 or later (`node` is not on PATH): install Node.js (nodejs.org)")
    try:
        package = node.locate(name)
    except node.NodePackageError as exc:
        raise EmulatorError(str(exc)) from exc
    argv = [node_bin, str(_HERE / "emulator.js"), str(package.path), "{port_file}"]
    return _spawn(name, argv, timeout_s, log_path, source=package.source)


def start_kinesalite(*, timeout_s: float = 20.0, log_path: Path | None = None) -> Emulator:
    """kinesalite on loopback; installs it into the user cache with npm on first use (see worker_lib.testing.node)."""
    return _start_node("kinesalite", timeout_s, log_path)


def start_dynalite(*, timeout_s: float = 20.0, log_path: Path | None = None) -> Emulator:
    """dynalite on loopback (``npm install dynalite`` or ``$SHARDLEASE_DYNALITE_BIN``)."""
    return _start_node("dynalite", timeout_s, log_path)


# kinesis-local (a build of kinesis-mock) reads its delays from these; three of its names are rotated in 0.6.2
# (the deregister delay is read from START_STREAM_ENCRYPTION_DURATION), so every one is set to 0.
_KINESIS_LOCAL_DELAYS = (
    "CREATE_STREAM_DURATION",
    "DELETE_STREAM_DURATION",
    "REGISTER_STREAM_CONSUMER_DURATION",
    "DEREGISTER_STREAM_CONSUMER_DURATION",
    "MERGE_SHARDS_DURATION",
    "SPLIT_SHARD_DURATION",
    "UPDATE_SHARD_COUNT_DURATION",
    "UPDATE_STREAM_MODE_DURATION",
    "START_STREAM_ENCRYPTION_DURATION",
    "STOP_STREAM_ENCRYPTION_DURATION",
)


def start_kinesis_local(*, timeout_s: float = 30.0, log_path: Path | None = None) -> Emulator:
    """kinesis-local (kinesis-mock) on loopback: the one emulator that serves SubscribeToShard (enhanced fan-out).

    From ``node_modules`` (pinned in the project's package-lock.json) or ``$SHARDLEASE_KINESIS_LOCAL_BIN``. Its
    SubscribeToShard differs from AWS's in ways botocore notices: put :class:`FanOutProxy` in front of it
    (docs/testing.md lists the differences)."""
    node_bin = shutil.which("node")
    if node_bin is None:
        raise EmulatorError("kinesis-local needs Node.js 18 or later (`node` is not on PATH)")
    try:
        package = node.locate("kinesis-local", install=False)
    except node.NodePackageError as exc:
        raise EmulatorError(str(exc)) from exc
    plain, tls = free_port(), free_port()
    env = {
        **os.environ,
        "KINESIS_MOCK_PLAIN_PORT": str(plain),
        "KINESIS_MOCK_TLS_PORT": str(tls),  # always opened; unused
        "KINESIS_MOCK_CERT_PATH": str(package.path / "server.json"),  # else looked up in the working directory
        "SHARD_LIMIT": "10000",
        **dict.fromkeys(_KINESIS_LOCAL_DELAYS, "0ms"),
    }
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    try:
        process = subprocess.Popen(
            [node_bin, str(package.path / "main.js")],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env,
            start_new_session=True,
        )
    finally:
        if log_path and out is not subprocess.DEVNULL:
            out.close()  # type: ignore[union-attr]
    emulator = Emulator(
        name="kinesis-local", endpoint_url=f"http://127.0.0.1:{plain}", process=process, source=package.source
    )
    deadline = SYSTEM_CLOCK.monotonic() + timeout_s
    while not _answers(plain):  # it prints nothing when ready
        if process.poll() is not None:
            raise EmulatorError(
                f"kinesis-local exited with code {process.returncode} before it was ready{_last_line(log_path)}"
            )
        if SYSTEM_CLOCK.monotonic() > deadline:
            emulator.stop()
            raise EmulatorError(f"kinesis-local did not start within {timeout_s:.0f} s")
        SYSTEM_CLOCK.sleep(0.1)
    log.info("started kinesis-local pid=%d at %s", process.pid, emulator.endpoint_url)
    return emulator


def free_port() -> int:
    """A loopback port free now (the emulator binds it a moment later; loopback ports are rarely raced)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False
