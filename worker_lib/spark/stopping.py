"""Stopping a streaming query between micro-batches.

``query.stop()`` interrupts the query's stream thread wherever it is. In the middle of a ``foreachBatch`` sink that
cancels the sink's Spark job; the Python sink then fails with a Py4J error whose message carries the whole Java stack
trace, and Spark 4.3's check of whether that error was "caused by the stop" (``StreamExecution.PROXY_ERROR``, the
pattern ``An error occurred while calling((.|\\r\\n|\\r|\\n)*)(...)``) overflows the stack on a message that long:
``java.lang.StackOverflowError`` in the stream execution thread. The thread then dies before its clean-up, so the
source's runner process is not ended and keeps the application's leases until the session stops.

Between micro-batches the stream thread only waits for the next trigger, and an interrupt there ends it cleanly.
:func:`stop_between_batches` waits for such a moment (``query.status["isTriggerActive"]`` false) and stops then.
"""

from __future__ import annotations

from typing import Any

from worker_lib.core.clock import SYSTEM_CLOCK, Clock

POLL_S = 0.02


def stop_between_batches(query: Any, *, timeout_s: float = 60.0, clock: Clock = SYSTEM_CLOCK) -> bool:
    """Stop ``query`` (a ``StreamingQuery``) when no micro-batch is running; after ``timeout_s`` of back-to-back
    batches, stop it anyway. Returns whether the stop fell between batches (or the query had already ended)."""
    deadline = clock.monotonic() + timeout_s
    while query.isActive:
        if not query.status.get("isTriggerActive", False):
            query.stop()
            return True
        if clock.monotonic() >= deadline:
            query.stop()
            return False
        clock.sleep(POLL_S)
    return True


__all__ = ["stop_between_batches"]
