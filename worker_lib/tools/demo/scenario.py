"""The default demo: a whole fleet on one machine — emulators, leader on a schedule, worker processes, a skewed
producer, scripted failures and resharding, a live view and a closing report that proves nothing was lost.

Timeline (fractions of ``--duration``): 0 start · 0.25 ``kill -9`` a worker · 0.40 add a worker · 0.47 deploy one
worker (its replacement starts, then it gets SIGTERM) · 0.55 split the hottest shard · 0.70 merge the two coldest
adjacent shards · 0.85 stop producing, let the fleet drain, stop. The report gives the failover (kill) and
hand-over (SIGTERM) times: from the signal to the first record of each of its shards processed elsewhere.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import MissingExtraError, ShardleaseError
from worker_lib.leader.assigner import DECISION_LOGGER
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.local import LocalEmulators
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import create_stream, list_all_shards, merge_shards, split_shard
from worker_lib.tools.demo.fleet import (
    DEMO_ENV,
    DecisionCapture,
    DemoState,
    Fleet,
    LeaderSchedule,
    demo_producer,
)
from worker_lib.tools.demo.output import DemoOutput
from worker_lib.tools.demo.report import build_report, read_journals
from worker_lib.tools.demo.view import fleet_rows, read_worker_cpu, render_plain, render_rich

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _workdir(clock: Clock) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="shardlease-demo-"))
    try:
        yield path
    finally:
        # A child killed a moment ago may still have had a file open in it (seen on a loaded machine): a removal
        # racing with it leaves the directory behind, so try again briefly.
        for _ in range(10):
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                break
            clock.sleep(0.2)
        else:
            log.warning("could not remove the demo's working directory %s", path)


def run_fleet_demo(
    *, workers: int, shards: int, duration_s: float, out: DemoOutput, clock: Clock = SYSTEM_CLOCK
) -> int:
    say = out.say
    app = f"demo-{os.getpid()}-{int(clock.wall()) % 100000}"
    stream = f"{app}-stream"
    state = DemoState()
    capture = DecisionCapture(state)
    decisions = logging.getLogger(DECISION_LOGGER)
    decisions.addHandler(capture)
    decisions.setLevel(logging.INFO)
    decisions.propagate = False  # shown in the live view, not as raw log lines
    started = datetime.fromtimestamp(clock.wall(), timezone.utc)
    with _workdir(clock) as workdir:
        local = LocalEmulators(log_dir=workdir).start()
        assert local.moto is not None and local.kinesalite is not None
        moto, kinesalite = local.moto, local.kinesalite
        fleet: Fleet | None = None
        schedule: LeaderSchedule | None = None
        producer: Producer | None = None
        try:
            say(
                f"emulators: moto pid {moto.pid} ({moto.endpoint_url}), kinesalite pid {kinesalite.pid} "
                f"({kinesalite.endpoint_url})"
            )
            say(f"kinesalite from {kinesalite.source}; {moto.source}")
            ddb = aws.client("dynamodb", AwsConfig(endpoint_url=moto.endpoint_url))
            kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesalite.endpoint_url, read_timeout_s=30))
            ensure_tables(app, ddb)
            create_stream(kinesis, stream, shards, clock=clock)
            first = min(list_all_shards(kinesis, stream), key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
            state.hot_range = (
                int(first["HashKeyRange"]["StartingHashKey"]),
                int(first["HashKeyRange"]["EndingHashKey"]),
            )
            say(f"app {app}: tables created, stream with {shards} shards (40 % of traffic into {first['ShardId']})")
            fleet = Fleet(
                app=app, stream=stream, moto=moto, kinesalite=kinesalite, workdir=workdir, state=state, clock=clock
            )
            store = DynamoDBLeaseStore(app, client=ddb)
            schedule = LeaderSchedule(state, fleet.env, period_s=10.0, clock=clock)
            schedule.start()
            for _ in range(workers):
                fleet.add_worker()
            producer = demo_producer(kinesis, stream, state, rate=150, size=1024).start()
            _timeline(fleet, kinesis, stream, store, ddb, state, duration_s, out, clock)
            producer.stop()
            _drain(fleet, state, say, clock)
            fleet.stop_all(graceful=True)
            schedule.stop()
            report = build_report(fleet, state)
            say(f"leader ran as: {schedule.mode}, {schedule.invocations} invocations")
            for line in report.lines():
                say(line)
            say(_dashboard_picture(app, moto.endpoint_url, started=started, clock=clock))
            return 0 if report.ok else 1
        finally:
            # Also the way out of a signal (worker_lib/cli/demo.py turns SIGTERM and SIGHUP into an exception):
            # every child this demo started is stopped here, quickly, before the emulators they talk to.
            if producer is not None:
                producer.stop()
            if fleet is not None:
                fleet.stop_all(graceful=False)
            if schedule is not None:
                schedule.stop(timeout_s=3.0)
            # only now: a leader invocation still running must not print its decisions as raw log lines
            decisions.removeHandler(capture)
            decisions.propagate = True
            local.stop()
            say(f"stopped emulators (pids {moto.pid}, {kinesalite.pid}) and every worker process")


def _dashboard_picture(app: str, endpoint_url: str, *, started: datetime, clock: Clock) -> str:
    """Draw the dashboard from the metrics the run put into moto's CloudWatch; the report line saying where."""
    from worker_lib.tools.dashboard_png import render_dashboard

    target = Path(tempfile.gettempdir()) / f"{app}-dashboard.png"
    cloudwatch = aws.client("cloudwatch", AwsConfig(endpoint_url=endpoint_url))
    end = datetime.fromtimestamp(clock.wall(), timezone.utc)
    try:
        path = render_dashboard(
            cloudwatch, target, namespace=DEMO_ENV["SHARDLEASE_METRICS_NAMESPACE"], app=app, start=started, end=end
        )
    except MissingExtraError as exc:
        return f"dashboard picture: not drawn ({exc})"
    except ShardleaseError as exc:
        return f"dashboard picture: not drawn: {exc}"
    return f"dashboard picture (the dashboard's graphs, from this run's metrics): {path}"


def _drain(fleet: Fleet, state: DemoState, say: Callable[[str], None], clock: Clock) -> None:
    deadline = clock.monotonic() + 60
    while clock.monotonic() < deadline:
        seen = {p.record_id for p in read_journals(fleet.journal_dir)}
        missing = len(set(state.produced()) - seen)
        if missing == 0:
            return
        clock.sleep(1.0)
    say("drain: some records were still unprocessed after 60 s")


def _timeline(  # noqa: PLR0917 - one private call site
    fleet: Fleet,
    kinesis: Any,
    stream: str,
    store: DynamoDBLeaseStore,
    ddb: Any,
    state: DemoState,
    duration_s: float,
    out: DemoOutput,
    clock: Clock,
) -> None:
    start = clock.monotonic()
    steps: list[tuple[float, str, Callable[[], None]]] = [
        (0.25, "kill", lambda: fleet.kill(next(w for w in fleet.workers if w.process.poll() is None))),
        (0.40, "add", lambda: (fleet.add_worker(), None)[1]),
        (0.47, "deploy", lambda: _replace_one(fleet)),
        (0.55, "split", lambda: _split_hot(fleet, kinesis, stream, state, clock)),
        (0.70, "merge", lambda: _merge_cold(fleet, kinesis, stream, state, clock)),
    ]
    pending = list(steps)
    last_plain = -10.0

    def tick(display: Callable[[Any], None] | None) -> None:
        nonlocal last_plain
        elapsed = clock.monotonic() - start
        while pending and elapsed >= pending[0][0] * duration_s:
            _, _, action = pending.pop(0)
            try:
                action()
            except ShardleaseError as exc:
                fleet.event(f"event failed: {exc}")
        try:
            rows, leases = fleet_rows(fleet, store, read_worker_cpu(ddb, fleet.app))
        except ShardleaseError:
            return
        if display is not None:
            display(render_rich(fleet, rows, leases, state, elapsed))
        elif elapsed - last_plain >= 5:
            last_plain = elapsed
            out.say(render_plain(fleet, rows, leases, state, elapsed))

    live = out.live()
    if live is not None:
        with live as update:
            while clock.monotonic() - start < 0.85 * duration_s:
                tick(update)
                clock.sleep(0.5)
    else:
        printed = 0
        while clock.monotonic() - start < 0.85 * duration_s:
            tick(None)
            with state.lock:
                new_events = state.events[printed:]
                printed = len(state.events)
            for _, text in new_events:
                out.say(f"  event: {text}")
            clock.sleep(0.5)


def _replace_one(fleet: Fleet) -> None:
    """A deploy of one worker: its replacement starts, then it is stopped gracefully."""
    victim = next(w for w in fleet.workers if w.process.poll() is None)
    fleet.add_worker()
    fleet.terminate(victim)


def _split_hot(fleet: Fleet, kinesis: Any, stream: str, state: DemoState, clock: Clock) -> None:
    counts = state.produced_per_shard()
    open_shards = [
        s["ShardId"]
        for s in list_all_shards(kinesis, stream)
        if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})
    ]
    hottest = max(open_shards, key=lambda s: counts.get(s, 0))
    split_shard(kinesis, stream, hottest, clock=clock)
    fleet.event(f"split hot shard {hottest}")


def _merge_cold(fleet: Fleet, kinesis: Any, stream: str, state: DemoState, clock: Clock) -> None:
    counts = state.produced_per_shard()
    shards = sorted(
        (s for s in list_all_shards(kinesis, stream) if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})),
        key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]),
    )
    pairs = [
        (a, b)
        for a, b in itertools.pairwise(shards)
        if int(a["HashKeyRange"]["EndingHashKey"]) + 1 == int(b["HashKeyRange"]["StartingHashKey"])
    ]
    if not pairs:
        fleet.event("no adjacent open shards to merge")
        return
    lower, upper = min(pairs, key=lambda p: counts.get(p[0]["ShardId"], 0) + counts.get(p[1]["ShardId"], 0))
    merge_shards(kinesis, stream, lower["ShardId"], upper["ShardId"], clock=clock)
    fleet.event(f"merged cold shards {lower['ShardId']} + {upper['ShardId']}")
