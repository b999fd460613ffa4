"""`shardlease worker` and `shardlease leader` error contract, as real processes: one line, no traceback."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import (
    GRACEFUL_STOP_S,
    PROCESS_START_S,
    eventually_showing,
    process_group,
    shardlease_run,
)
from tests.support.stalls import hang_bound_s
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.tables.admin import ensure_tables

GOOD_PROCESSOR = "tests.support.journal_processor:JournalProcessor"


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert result.returncode == code, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("no_colon", "invalid processor"),
        ("no_such_module_xyz:Thing", "invalid processor"),
        ("tests.support.journal_processor:Missing", "invalid processor"),
        ("tests.support.journal_processor:read_journal", "invalid processor"),
    ],
)
def test_a_bad_processor_spec_is_one_line_and_exit_2(spec: str, fragment: str) -> None:
    result = shardlease_run("worker", "--app", "good-app", "--stream", "s", "--processor", spec)
    assert_one_line(result, 2, fragment)


def test_a_worker_without_tables_is_one_line_and_exit_1(moto_endpoint: str, app_name: str) -> None:
    result = shardlease_run(
        "worker", "--app", app_name, "--stream", "s", "--processor", GOOD_PROCESSOR, "--endpoint-url", moto_endpoint
    )
    assert_one_line(result, 1, "create-tables")


def test_a_worker_without_its_stream_is_one_line_and_exit_1(moto_endpoint: str, app_name: str) -> None:
    ddb: Any = aws.client("dynamodb", AwsConfig(endpoint_url=moto_endpoint))
    ensure_tables(app_name, ddb)
    result = shardlease_run(
        "worker", "--app", app_name, "--stream", "nope", "--processor", GOOD_PROCESSOR, "--endpoint-url", moto_endpoint
    )
    assert_one_line(result, 1, "stream not found")


def test_a_worker_with_an_unreachable_endpoint_is_one_line_and_exit_1() -> None:
    result = shardlease_run(
        "worker",
        "--app",
        "good-app",
        "--stream",
        "s",
        "--processor",
        GOOD_PROCESSOR,
        "--endpoint-url",
        "http://127.0.0.1:9",
    )
    assert_one_line(result, 1, "cannot reach endpoint")


def test_a_sigterm_while_the_worker_starts_stops_it_with_exit_0(tmp_path: Path) -> None:
    # GIVEN a worker still starting: it waits for an endpoint that does not answer (startup timeout 20 s)
    with process_group(tmp_path) as group:
        group.start_worker(
            "w1",
            app="good-app",
            stream="s",
            processor=GOOD_PROCESSOR,
            endpoint_url="http://127.0.0.1:9",
            env={"SHARDLEASE_STARTUP_TIMEOUT_MS": "20000"},
        )
        eventually_showing(
            lambda: "waiting for" in group.log("w1"),
            bound_s=hang_bound_s(PROCESS_START_S),
            what="the worker waits for its endpoint",
            detail=lambda: group.log("w1"),
        )
        # WHEN it gets SIGTERM (a deployment rolled back, a task stopped before it was up)
        group.signal("w1", signal.SIGTERM)
        # THEN it does not start, and exits 0 without a traceback (a worker that waited out its startup timeout would
        # exit 1, "cannot reach endpoint"; the bound on the wait is liveness only)
        assert group.wait("w1", timeout_s=hang_bound_s(GRACEFUL_STOP_S)) == 0, group.log("w1")
    log = group.log("w1")
    assert "worker stopped before it started id=w1" in log and "Traceback" not in log


def test_the_leader_without_tables_is_one_line_and_exit_1(moto_endpoint: str, app_name: str) -> None:
    result = shardlease_run("leader", "--app", app_name, "--stream", "s", "--once", "--endpoint-url", moto_endpoint)
    assert_one_line(result, 1, "create-tables")
