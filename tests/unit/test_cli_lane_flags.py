"""`shardlease worker`'s lane flags (--parallelism, --lane-key) become the worker's ConsumerConfig without writing the
process environment, and a bad one is one line and exit 2 (the worker is a stand-in that records its configuration)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from worker_lib.cli.main import EXIT_OK, EXIT_USAGE, main
from worker_lib.core.models import KinesisRecord

WORKER = ["worker", "--app", "app-x", "--stream", "s", "--processor", "tests.support.chaos:ChaosProcessor"]
NO_IO = ["--endpoint-url", "http://127.0.0.1:9"]  # nothing is reached: the stand-in worker does no I/O


@pytest.fixture
def configs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The configuration of every worker `main` builds (none runs)."""
    made: list[Any] = []

    class RecordingWorker:
        def __init__(self, config: Any, factory: Any, **kwargs: Any) -> None:
            made.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr("worker_lib.worker.worker.Worker", RecordingWorker)
    monkeypatch.setattr("worker_lib.worker.signals.hold_shutdown_signals", lambda: None)
    return made


def test_the_lane_flags_configure_the_worker_without_writing_the_environment(
    configs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an environment with lane settings
    monkeypatch.setenv("SHARDLEASE_PARALLELISM", "2")
    monkeypatch.setenv("SHARDLEASE_MAX_RECORDS_IN_FLIGHT", "300")
    before = dict(os.environ)
    # WHEN `shardlease worker` runs with the lane flags
    flags = ["--parallelism", "8", "--lane-key", "explicit-hash-key"]
    assert main([*WORKER, *flags, *NO_IO]) == EXIT_OK
    # THEN the flags win over the environment, what they do not set is the environment's
    (config,) = configs
    record = KinesisRecord(data=b"", partition_key="p", sequence_number="1", explicit_hash_key="42")
    assert (config.consumer.parallelism, config.consumer.key_of(record)) == (8, "42")
    assert config.consumer.max_records_in_flight == 300
    # AND the process environment is as it was
    assert dict(os.environ) == before


def test_without_lane_flags_the_environment_decides(configs: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN SHARDLEASE_PARALLELISM and no lane flag
    monkeypatch.setenv("SHARDLEASE_PARALLELISM", "4")
    monkeypatch.delenv("SHARDLEASE_LANE_KEY", raising=False)
    # WHEN `shardlease worker` runs THEN the worker has the variable's lanes, keyed by partition key
    assert main([*WORKER, *NO_IO]) == EXIT_OK
    (config,) = configs
    record = KinesisRecord(data=b"", partition_key="p", sequence_number="1", explicit_hash_key="42")
    assert (config.consumer.parallelism, config.consumer.key_of(record)) == (4, "p")


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--parallelism", "0"], "shardlease worker: error: parallelism=0 must be within 1..256"),
        (["--parallelism", "257"], "shardlease worker: error: parallelism=257 must be within 1..256"),
        (
            ["--lane-key", "nope"],
            "shardlease worker: error: invalid lane key 'nope': expected partition-key, explicit-hash-key or a "
            "function module:attr",
        ),
        (
            ["--lane-key", "no.such.module:f"],
            "shardlease worker: error: invalid lane key 'no.such.module:f': no module named 'no'",
        ),
    ],
)
def test_a_lane_flag_that_cannot_work_is_one_line_and_exit_2(
    flags: list[str], line: str, configs: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a lane flag out of range or naming no key WHEN `shardlease worker` starts
    code = main([*WORKER, *flags, *NO_IO])
    # THEN it exits 2 with exactly that line, and no worker is made
    assert (code, capsys.readouterr().err.splitlines(), configs) == (EXIT_USAGE, [line], [])


def test_a_parallelism_that_is_no_number_is_a_one_line_usage_error(
    configs: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN --parallelism x WHEN the command line is parsed
    with pytest.raises(SystemExit) as exit_:
        main([*WORKER, "--parallelism", "x", *NO_IO])
    # THEN argparse exits 2 with one line naming the flag, before anything is built
    assert exit_.value.code == EXIT_USAGE and configs == []
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        line
        == "shardlease worker: error: argument --parallelism: 'x' is not a whole number (see shardlease worker --help)"
    )
