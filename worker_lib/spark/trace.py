"""Where a micro-batch's time goes: an opt-in trace of the Spark source's work (``bench/spark.py``, debugging).

Off unless ``SHARDLEASE_SPARK_TRACE_DIR`` names a directory. Then every process of the source (the driver's source
runner, each Python worker on an executor) appends one JSON line per step to ``<dir>/<pid>.jsonl``: the driver one
per ``latestOffset`` / ``partitions`` call, a worker one per shard read (a task), each with the AWS calls it made
by operation and table (count, seconds) and the step's own timings. The calls are counted through botocore's
event hooks on the clients the source uses, so stores need no instrumentation. Nothing is recorded of a record's
contents.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from worker_lib.core.env import env_str, environ

TRACE_DIR_VARIABLE = "SHARDLEASE_SPARK_TRACE_DIR"
_START = "shardlease_trace_started"


def trace_dir(env: Mapping[str, str] | None = None) -> str | None:
    return env_str(environ(env), TRACE_DIR_VARIABLE) or None


class CallCounter:
    """AWS calls of the clients attached to it, by ``"<Operation> <table or service>"``: count and seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, list[float]] = {}

    def attach(self, client: Any) -> None:
        events = client.meta.events
        events.register("before-call", self._before)
        events.register("after-call", self._after)
        events.register("after-call-error", self._after)

    def _before(self, context: dict[str, Any], **_: Any) -> None:
        context[_START] = time.perf_counter()

    def _after(self, model: Any, context: dict[str, Any], **kwargs: Any) -> None:
        started = context.pop(_START, None)
        if started is None:
            return
        elapsed = time.perf_counter() - started
        table = str(context.get("shardlease_table") or "") or model.service_model.service_name
        key = f"{model.name} {table}"
        with self._lock:
            entry = self._calls.setdefault(key, [0, 0.0])
            entry[0] += 1
            entry[1] += elapsed

    def take(self) -> dict[str, list[float]]:
        """The calls counted since the last take."""
        with self._lock:
            calls, self._calls = self._calls, {}
        return calls


def _note_table(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    # Name the lease table's family by its suffix only (the application name is the user's, not the trace's).
    table = str(params.get("TableName", ""))
    if not table and params.get("RequestItems"):
        table = str(next(iter(params["RequestItems"])))
    if table:
        suffix = table.rsplit("-", 1)[-1] if "-" in table else ""
        context["shardlease_table"] = suffix if suffix in ("WorkerMetricStats", "CoordinatorState") else "leases"


class Tracer:
    """One process's trace: a :class:`CallCounter` over its clients and a JSON-lines file."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.calls = CallCounter()
        self._lock = threading.Lock()
        self._path = os.path.join(directory, f"{os.getpid()}.jsonl")

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-parameter-build.dynamodb", _note_table)
        self.calls.attach(client)

    def emit(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, "pid": os.getpid(), "at": time.time(), **fields}, sort_keys=True)
        with self._lock, open(self._path, "a", encoding="utf-8") as out:
            out.write(line + "\n")

    @contextmanager
    def step(self, kind: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """Time a step; the caller may add fields to the yielded dict. Calls made since the previous step (by
        background threads: heartbeat, renewals, metrics) are emitted first as a ``between`` line."""
        between = self.calls.take()
        if between:
            self.emit("between", calls=between)
        extra: dict[str, Any] = {}
        started = time.perf_counter()
        try:
            yield extra
        finally:
            self.emit(kind, seconds=time.perf_counter() - started, calls=self.calls.take(), **fields, **extra)


_TRACERS: dict[str, Tracer] = {}
_TRACERS_LOCK = threading.Lock()


def tracer(env: Mapping[str, str] | None = None) -> Tracer | None:
    """This process's tracer, or None when tracing is off."""
    directory = trace_dir(env)
    if directory is None:
        return None
    with _TRACERS_LOCK:
        found = _TRACERS.get(directory)
        if found is None:
            os.makedirs(directory, exist_ok=True)
            found = _TRACERS[directory] = Tracer(directory)
        return found


@contextmanager
def step(kind: str, **fields: Any) -> Iterator[dict[str, Any]]:
    """:meth:`Tracer.step` of this process's tracer; a no-op when tracing is off."""
    active = tracer()
    if active is None:
        yield {}
        return
    with active.step(kind, **fields) as extra:
        yield extra


def event(kind: str, **fields: Any) -> None:
    """One untimed line (e.g. the moment the stream reader was made); a no-op when tracing is off."""
    active = tracer()
    if active is not None:
        active.emit(kind, **fields)


def attach(client: Any) -> Any:
    """Count ``client``'s calls when tracing is on; returns the client."""
    active = tracer()
    if active is not None:
        active.attach(client)
    return client
