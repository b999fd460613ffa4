"""SIGTERM/SIGINT for a worker run in the foreground: the first signal shuts down gracefully, a second exits now.

Containers (``docker stop``, ECS, Kubernetes) send SIGTERM and wait; the graceful shutdown finishes the batches in
flight, checkpoints and hands the leases over within about a second (docs/worker.md). An impatient operator's second
Ctrl-C exits at once: the checkpoints already written are kept, the leases expire as after a crash.

A signal can come at any moment, also while the process is still starting (a deployment rolled back, a task
stopped while it waits for its tables): :func:`hold_shutdown_signals` remembers one from the first line of the
command on, and :func:`install_shutdown_handlers` delivers it, so a worker stopped before it started exits 0
instead of dying of the signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _HeldSignals:
    """The handler while the process starts: it only remembers the signals that came."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)


def hold_shutdown_signals() -> None:
    """Until :func:`install_shutdown_handlers`, remember SIGTERM/SIGINT instead of dying of them (main thread
    only; elsewhere the host owns the signals and this does nothing)."""
    held = _HeldSignals()
    for sig in SHUTDOWN_SIGNALS:
        with contextlib.suppress(ValueError):
            signal.signal(sig, held)


def install_shutdown_handlers(shutdown: Callable[[], object]) -> None:
    """Route SIGTERM and SIGINT to ``shutdown`` (run in a thread of its own, so the handler returns at once); a
    signal held since :func:`hold_shutdown_signals` is delivered now.

    Outside the main thread Python cannot install handlers: the host process owns the signals then, and this does
    nothing.
    """
    signals_seen = 0

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            log.info("signal %s: shutting down gracefully", signal.Signals(signum).name)
            threading.Thread(target=shutdown, name="worker-shutdown", daemon=True).start()
        else:
            log.warning("second signal: exiting now (checkpoints already written are kept)")
            os._exit(128 + signum)

    held: list[int] = []
    for sig in SHUTDOWN_SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread: the host handles signals
            previous = signal.signal(sig, handler)
            if isinstance(previous, _HeldSignals):
                held = previous.received
    for signum in held[:2]:  # a second held signal still means "now"
        handler(signum, None)
