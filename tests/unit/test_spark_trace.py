"""The Spark source's opt-in trace (worker_lib/spark/trace.py): off by default, one JSON line per step or event."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from worker_lib.spark import trace


def _lines(directory: Path) -> list[dict[str, object]]:
    path = directory / f"{os.getpid()}.jsonl"
    return [json.loads(raw) for raw in path.read_text().splitlines()] if path.exists() else []


def test_nothing_is_written_when_tracing_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN no trace directory in the environment
    monkeypatch.delenv(trace.TRACE_DIR_VARIABLE, raising=False)
    # WHEN a step runs and an event is noted
    with trace.step("latest_offset", batch=3) as noted:
        noted.update(shards=2)
    trace.event("reader_made")
    # THEN no tracer exists and nothing was written anywhere under tmp_path
    assert trace.tracer() is None
    assert list(tmp_path.iterdir()) == []


def test_steps_and_events_are_lines_of_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a trace directory
    monkeypatch.setenv(trace.TRACE_DIR_VARIABLE, str(tmp_path))
    # WHEN an event is noted and a step runs with a field added inside it
    trace.event("reader_made")
    with trace.step("coordinator_start", worker="w") as noted:
        noted.update(leases=4)
    # THEN both are lines of this process's file, in order, the step timed and carrying both fields
    lines = _lines(tmp_path)
    assert [line["kind"] for line in lines] == ["reader_made", "coordinator_start"]
    assert all(line["pid"] == os.getpid() for line in lines)
    step = lines[1]
    assert step["worker"] == "w" and step["leases"] == 4
    assert isinstance(step["seconds"], float) and step["seconds"] >= 0
    assert step["calls"] == {}
