"""A SIGTERM that comes while a worker starts is held, then delivered once the worker's handlers are installed."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from tests.support.stalls import eventually, hang_bound_s
from worker_lib.worker.signals import SHUTDOWN_SIGNALS, hold_shutdown_signals, install_shutdown_handlers

HANDLER_BOUND_S = hang_bound_s(0.0)
"""A handled signal runs its handler in this thread at once: the liveness bound is the floor."""


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in SHUTDOWN_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_signal_held_while_starting_reaches_the_shutdown(restored_handlers: None) -> None:
    # GIVEN a process that holds shutdown signals while it starts, and gets SIGTERM then
    hold_shutdown_signals()
    os.kill(os.getpid(), signal.SIGTERM)
    shut_down = threading.Event()
    # WHEN the worker installs its handlers
    install_shutdown_handlers(shut_down.set)
    # THEN the held signal starts the graceful shutdown
    eventually(shut_down.is_set, bound_s=HANDLER_BOUND_S, what="the held SIGTERM's shutdown")


def test_no_held_signal_no_shutdown(restored_handlers: None) -> None:
    # GIVEN a process that holds shutdown signals while it starts, and gets none
    hold_shutdown_signals()
    shut_down = threading.Event()
    # WHEN the worker installs its handlers
    install_shutdown_handlers(shut_down.set)
    # THEN nothing shuts down (looked at for 0.2 s: a held signal would have been delivered at once), until a
    # signal comes
    assert not shut_down.wait(0.2)
    os.kill(os.getpid(), signal.SIGTERM)
    eventually(shut_down.is_set, bound_s=HANDLER_BOUND_S, what="the SIGTERM's shutdown")
