"""The demo's fleet: worker processes (started, killed with ``kill -9``, stopped gracefully with SIGTERM, on a
:class:`~worker_lib.testing.ProcessFleet`), the skewed producer (a :class:`~worker_lib.testing.Producer`) and the
leader on a local schedule (the real Lambda handler, invoked as EventBridge would). The scenario that drives
them, and its timeline, are in scenario.py.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import signal
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker_lib.core.clock import Clock
from worker_lib.core.errors import ShardleaseError
from worker_lib.testing.emulators import Emulator
from worker_lib.testing.processes import FleetProcess, ProcessFleet
from worker_lib.testing.producers import Producer
from worker_lib.testing.timings import FAST_TIMINGS
from worker_lib.tools.demo.processor import JOURNAL_ENV, WORK_ENV

log = logging.getLogger(__name__)

HASH_SPACE = 2**128

# Demo timings: everything ~5x faster than production defaults so that a failover is visible in seconds.
DEMO_ENV = {
    **FAST_TIMINGS,
    "SHARDLEASE_CPU_METRIC": "process",  # several workers on one host: each reports its own share
    "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",  # the producer starts before the leases exist
    "SHARDLEASE_AWS_MAX_ATTEMPTS": "3",
    # Metrics to the local CloudWatch (moto) every 5 s: the report draws the dashboard from them.
    "SHARDLEASE_METRICS": "cloudwatch",
    "SHARDLEASE_METRICS_FLUSH_INTERVAL_MS": "5000",
    "SHARDLEASE_METRICS_NAMESPACE": "shardlease-demo",
}


@dataclass
class DemoState:
    """What the live view and the report read; written by the producer, the leader thread and the timeline."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    producer: Producer | None = None
    events: list[tuple[float, str]] = field(default_factory=list)
    decisions: deque[str] = field(default_factory=lambda: deque(maxlen=8))
    leader_reports: list[dict[str, Any]] = field(default_factory=list)
    hot_range: tuple[int, int] = (0, 0)

    def produced(self) -> dict[str, str]:
        """Record id -> the shard it landed in, for every record produced so far."""
        placed = self.producer.placed() if self.producer is not None else {}
        return {rid: put.shard_id for rid, put in placed.items()}

    def produced_count(self) -> int:
        return len(self.producer.produced) if self.producer is not None else 0

    def produced_per_shard(self) -> Counter[str]:
        return self.producer.per_shard() if self.producer is not None else Counter()


def skewed_hash_keys(hot_range: tuple[int, int], *, hot_share: float = 0.4, seed: int = 7) -> Callable[[int], str]:
    """Hash keys for the producer: ``hot_share`` of the records into ``hot_range`` (one shard's), the rest spread
    over the whole key space."""
    rng = random.Random(seed)
    low, high = hot_range

    def key(_: int) -> str:
        if rng.random() < hot_share:
            return str(rng.randrange(low, high + 1))
        return str(rng.randrange(0, HASH_SPACE))

    return key


def demo_producer(kinesis: Any, stream: str, state: DemoState, *, rate: int, size: int) -> Producer:
    """Skewed traffic of ``rate`` records/s of ``size`` bytes (``<id>|xxx…``, the id the processor journals), put
    every 0.1 s; :class:`DemoState` reads what was produced from it."""
    producer = Producer(
        kinesis,
        stream,
        per_tick=max(1, rate // 10),
        tick_s=0.1,
        hash_keys=skewed_hash_keys(state.hot_range),
        payload_bytes=size,
        name="demo-producer",
    )
    state.producer = producer
    return producer


class DecisionCapture(logging.Handler):
    def __init__(self, state: DemoState) -> None:
        super().__init__(level=logging.INFO)
        self.state = state

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = json.loads(record.getMessage())
        except ValueError:
            return
        line = (
            f"{fields.get('kind', '?')}: {fields.get('lease', '?')} {fields.get('from') or '-'} → "
            f"{fields.get('to', '?')} ({fields.get('reason', '')})"
        )
        with self.state.lock:
            self.state.decisions.append(line)


# --- the fleet -------------------------------------------------------------------------------------------------


class Fleet:
    """The demo's worker processes, ``demo-w1``, ``demo-w2``, …; times are wall times (``clock.wall()``), as the
    workers journal."""

    def __init__(
        self,
        *,
        app: str,
        stream: str,
        moto: Emulator,
        kinesalite: Emulator,
        workdir: Path,
        state: DemoState,
        clock: Clock,
    ) -> None:
        self.app, self.stream = app, stream
        self.moto, self.kinesalite = moto, kinesalite
        self.workdir, self.state, self.clock = workdir, state, clock
        self.journal_dir = workdir / "journal"
        self.journal_dir.mkdir()
        self.processes = ProcessFleet(workdir, clock=clock, wall_times=True)
        self.stopping_at: float | None = None  # the final stop: signals from then on are not scenario events
        self.env = {
            **DEMO_ENV,
            "SHARDLEASE_APP": app,
            "SHARDLEASE_STREAM": stream,
            "SHARDLEASE_DYNAMODB_ENDPOINT_URL": moto.endpoint_url,
            "SHARDLEASE_CLOUDWATCH_ENDPOINT_URL": moto.endpoint_url,
            "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesalite.endpoint_url,
            JOURNAL_ENV: str(self.journal_dir),
            WORK_ENV: "1500",
        }

    @property
    def workers(self) -> list[FleetProcess]:
        return list(self.processes.processes.values())

    def event(self, text: str) -> None:
        with self.state.lock:
            self.state.events.append((self.clock.wall(), text))

    def _scenario_signal(self, worker: FleetProcess, signal_name: str) -> float | None:
        at = worker.sent(signal_name)
        return at if at is not None and (self.stopping_at is None or at < self.stopping_at) else None

    def killed_at(self, worker: FleetProcess) -> float | None:
        """When the scenario killed it (``kill -9``), if it did."""
        return self._scenario_signal(worker, "SIGKILL")

    def terminated_at(self, worker: FleetProcess) -> float | None:
        """When the scenario stopped it gracefully (SIGTERM, as a deploy or a scale-in sends), if it did."""
        return self._scenario_signal(worker, "SIGTERM")

    def add_worker(self) -> FleetProcess:
        name = f"demo-w{len(self.workers) + 1}"
        worker = self.processes.start_worker(
            name,
            app=self.app,
            stream=self.stream,
            processor="worker_lib.tools.demo.processor:DemoProcessor",
            env={**os.environ, **self.env},
        )
        self.event(f"started worker {name} (pid {worker.pid})")
        return worker

    def kill(self, worker: FleetProcess) -> None:
        self.processes.kill(worker.name)
        self.event(f"kill -9 {worker.name} (pid {worker.pid})")

    def terminate(self, worker: FleetProcess) -> None:
        """A graceful stop (SIGTERM), as every deploy and scale-in sends: the worker announces its departure,
        checkpoints and gives its leases up; the leader hands them over within about a second."""
        self.processes.signal(worker.name, signal.SIGTERM, group=True)
        self.event(f"SIGTERM {worker.name} (pid {worker.pid}): graceful stop")
        if self.processes.wait(worker.name, timeout_s=20) is None:
            self.event(f"{worker.name} did not stop within 20 s")

    def stop_all(self, *, graceful: bool) -> None:
        """SIGTERM every worker still running and wait 20 s each (then kill it), or kill them at once."""
        if self.stopping_at is None:
            self.stopping_at = self.clock.wall()
        if graceful:
            for name, code in self.processes.stop(timeout_s=20).items():
                if code is None:
                    self.processes.kill(name)
        self.processes.close()


# --- the leader on a schedule ------------------------------------------------------------------------------------


class _FakeLambdaContext:
    """What the handler reads from a Lambda context."""

    def __init__(self, budget_ms: int, clock: Clock) -> None:
        self._deadline = clock.monotonic() + budget_ms / 1000
        self._clock = clock
        self.function_name = "shardlease-demo-leader"
        self.memory_limit_in_mb = 256
        self.invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:shardlease-demo-leader"
        self.aws_request_id = "demo"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self._clock.monotonic()) * 1000))


def _load_lambda_handler(env: Mapping[str, str]) -> Callable[[Any], Any]:
    """The real Lambda handler's invocation, from the installed package (as the CDK construct deploys it), given
    its environment as a mapping (Lambda gives each function its own) and logging without Powertools' JSON."""
    from worker_lib.leader import lambda_handler
    from worker_lib.leader.observers import LoggingObserver

    quiet = LoggingObserver(powertools_expected=False)
    return functools.partial(lambda_handler.invoke, env=env, observing=quiet)


class _OnlyMainThread(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName == threading.main_thread().name


class LeaderSchedule:
    """EventBridge, locally: invoke the leader every ``period_s``; each invocation leads until its deadline."""

    def __init__(self, state: DemoState, env: dict[str, str], *, period_s: float, clock: Clock) -> None:
        self.state, self.env, self.period_s, self.clock = state, env, period_s, clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-leader-schedule", daemon=True)
        self.invocations = 0
        self.mode = "?"

    def start(self) -> None:
        self._thread.start()

    def handler_environment(self) -> dict[str, str]:
        """The leader function's environment: this process's with the fleet's settings over it."""
        return {**os.environ, "SHARDLEASE_PER_WORKER_METRICS": "false", **self.env}

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop scheduling; wait up to ``timeout_s`` for the running invocation (it leads until its deadline).

        The thread is a daemon: when the demo is stopped by a signal it waits briefly and the invocation, whose
        emulators are stopped next, ends with the process."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            # the invocation is abandoned (it ends with the process); what it says next about the emulators
            # going away is noise, not news
            for handler in logging.getLogger().handlers:
                handler.addFilter(_OnlyMainThread())

    def _run(self) -> None:
        try:
            handler: Callable[[Any], Any] | None = _load_lambda_handler(self.handler_environment())
        except Exception as exc:  # a broken checkout must not stop the demo: run the same Leader in-process
            log.warning("could not load functions/leader/handler.py (%s); running the leader in-process", exc)
            handler = None
        self.mode = "Lambda handler" if handler is not None else "in-process leader"
        while not self._stop.is_set():
            budget_ms = int(self.period_s * 1000)
            try:
                if handler is not None:
                    result = handler(_FakeLambdaContext(budget_ms, self.clock))
                else:
                    result = _run_in_process_leader(budget_ms, self.clock, self.handler_environment())
                self.invocations += 1
                if isinstance(result, dict):
                    with self.state.lock:
                        self.state.leader_reports.append(result)
            except ShardleaseError as exc:
                if not self._stop.is_set():  # failures after a stop are the emulators going away
                    log.warning("leader invocation failed: %s", exc)
            except Exception:
                if not self._stop.is_set():
                    log.exception("leader invocation raised")
            self._stop.wait(0.2)


def _run_in_process_leader(budget_ms: int, clock: Clock, env: Mapping[str, str]) -> dict[str, Any]:
    from worker_lib.leader.factory import build_leader_from_env

    parts = build_leader_from_env(env)
    deadline = clock.monotonic() + budget_ms / 1000
    reports = parts.leader.run(deadline_monotonic=deadline)
    return {"cycles": [r.to_dict() for r in reports]}
