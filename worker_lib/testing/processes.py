"""Real ``shardlease`` processes for tests, benchmarks and the demo: started by name, signalled and killed by PID.

A test that kills workers wants every process in a session of its own (a signal meant for one worker reaches no
one else, and the test's own Ctrl-C is not forwarded), its output in a file (read it when an assertion fails),
and nothing left running afterwards, even when the test fails. :class:`ProcessFleet` is that, as a context
manager::

    with ProcessFleet(tmp_path, env={**os.environ, **FAST_TIMINGS, **local.env()}) as fleet:
        fleet.start_worker("w1", app="orders", stream="orders-stream", processor="my_tests.processor:Journal")
        fleet.start_worker("w2", app="orders", stream="orders-stream", processor="my_tests.processor:Journal")
        ...
        killed_at = fleet.signal("w1", SIGKILL)
        ...
        assert fleet.stop(["w2"]) == {"w2": 0}      # SIGTERM, then the exit code
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGCONT, SIGKILL, SIGTERM, Signals
from typing import TypeVar

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.testing.commands import app_args, shardlease_command

_Fleet = TypeVar("_Fleet", bound="ProcessFleet")

CUTTING_SIGNALS = ("SIGKILL", "SIGSTOP")  # after one of these a process serves nothing (until a SIGCONT)


@dataclass
class FleetProcess:
    """One process of a :class:`ProcessFleet`. Times are the fleet's readings (monotonic unless ``wall_times``)."""

    name: str
    role: str  # "worker", "leader", another shardlease command, or "process"
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float
    signals: list[tuple[float, str]] = field(default_factory=list)  # (time just before sending, "SIGKILL", …)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def sent(self, signal_name: str) -> float | None:
        """When ``signal_name`` (e.g. ``"SIGKILL"``) was first sent to it through the fleet, if ever."""
        return next((at for at, name in self.signals if name == signal_name), None)

    def cut_at(self) -> list[float]:
        """When it was killed or frozen (SIGKILL, SIGSTOP): from each of these moments it served nothing."""
        return [at for at, name in self.signals if name in CUTTING_SIGNALS]


class ProcessFleet:
    """Processes started by name, each in its own session (``start_new_session``), output to ``<log_dir>/<name>.log``.

    ``env``: the environment of every process (default: this process's at construction), overlaid per start;
    ``cwd``: their working directory. Signals go to one PID (or its process group, ``group=True``), never by
    name; :meth:`close` (and leaving the ``with`` block) SIGKILLs the process group of whatever still runs.
    Times (``started_at``, what :meth:`signal` returns) are ``clock.monotonic()`` — comparable with the monotonic
    times other processes on the machine journal — or ``clock.wall()`` with ``wall_times=True``.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        clock: Clock = SYSTEM_CLOCK,
        wall_times: bool = False,
        log_level: str = "INFO",
    ) -> None:
        self.log_dir = log_dir
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.clock = clock
        self.wall_times = wall_times
        self.log_level = log_level
        self.processes: dict[str, FleetProcess] = {}  # by name, in the order started
        self._lock = threading.Lock()

    def now(self) -> float:
        return self.clock.wall() if self.wall_times else self.clock.monotonic()

    # --- starting -------------------------------------------------------------------------------------------------

    def start(
        self, name: str, command: Sequence[str], *, env: Mapping[str, str] | None = None, role: str = "process"
    ) -> FleetProcess:
        """Start ``command`` as ``name`` (unique within the fleet: a restarted worker needs a name of its own)."""
        with self._lock:
            if name in self.processes:
                raise ValueError(f"a process named {name!r} was started already: give each one a name of its own")
            log_path = self.log_dir / f"{name}.log"
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    list(command),
                    cwd=self.cwd,
                    env={**self.env, **(env or {})},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started = FleetProcess(name=name, role=role, process=process, log_path=log_path, started_at=self.now())
            self.processes[name] = started
            return started

    def start_shardlease(
        self, name: str, *args: str, env: Mapping[str, str] | None = None, role: str | None = None
    ) -> FleetProcess:
        """``shardlease <args>`` (with this interpreter); its role is the command (``args[0]``) unless given."""
        command = shardlease_command(*args, log_level=self.log_level)
        return self.start(name, command, env=env, role=role or (args[0] if args else "process"))

    def start_worker(
        self,
        worker_id: str,
        *,
        app: str,
        stream: str | Sequence[str],
        processor: str,
        name: str | None = None,
        initial_position: str | None = None,
        endpoint_url: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> FleetProcess:
        """``shardlease worker`` with ``--worker-id worker_id``, named ``name`` (default: the worker id). Any other
        command, e.g. a leader: ``start_shardlease("L1", "leader", "--app", app, "--stream", stream)``."""
        args = app_args(app, stream, initial_position=initial_position, endpoint_url=endpoint_url)
        argv = ["worker", *args, "--processor", processor, "--worker-id", worker_id]
        return self.start_shardlease(name or worker_id, *argv, env=env)

    # --- looking at them ------------------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> FleetProcess:
        return self.processes[name]

    def alive(self, name: str) -> bool:
        return self.processes[name].alive()

    def live(self, role: str | None = None) -> list[FleetProcess]:
        """The processes still running (of ``role`` only, if given), in the order started."""
        return [p for p in list(self.processes.values()) if p.alive() and role in (None, p.role)]

    def by_pid(self, pid: int) -> FleetProcess | None:
        return next((p for p in list(self.processes.values()) if p.pid == pid), None)

    def log(self, name: str) -> str:
        """What the process wrote so far (stdout and stderr)."""
        return self.processes[name].log_path.read_text(encoding="utf-8", errors="replace")

    def abnormal_pids(self) -> set[int]:
        """PIDs the fleet killed or froze (SIGKILL, SIGSTOP): their work may be repeated by others."""
        return {p.pid for p in list(self.processes.values()) if p.cut_at()}

    def cut_at(self) -> dict[int, list[float]]:
        """PID -> when it was killed or frozen, for each process that was."""
        return {p.pid: p.cut_at() for p in list(self.processes.values()) if p.cut_at()}

    # --- signals --------------------------------------------------------------------------------------------------

    def signal(self, name: str, sig: Signals, *, group: bool = False) -> float:
        """Send ``sig`` to the process's PID (its whole process group with ``group``); the time just before
        sending. A process that is gone already is no error."""
        proc = self.processes[name]
        at = self.now()
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        proc.signals.append((at, sig.name))
        return at

    def wait(self, name: str, timeout_s: float) -> int | None:
        """The exit code, once the process ended; ``None`` if it still runs after ``timeout_s``."""
        try:
            return self.processes[name].process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(
        self, names: Sequence[str] | None = None, *, sig: Signals = SIGTERM, timeout_s: float = 40.0
    ) -> dict[str, int | None]:
        """Send ``sig`` to each of ``names`` (default: every live process) — SIGTERM for workers; SIGINT for
        ``shardlease leader``, which releases its lock on it — then wait up to ``timeout_s`` for each one's exit
        code (``None``: still running; :meth:`kill` or :meth:`close` ends it)."""
        chosen = [p.name for p in self.live()] if names is None else list(names)
        for name in chosen:
            self.signal(name, sig)
        return {name: self.wait(name, timeout_s) for name in chosen}

    def kill(self, name: str, *, timeout_s: float = 10.0) -> float:
        """SIGKILL the process's group (after a SIGCONT, should it be frozen) and reap it; the time of the kill."""
        proc = self.processes[name]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, SIGCONT)
        at = self.signal(name, SIGKILL, group=True)
        self.wait(name, timeout_s)
        return at

    def close(self, *, timeout_s: float = 10.0, exited_groups: bool = False) -> None:
        """SIGKILL the process group of every process still running and reap them (idempotent).

        ``exited_groups``: also the groups of processes that exited already, for children that outlive their
        parent in its session (a Spark application's JVM). Linux reuses no id a live process group holds, so
        the signal reaches that group or, once it is empty, nobody of ours; pass it only for fleets whose
        processes start children."""
        left = self.live()
        for proc in list(self.processes.values()) if exited_groups else left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, SIGCONT)  # a frozen process must be able to die
                os.killpg(proc.pid, SIGKILL)
        for proc in left:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.process.wait(timeout=timeout_s)

    def __enter__(self: _Fleet) -> _Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
