"""SIGTERM/SIGINT for a worker run in the foreground: the first signal shuts down gracefully, a second exits now.

Containers (``docker stop``, ECS, Kubernetes) send SIGTERM and wait; the graceful shutdown finishes the batches in
flight, checkpoints and hands the leases over within about a second (docs/worker.md). An impatient operator's second
Ctrl-C exits at once: the checkpoints already written are kept, the leases expire as after a crash.
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


def install_shutdown_handlers(shutdown: Callable[[], object]) -> None:
    """Route SIGTERM and SIGINT to ``shutdown`` (run in a thread of its own, so the handler returns at once).

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

    for sig in SHUTDOWN_SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread: the host handles signals
            signal.signal(sig, handler)
