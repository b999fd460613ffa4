"""Session fixtures: real emulators on loopback, started once and stopped by PID.

* ``moto_endpoint``: a moto server (DynamoDB, Kinesis, CloudWatch) — the default backend.
* ``kinesalite_endpoint`` / ``dynalite_endpoint``: the independent emulators, for resharding data flow and
  as a second opinion on moto.
* ``kinesis_local_endpoint``: kinesis-local, the one emulator serving SubscribeToShard (enhanced fan-out), behind
  :class:`~worker_lib.testing.fanout_proxy.FanOutProxy` (subscriptions end after 10 s there, to test renewals).
* ``ddb_endpoint``: parametrised over moto and dynalite (the dynalite half is marked ``dynalite``), for the
  store and lock suites that must hold on both.
* ``app_name``: a fresh application name per test, so tests share a server without sharing tables.
"""

from __future__ import annotations

import itertools
import os
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from worker_lib.core.config import AwsConfig
from worker_lib.testing.emulators import Emulator, start_dynalite, start_kinesalite, start_kinesis_local, start_moto
from worker_lib.testing.fanout_proxy import FanOutProxy

# Emulators accept any credentials; make sure nothing in a test can reach a real account.
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }
)
os.environ.pop("AWS_PROFILE", None)
os.environ.pop("SHARDLEASE_ENDPOINT_URL", None)
# jsii (aws-cdk-lib) prints a multi-line banner about Node 20's end of life on every start; the version is pinned
# by the machine image, the banner is noise in test output.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# A run started in the background by a shell without job control (`cmd &`, as some CI runners do) has SIGINT
# ignored, and child processes inherit an ignored signal: the tests that stop `shardlease leader` or `status --watch`
# with Ctrl-C would wait in vain. A handled SIGINT is reset to its default in a child at exec, so handle it here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_counter = itertools.count()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[Emulator]:
    with start_moto() as emulator:
        yield emulator


@pytest.fixture(scope="session")
def kinesalite_server() -> Iterator[Emulator]:
    with start_kinesalite() as emulator:
        yield emulator


@pytest.fixture(scope="session")
def kinesis_local_proxy() -> Iterator[FanOutProxy]:
    with start_kinesis_local() as emulator, FanOutProxy(emulator.endpoint_url, subscription_s=10.0) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def kinesis_local_endpoint(kinesis_local_proxy: FanOutProxy) -> str:
    return kinesis_local_proxy.endpoint_url


@pytest.fixture(scope="session")
def dynalite_server() -> Iterator[Emulator]:
    with start_dynalite() as emulator:
        yield emulator


@pytest.fixture(scope="session")
def moto_endpoint(moto_server: Emulator) -> str:
    return moto_server.endpoint_url


@pytest.fixture(scope="session")
def kinesalite_endpoint(kinesalite_server: Emulator) -> str:
    return kinesalite_server.endpoint_url


@pytest.fixture(scope="session")
def dynalite_endpoint(dynalite_server: Emulator) -> str:
    return dynalite_server.endpoint_url


@pytest.fixture(params=["moto", pytest.param("dynalite", marks=pytest.mark.dynalite)])
def ddb_endpoint(request: pytest.FixtureRequest) -> str:
    """A DynamoDB endpoint: every test using it runs on moto and again on dynalite."""
    return str(request.getfixturevalue(f"{request.param}_endpoint"))


@pytest.fixture
def moto_aws(moto_endpoint: str) -> AwsConfig:
    return AwsConfig(endpoint_url=moto_endpoint, max_attempts=2, connect_timeout_s=2, read_timeout_s=10)


@pytest.fixture
def ddb_aws(ddb_endpoint: str) -> AwsConfig:
    return AwsConfig(endpoint_url=ddb_endpoint, max_attempts=2, connect_timeout_s=2, read_timeout_s=10)


@pytest.fixture
def app_name() -> str:
    return f"app-{next(_counter)}-{uuid.uuid4().hex[:8]}"


# --- time per test folder (printed at the end of every run; .ci/run's last lines) -------------------------------

_folder_time: dict[str, list[float]] = {}  # folder -> [summed seconds, tests, first start, last stop]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Every phase of every test (also a worker's, replayed in the controller when the run is parallel)."""
    parts = report.nodeid.split("/")
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]
    entry = _folder_time.setdefault(folder, [0.0, 0, float("inf"), 0.0])
    entry[0] += report.duration
    entry[1] += report.when == "call"
    entry[2] = min(entry[2], report.start)
    entry[3] = max(entry[3], report.stop)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _folder_time:
        return
    terminalreporter.write_sep("=", "time per test folder")
    terminalreporter.write_line(f"{'folder':<12} {'tests':>6} {'test time':>10} {'first to last':>14}")
    for folder, (seconds, tests, start, stop) in sorted(_folder_time.items(), key=lambda kv: -kv[1][0]):
        terminalreporter.write_line(f"{folder:<12} {tests:>6} {seconds / 60:>8.1f} m {(stop - start) / 60:>12.1f} m")


# --- parallel runs (pytest-xdist, `-n N --dist loadgroup` in .ci/run) ---------------------------------------------

XDIST_GROUPS = {"chaos": "processes", "e2e": "processes", "spark": "spark", "infra": "infra"}
"""Folders whose tests run one after another on one xdist worker each group: the chaos and end-to-end tests start fleets
of real processes and judge timings (one fleet at a time keeps a 2-core machine from starving them); the Spark tests
share one Spark session, the CDK tests one synth. Everything else is spread over every worker."""


def folder_group(nodeid: str) -> str | None:
    parts = nodeid.split("/")
    return XDIST_GROUPS.get(parts[1]) if len(parts) > 2 and parts[0] == "tests" else None


@pytest.hookimpl(optionalhook=True)  # a run without xdist (`-p no:xdist`) does not know the hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by folder (XDIST_GROUPS). xdist's own grouping (the ``xdist_group`` mark) renames node ids,
    which pytest 9.2 no longer reads, so the scheduler is told the groups directly."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FolderGroups(LoadGroupScheduling):  # type: ignore[misc]  # xdist has no type information
        def _split_scope(self, nodeid: str) -> str:
            return folder_group(nodeid) or nodeid

    return FolderGroups(config, log)
