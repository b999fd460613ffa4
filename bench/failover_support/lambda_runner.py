"""EventBridge and Lambda, locally: invoke the real leader handler on a fixed schedule (a child process).

    python -m bench.failover_support.lambda_runner --status FILE [--period-s 60] [--timeout-s 80]

Every ``period`` seconds (drift-free, the first at once) a new invocation starts in its own thread — EventBridge
does not wait for the previous one, so invocations may overlap — with a fake context whose
``get_remaining_time_in_millis`` counts down from the Lambda timeout, a unique ``aws_request_id`` and a
function name. The handler reads its configuration from the environment, as in Lambda (the benchmark sets it).

One status line per invocation start and end is appended (and flushed) to ``--status``::

    START <n> <wall> <request id>
    END <n> <wall> <seconds> leader=<0|1> cycles=<n> error=<text or ->

An invocation that runs past its timeout (a real Lambda would be killed) is marked ``OVERRAN`` in its END line.
The process runs until it is killed (SIGTERM exits at once, as a container that goes away).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import IO, Any

FUNCTION_NAME = "shardlease-failover-leader"


class FakeLambdaContext:
    """What the handler reads from a Lambda context."""

    def __init__(self, timeout_ms: int, request_id: str) -> None:
        self._deadline = time.monotonic() + timeout_ms / 1000
        self.function_name = FUNCTION_NAME
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = 256
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:000000000000:function:{FUNCTION_NAME}"
        self.aws_request_id = request_id
        self.log_group_name = f"/aws/lambda/{FUNCTION_NAME}"
        self.log_stream_name = "local"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


class _Status:
    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            self._file.write(text + "\n")
            self._file.flush()


def _invoke(handler: Callable[[dict[str, Any], Any], Any], n: int, timeout_s: float, status: _Status) -> None:
    request_id = str(uuid.uuid4())
    started = time.time()
    status.line(f"START {n} {started:.6f} {request_id}")
    leader, cycles, error = 0, 0, "-"
    try:
        result = handler(
            {"source": "aws.events", "detail-type": "Scheduled Event", "id": request_id},
            FakeLambdaContext(int(timeout_s * 1000), request_id),
        )
        if isinstance(result, dict):
            leader = int(bool(result.get("leader")))
            cycles = int(result.get("cycles_run", 0))
    except Exception as exc:  # a failed invocation: EventBridge simply invokes again next minute
        error = f"{type(exc).__name__}:{str(exc).splitlines()[0] if str(exc) else ''}".replace(" ", "_")[:200]
    ended = time.time()
    overran = " OVERRAN" if ended - started > timeout_s else ""
    status.line(f"END {n} {ended:.6f} {ended - started:.3f} leader={leader} cycles={cycles} error={error}{overran}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--status", required=True)
    parser.add_argument("--period-s", type=float, default=60.0)
    parser.add_argument("--timeout-s", type=float, default=80.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    status = _Status(args.status)
    from functions.leader.handler import handler  # the real handler, loaded once as in a warm container

    start = time.monotonic()
    n = 0
    while True:
        thread = threading.Thread(
            target=_invoke, args=(handler, n, args.timeout_s, status), name=f"invocation-{n}", daemon=True
        )
        thread.start()
        n += 1
        time.sleep(max(0.0, start + n * args.period_s - time.monotonic()))


if __name__ == "__main__":
    main()
