"""``shardlease demo`` on the command line: the narrative printed, the live view drawn, signals turned into a
clean stop.

SIGTERM and SIGHUP (``timeout``, CI cancellation, ``docker stop``, a closed terminal) unwind the demo like Ctrl-C
does: every ``finally`` on the way stops what it started (worker processes, the leader's schedule, kinesalite,
moto), then the command exits 128 + the signal number with one line. A last sweep ends any child process that is
still there (one started in the instant the signal arrived).
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from worker_lib.core.errors import MissingExtraError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopSignal(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread; a BaseException so no ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class PrintedOutput:
    """The demo's narrative on stdout; a rich live view when stdout is a terminal."""

    def __init__(self, *, live: bool) -> None:
        self.use_live = live

    def say(self, line: str) -> None:
        print(line, flush=True)

    def live(self) -> contextlib.AbstractContextManager[Callable[[Any], None]] | None:
        if not self.use_live:
            return None
        return self._live()

    @contextlib.contextmanager
    def _live(self) -> Iterator[Callable[[Any], None]]:
        from rich.live import Live

        with Live(refresh_per_second=2, transient=False) as view:
            yield view.update


def _check_extras(*, live: bool) -> None:
    # find_spec, not an import: moto's server pulls in Flask, and the demo runs it in a child process anyway
    needed = ["moto", "flask", "rich"] if live else ["moto", "flask"]
    if any(importlib.util.find_spec(name) is None for name in needed):
        raise MissingExtraError("shardlease demo", "demo")


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into :class:`StopSignal`; once stopping, later signals (Ctrl-C too) are ignored so that
    they cannot cut the cleanup short (a SIGKILL still can)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        for other in (*STOP_SIGNALS, signal.SIGINT):
            signal.signal(other, signal.SIG_IGN)
        raise StopSignal(signum)

    def interrupt(signum: int, frame: FrameType | None) -> None:
        for other in (*STOP_SIGNALS, signal.SIGINT):
            signal.signal(other, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {sig: signal.getsignal(sig) for sig in (*STOP_SIGNALS, signal.SIGINT)}
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _sweep_children(timeout_s: float = 5.0) -> None:
    """End any child process still alive (and its own children): the demo leaves nothing behind."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=timeout_s)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=timeout_s)


def run_demo_cli(*, workers: int, shards: int, duration_s: float, scenario: str) -> int:
    from worker_lib.tools.demo.runner import validate

    validate(workers=workers, shards=shards, duration_s=duration_s, scenario=scenario)  # before any child starts
    live = sys.stdout.isatty()
    _check_extras(live=live)
    from worker_lib.tools.demo.runner import run_demo

    try:
        with _signals_unwind():
            return run_demo(
                workers=workers,
                shards=shards,
                duration_s=duration_s,
                scenario=scenario,
                out=PrintedOutput(live=live),
            )
    except StopSignal as stopped:
        print(f"shardlease demo: stopped by {stopped.name}; every process it started has been stopped", file=sys.stderr)
        return 128 + stopped.signum
    finally:
        _sweep_children()
