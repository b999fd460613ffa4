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

import bisect
import fcntl
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.support.stalls import PROBE_ENV
from tests.support.stalls import samples as probe_samples
from worker_lib.core.config import AwsConfig
from worker_lib.testing.emulators import Emulator, start_dynalite, start_kinesalite, start_kinesis_local, start_moto
from worker_lib.testing.fanout_proxy import FanOutProxy

pytest_plugins = ["tests.support.postgres"]  # postgres_server, postgres_dsn: a real PostgreSQL (docs/testing.md)

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

# Hypothesis judges speed by default (a 200 ms deadline per example, a "too slow" health check): on a loaded 2-core
# machine that fails tests for the machine's sake. A property test asserts its property, whatever the load.
settings.register_profile("shardlease", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shardlease")

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


# --- the timer probe, the heavy lock, and the run's figures (printed at the end: .ci/run's last lines) ------------

HEAVY_LOCK_ENV = "SHARDLEASE_TEST_HEAVY_LOCK"
_probe: list[subprocess.Popen[bytes]] = []  # the controller's timer probe (none in an xdist worker)


def pytest_configure(config: pytest.Config) -> None:
    """In the controller (or a run without xdist): one timer probe for the whole run, and the heavy lock's file.
    xdist's workers start after this and inherit both variables."""
    if hasattr(config, "workerinput") or os.environ.get(PROBE_ENV):
        return
    run_dir = Path(tempfile.mkdtemp(prefix="shardlease-run-"))
    os.environ[PROBE_ENV] = str(run_dir / "probe.txt")
    os.environ[HEAVY_LOCK_ENV] = str(run_dir / "machine")
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "tests.support.stalls", os.environ[PROBE_ENV]]
    _probe.append(subprocess.Popen(command, cwd=root, start_new_session=True))  # ends with us: it watches its parent


def pytest_unconfigure(config: pytest.Config) -> None:
    for probe in _probe:
        if probe.poll() is None:
            probe.terminate()
            probe.wait(timeout=10)
        shutil.rmtree(Path(os.environ[PROBE_ENV]).parent, ignore_errors=True)


MACHINE_SHARES = 3
"""The machine as three shares: a ``heavy`` test takes two (so two heavy tests never run at once, and one busy test may
run beside a heavy one), a ``busy`` one takes one, a light one none. Chosen from measurement: with heavy tests
exclusive of everything the run took 16 min at a peak load average of 4.7 and 0.1 s of timer lateness; letting one
busy test run beside a heavy one shortens the critical path (the fleets' group) by the Spark group's heavy minutes."""

HEAVY_SHARES = 2

BUSY_FILES = (
    "tests/spark/",  # a Spark session's JVM and its streaming queries
    "tests/chaos/",  # two in-process workers with embedded leaders, and fault injection
)
"""Only tests that judge real time need a share. Building a wheel or synthesizing the CDK app loads the machine but
waits on nothing: gated, they would hold the light tests queued behind them on their xdist worker."""


def machine_shares(item: pytest.Item) -> int:
    """How much of the machine a test takes while it runs (docs/testing.md, "What runs at the same time")."""
    if item.get_closest_marker("heavy") is not None:
        return HEAVY_SHARES
    if item.get_closest_marker("busy") is not None or item.nodeid.startswith(BUSY_FILES):
        return 1
    return 0


def _take_shares(base: str, shares: int) -> list[Any]:
    """Lock ``shares`` of the machine's share files (``<base>.0`` …), waiting as long as it takes. A heavy test takes
    the first two, in order, blocking; a busy test takes whichever is free, the last first (the heavy ones' two are
    then free more often)."""
    files = [open(f"{base}.{n}", "a") for n in range(MACHINE_SHARES)]  # noqa: SIM115  # closed in _give_back
    if shares > 1:
        for f in files[shares:]:
            f.close()
        for f in files[:shares]:
            fcntl.flock(f, fcntl.LOCK_EX)
        return files[:shares]
    while True:
        for n in reversed(range(MACHINE_SHARES)):
            try:
                fcntl.flock(files[n], fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            for other in files[:n] + files[n + 1 :]:
                other.close()
            return [files[n]]
        time.sleep(0.2)


def _give_back(held: list[Any]) -> None:
    for f in held:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: the wait for shares is outside pytest-timeout's timer
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A ``heavy`` test (a fleet of processes, a Spark cluster or Connect server) never runs beside another heavy test,
    and beside at most one ``busy`` test (a Spark session's query, an in-process chaos rig), whatever xdist worker
    each is on; light tests go on beside any of them."""
    base = os.environ.get(HEAVY_LOCK_ENV)
    shares = machine_shares(item)
    if not shares or not base:
        yield
        return
    asked = time.monotonic()
    held = _take_shares(base, shares)
    item.user_properties.append(("share_wait_s", round(time.monotonic() - asked, 1)))
    try:
        yield
    finally:
        _give_back(held)


_folder_time: dict[str, list[float]] = {}  # folder -> [summed seconds, tests, first start, last stop]
_spans: list[tuple[float, float, str]] = []  # (wall start, wall stop, node id) of every test's call phase
_heavy_wait: list[float] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Every phase of every test (also a worker's, replayed in the controller when the run is parallel)."""
    parts = report.nodeid.split("/")
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]
    entry = _folder_time.setdefault(folder, [0.0, 0, float("inf"), 0.0])
    entry[0] += report.duration
    entry[1] += report.when == "call"
    entry[2] = min(entry[2], report.start)
    entry[3] = max(entry[3], report.stop)
    if report.when == "call":
        _spans.append((report.start, report.stop, report.nodeid))
    if report.when == "setup":
        _heavy_wait.extend(float(str(v)) for k, v in report.user_properties if k == "share_wait_s")


def _probe_samples() -> list[tuple[float, float, float, float]]:
    """(wall time, timer lateness, load average, small task's wall time) of every probe sample, in time order."""
    path = os.environ.get(PROBE_ENV)
    return [(wall, late, load, work) for _, wall, late, load, work in probe_samples(Path(path))] if path else []


def _worst(samples: list[tuple[float, float, float, float]], start: float, stop: float) -> tuple[float, float, float]:
    """The longest timer lateness, highest load average and longest small task sampled between two wall times."""
    first = bisect.bisect_left(samples, start, key=lambda s: s[0])
    window = samples[first : bisect.bisect_right(samples, stop, lo=first, key=lambda s: s[0])]
    return (
        max((s[1] for s in window), default=0.0),
        max((s[2] for s in window), default=0.0),
        max((s[3] for s in window), default=0.0),
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _folder_time:
        return
    samples = _probe_samples()
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", "time per test folder, and how late the machine ran timers meanwhile")
    header = f"{'folder':<12} {'tests':>6} {'test time':>10} {'first to last':>14} {'timer late':>11} {'load':>6}"
    write(f"{header} {'5 ms task':>10}")
    for folder, (seconds, tests, start, stop) in sorted(_folder_time.items(), key=lambda kv: -kv[1][0]):
        late, load, work = _worst(samples, start, stop)
        write(
            f"{folder:<12} {tests:>6} {seconds / 60:>8.1f} m {(stop - start) / 60:>12.1f} m {late:>9.2f} s {load:>6.1f}"
            f" {work * 1000:>7.0f} ms"
        )
    if samples:
        late, load, work = _worst(samples, samples[0][0], samples[-1][0])
        write(
            f"whole run: longest timer lateness {late:.2f} s, peak load average {load:.1f}, a 5 ms task took up to "
            f"{work * 1000:.0f} ms ({len(samples)} probe samples)"
        )
        by_test = sorted(((_worst(samples, a, b)[0], n) for a, b, n in _spans), reverse=True)
        worst = [(t, n) for t, n in by_test[:5] if t]
        if worst:
            write("longest timer lateness seen during: " + "; ".join(f"{n} ({t:.2f} s)" for t, n in worst))
    if _heavy_wait:
        waited, longest = sum(_heavy_wait) / 60, max(_heavy_wait)
        write(f"heavy and busy tests waited {waited:.1f} m in all for their share (longest {longest:.0f} s)")


# --- parallel runs (pytest-xdist, `-n N --dist loadgroup` in .ci/run) ---------------------------------------------

XDIST_GROUPS = {
    "tests/chaos/": "chaos",
    "tests/e2e/": "e2e",
    "tests/integration/test_autoscale_fleet.py": "e2e",
    "tests/spark/": "spark",
    "tests/infra/": "infra",
}
"""Tests that run one after another on one xdist worker, each group: the chaos fleets and rigs, the end-to-end fleets
(almost all heavy or busy: spread over every worker they would only wait for each other's shares while light tests
queue behind them), the Spark tests (one Spark session), the CDK tests (one synth). Everything else is spread over
every worker. What may run at the same time across groups is decided by each test's share of the machine
(:func:`machine_shares`): a chaos rig goes on beside an end-to-end fleet, as a Spark query beside a chaos fleet."""


def folder_group(nodeid: str) -> str | None:
    return next((group for prefix, group in XDIST_GROUPS.items() if nodeid.startswith(prefix)), None)


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
