"""`shardlease worker`'s failure-policy flags become the worker's FailureConfig without writing the process
environment (the worker is a stand-in that records its configuration)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from worker_lib import FailureAction
from worker_lib.cli.main import EXIT_OK, main


def test_the_failure_flags_configure_the_worker_without_writing_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN an environment with one failure setting, and a worker that only records its configuration
    monkeypatch.setenv("SHARDLEASE_MAX_ATTEMPTS", "7")
    monkeypatch.setenv("SHARDLEASE_RETRY_BACKOFF_MS", "250")
    configs: list[Any] = []

    class RecordingWorker:
        def __init__(self, config: Any, factory: Any, **kwargs: Any) -> None:
            configs.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr("worker_lib.worker.worker.Worker", RecordingWorker)
    monkeypatch.setattr("worker_lib.worker.signals.hold_shutdown_signals", lambda: None)
    before = dict(os.environ)
    # WHEN `shardlease worker` runs with failure flags
    flags = ["--failure-policy", "stop-shard", "--max-attempts", "4", "--no-bisect"]
    args = ["worker", "--app", "app-x", "--stream", "s", "--processor", "tests.support.chaos:ChaosProcessor"]
    assert main([*args, *flags, "--endpoint-url", "http://127.0.0.1:9"]) == EXIT_OK
    # THEN the flags win over the environment, what they do not set is the environment's
    (config,) = configs
    assert (config.failures.action, config.failures.max_attempts, config.failures.bisects) == (
        FailureAction.STOP_SHARD,
        4,
        False,
    )
    assert config.failures.retry_backoff_ms == 250
    # AND the process environment is as it was
    assert dict(os.environ) == before
