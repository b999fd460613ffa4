"""How late this machine runs timers, measured while the tests run, and liveness bounds derived from configuration.

A test waits on real time only to detect a hang, never to judge speed (docs/testing.md, "Time bounds"). Its bound
is the time the configured timings say the thing takes, times a named factor; when the bound is missed anyway the
message says how late the machine ran timers meanwhile, so a starved machine is told from a hung test.

The probe is one process for the whole run (started by tests/conftest.py in the controller): it sleeps
``PROBE_STEP_S``, then spends ``PROBE_WORK_S`` of CPU, and appends ``<monotonic> <wall> <lateness s> <1-min load
average> <work s>`` to the file named by ``$SHARDLEASE_TEST_PROBE``, flushed each line: how late its timer fired, and
how long the small task took in wall time (a woken sleeper is scheduled first, so lateness alone understates what a
busy process suffers). ``time.monotonic()`` is CLOCK_MONOTONIC, the same in every process
of the machine, so a test compares the probe's times with its own.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from worker_lib.testing.waiting import wait_until

PROBE_ENV = "SHARDLEASE_TEST_PROBE"
PROBE_STEP_S = 0.1
PROBE_WORK_S = 0.005

HANG_FACTOR = 4.0
"""A liveness bound is this many times the time the configured timings give: past it, something hangs. A 2-core
machine running a fleet, a JVM and emulators at once has been seen running 3 s timers 2-3 times late."""

HANG_FLOOR_S = 20.0
"""No liveness bound is shorter: a process start, an emulator call or a stop-the-world pause alone can take seconds."""


def hang_bound_s(expected_s: float, *, factor: float = HANG_FACTOR, floor_s: float = HANG_FLOOR_S) -> float:
    """The liveness bound of something the configured timings say takes ``expected_s``."""
    return max(floor_s, expected_s * factor)


@dataclass(frozen=True, kw_only=True)
class Stall:
    """What the probe saw over a span of time: the longest timer lateness and the highest load average."""

    lateness_s: float
    load: float
    work_s: float
    samples: int

    def __str__(self) -> str:
        if self.samples == 0:
            return "no timer probe samples (probe not running)"
        late, load, work = self.lateness_s, self.load, self.work_s * 1000
        return (
            f"the machine stalled {late:.1f} s at most (timer lateness; a {PROBE_WORK_S * 1000:.0f} ms task took up to "
            f"{work:.0f} ms), load average up to {load:.1f}"
        )


def samples(path: Path) -> Iterator[tuple[float, float, float, float, float]]:
    """(monotonic, wall, lateness, load average, work) of every sample the probe wrote, in time order."""
    try:
        text = path.read_text()
    except OSError:
        return
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5:
            try:
                yield float(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]), float(parts[4])
            except ValueError:
                continue


def probe_path() -> Path | None:
    name = os.environ.get(PROBE_ENV)
    return Path(name) if name else None


def stall_between(start: float, end: float | None = None, *, wall: bool = False, path: Path | None = None) -> Stall:
    """The probe's figures between two times (monotonic, or wall with ``wall=True``); ``end`` None: until now."""
    path = path or probe_path()
    if path is None:
        return Stall(lateness_s=0.0, load=0.0, work_s=0.0, samples=0)
    late, load, work, n = 0.0, 0.0, 0.0, 0
    for mono, wall_t, lateness, load1, work_s in samples(path):
        t = wall_t if wall else mono
        if t < start or (end is not None and t > end):
            continue
        late, load, work, n = max(late, lateness), max(load, load1), max(work, work_s), n + 1
    return Stall(lateness_s=late, load=load, work_s=work, samples=n)


def stall_note(since: float) -> str:
    """One phrase for a failure message: how late timers ran since ``since`` (monotonic)."""
    return str(stall_between(since))


def eventually(predicate: Callable[[], bool], *, bound_s: float, what: str, step_s: float = 0.1) -> float:
    """Wait until ``predicate`` holds, at most ``bound_s`` (a liveness bound: :func:`hang_bound_s`), and return
    how long it took; a miss fails the test with ``what``, the bound and what the probe saw meanwhile."""
    started = time.monotonic()
    if not wait_until(predicate, timeout_s=bound_s, step_s=step_s):
        raise AssertionError(f"{what}: not within the liveness bound of {bound_s:.0f} s; {stall_note(started)}")
    return time.monotonic() - started


def run_probe(path: Path, step_s: float = PROBE_STEP_S, work_s: float = PROBE_WORK_S) -> None:
    """The probe process: sleep, say how late it woke and how long a small task then took, until its parent goes
    away."""
    parent = os.getppid()
    with path.open("a", buffering=1) as out:
        while os.getppid() == parent:
            asked = time.monotonic()
            time.sleep(step_s)
            woke = time.monotonic()
            cpu = time.process_time()
            while time.process_time() - cpu < work_s:
                pass
            done = time.monotonic()
            late = max(0.0, woke - asked - step_s)
            out.write(f"{woke:.3f} {time.time():.3f} {late:.3f} {os.getloadavg()[0]:.2f} {done - woke:.4f}\n")


if __name__ == "__main__":
    run_probe(Path(sys.argv[1]))
