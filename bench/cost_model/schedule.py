"""The leader as deployed: the packaged Lambda handler, one invocation started every minute in its own thread as
EventBridge would, so consecutive invocations overlap and hand over exactly as in AWS.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from worker_lib.core.config import AwsConfig

from .configs import SCHEDULE_S
from .counting import Recorder


@dataclass
class Invocation:
    started_s: float
    duration_s: float = 0.0
    led: bool = False
    cut_short: bool = False  # stopped by the bench at the end of the run (not billed as a full invocation)


def invoke_handler(n: int, recorder: Recorder, endpoint: str, budget_s: float, stop: threading.Event) -> Invocation:
    """One leader Lambda invocation: the packaged handler's :func:`~worker_lib.leader.lambda_handler.invoke` with
    counted clients (a cold container each time, as when the module was loaded afresh), a context with
    ``budget_s`` left. ``stop`` ends the leader's loop early (only used after the measurement, to end the run)."""
    from worker_lib.leader import lambda_handler
    from worker_lib.leader.factory import ClientCache, LeaderClients

    def counted_clients(cfg: AwsConfig) -> LeaderClients:  # count the leader's calls
        return LeaderClients(
            aws_config=cfg,
            dynamodb=recorder.client("dynamodb", endpoint, "leader"),
            kinesis=recorder.client("kinesis", endpoint, "leader"),
        )

    class Context:
        function_name = "bench-leader"
        memory_limit_in_mb = 256
        invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:bench-leader"

        def __init__(self) -> None:
            self.aws_request_id = str(uuid.uuid4())
            self.deadline = time.monotonic() + budget_s

        def get_remaining_time_in_millis(self) -> int:
            return max(0, int((self.deadline - time.monotonic()) * 1000))

    invocation = Invocation(started_s=time.monotonic())
    try:
        summary = lambda_handler.invoke(Context(), clients=ClientCache(counted_clients), stop=stop)
        invocation.led = bool(summary.get("leader"))
    finally:
        invocation.duration_s = time.monotonic() - invocation.started_s
        invocation.cut_short = stop.is_set()
    return invocation


class Schedule:
    """Starts one invocation every :data:`SCHEDULE_S` seconds, each in its own thread (they may overlap)."""

    def __init__(self, recorder: Recorder, endpoint: str, budget_s: float) -> None:
        self.invocations: list[Invocation] = []
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._start = functools.partial(invoke_handler, recorder=recorder, endpoint=endpoint, budget_s=budget_s)
        self._thread = threading.Thread(target=self._run, name="cost-schedule", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        n = 0
        next_at = time.monotonic()
        while not self.stop.is_set():
            thread = threading.Thread(target=self._invoke, args=(n,), name=f"cost-leader-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
            n += 1
            next_at += SCHEDULE_S
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def _invoke(self, n: int) -> None:
        try:
            self.invocations.append(self._start(n, stop=self.stop))
        except Exception as exc:  # report, keep the schedule going
            print(f"  leader invocation {n} raised: {exc!r}", file=sys.stderr)

    def close(self, timeout_s: float = 30.0) -> None:
        self.stop.set()
        self._thread.join(timeout_s)
        for thread in self._threads:
            thread.join(timeout_s)
