"""How a leader invocation reports when Powertools (an optional extra) is missing."""

from __future__ import annotations

import logging
import sys

import pytest

from worker_lib.leader.cycle_metrics import run_outcome
from worker_lib.leader.leader import CycleReport
from worker_lib.leader.observers import LoggingObserver, make_observer


def test_given_no_powertools_then_the_observer_logs_through_logging(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN aws_lambda_powertools cannot be imported
    monkeypatch.setitem(sys.modules, "aws_lambda_powertools", None)
    monkeypatch.setattr(LoggingObserver, "_warned", False)
    # WHEN the handler's observer is made and one invocation reports a cycle
    observer = make_observer()
    assert isinstance(observer, LoggingObserver)

    def handler() -> str:
        return "ran"

    assert observer.wrap(handler) is handler  # no tracer around the handler
    caplog.set_level(logging.INFO, logger="worker_lib.leader.observers")
    report = CycleReport(cycle=1, owner="o", leader=False, current_leader="other")
    invocation = observer.begin({}, app="app", stream="s", owner="o")
    invocation.cycle(report)
    invocation.end(run_outcome([report], owner="o"))
    # THEN it says once that metrics are not published, and logs the cycle and the invocation's end
    messages = [r.getMessage() for r in caplog.records]
    assert sum("not published" in m for m in messages) == 1
    assert "leader cycle" in messages and "leader invocation done" in messages
    done = next(r for r in caplog.records if r.getMessage() == "leader invocation done")
    assert done.__dict__["current_leader"] == "other" and done.__dict__["application"] == "app"
