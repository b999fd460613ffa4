"""Chaos on the hand-over paths (docs/failover.md): worker heartbeats, the leader's fast path, departures.

Real `shardlease worker` processes on moto with the chaos journal processor, no embedded leaders (leadership is in
``shardlease leader`` processes, or in this process where faults are injected), a steady producer, and the
suite's invariants (tests/support/chaos.py, ``check_journal``): nothing lost; duplicates only after an abnormal
ownership change and only past the new session's start checkpoint; per-session order; overlap of two processes on
one shard within the lease bound. Workers run with the production discovery default (heartbeat on: new leases
arrive by the leader's notice; the index query is only a safety net), so every hand-over below goes through
the notice path.

1. A worker announces its shutdown (SIGTERM) and then hangs in ``shutdown_requested``: it says DEPARTING and keeps
   beating and (in ``lease`` mode) renewing what it holds; the leader gives it nothing while it hangs (not a dead
   worker's leases), and when its shutdown timeout runs out it fences itself, says STOPPED, and its shards move at
   once.
2. A leader SIGKILLed between two fast ticks and replaced at once, with a worker SIGKILLed at the same moment: the
   worker's shards are served again within lock duration + failover + a margin. Then the next leader is killed and
   replaced, and a worker killed under the new one: its fast path moves the shards within failover + a tick or two,
   not at its next full cycle.
3. The leader's fast reads (the Scan of ``<app>-WorkerMetricStats``) throttled persistently, in this process, while
   one worker is SIGKILLed and another stops gracefully: the full cycles keep assigning, the fast path backs off
   (doubling up to the cycle interval, far fewer reads than ticks), and reads again once the throttling ends.
   3b: with the production retry budget, one throttled fast read must not hold the leader loop longer than its
   lock is valid (the read is bounded; the lock never lapses).

Scenarios 1–3 run in each liveness mode (docs/liveness-modes.md), with the same invariants and bounds: ``lease``
(every lease renewed, the heartbeat beside it) and ``worker`` (the heartbeat alone keeps a worker's leases; the
leader judges heartbeating owners per owner). The mode is recorded with ``shardlease liveness --set`` before the first
process starts, every process is configured for it, and each scenario checks that the workers say they run in it.

    SHARDLEASE_CHAOS_SEED=7 .venv/bin/pytest tests/chaos/test_handover_chaos.py -s   # another seed; figures printed
"""

from __future__ import annotations

import itertools
import random
import signal
import time
from pathlib import Path

import pytest

from tests.chaos.conftest import App
from tests.support.chaos import (
    PROCESSOR,
    chaos_seed,
    failover_s,
    fenced_after_stop,
    worker_liveness,
)
from tests.support.chaos_fleet import ChaosFleet
from tests.support.handover import (
    HANG_ENV,
    HANGING_PROCESSOR,
    InProcessLeader,
    OwnerLog,
    throttle_worker_rows_scans,
)
from tests.support.processes import LEADER_TIMINGS, LIVENESS_MODES, liveness_env, shardlease_liveness
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import WorkerState
from worker_lib.leader.config import LeaderLockConfig
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.tables.schema import worker_metrics_table_name
from worker_lib.testing.producers import Producer
from worker_lib.testing.waiting import wait_until
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

SEED = chaos_seed()
SHARDS = 4
FAILOVER_S = 3.0  # SHARDLEASE_FAILOVER_TIME_MS in tests/support/processes.py FAST_ENV
LOCK_S = 3.0  # SHARDLEASE_LEADER_LOCK_DURATION_MS in tests/support/processes.py LEADER_TIMINGS
SKEW_S = 0.5  # SHARDLEASE_MAX_CLOCK_SKEW_MS there
TICK_S = 1.0  # the fast tick's default
NOTICE_S = 1.0  # a worker's heartbeat interval: the leader's notice comes back with its next beat
# A loaded 2-core machine shared with other runs: process start, moto latency, GetShardIterator + INIT line.
MARGIN_S = 4.0
SHUTDOWN_TIMEOUT_S = 25.0  # w1 hangs in shutdown_requested; it fences itself when this runs out

pytestmark = [pytest.mark.slow]

WORKERS = ("w1", "w2", "w3")


def env_for(journal: Path, *, cycle_ms: int, liveness: str) -> dict[str, str]:
    return {
        **liveness_env(liveness),
        **LEADER_TIMINGS,  # lock LOCK_S, skew bound SKEW_S
        "SHARDLEASE_CHAOS_JOURNAL": str(journal),
        "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": str(cycle_ms),  # fast tick: its default, 1 s
        # Balance by lease count: these scenarios are about departures and takeovers, and on a loaded machine the
        # CPU-based default may leave a worker (the victim-to-be) without a shard for longer than a wait allows.
        "SHARDLEASE_ASSIGNMENT_STRATEGY": "count",
        # 0 = the production default: with heartbeats on, new leases arrive by notice (index query every 30 s)
        "SHARDLEASE_DISCOVERY_INTERVAL_MS": "0",
    }


def handover_fleet(app: App, log_dir: Path, *, cycle_s: float, liveness: str) -> ChaosFleet:
    """Workers without embedded leaders (leadership is in `shardlease leader` processes or in the test)."""
    env = env_for(app.journal, cycle_ms=int(cycle_s * 1000), liveness=liveness)
    labels = {"liveness": liveness, "seed": SEED, "cycle_s": cycle_s}
    return app.fleet(log_dir, env, worker_env={"SHARDLEASE_LEADER_MODE": "none"}, labels=labels)


@pytest.fixture(params=LIVENESS_MODES)
def liveness(request: pytest.FixtureRequest) -> str:
    """Scenarios 1–3 run in each liveness mode."""
    return str(request.param)


def start_workers(
    fleet: ChaosFleet, app: App, liveness: str, *, processor: str = PROCESSOR, w1_env: dict[str, str] | None = None
) -> int:
    """Record the application's liveness mode (before any process starts), start w1, w2 and w3 (w1 with
    ``w1_env`` on top) and wait until each beats in that mode; w1's pid."""
    shardlease_liveness(app.name, app.endpoint, target=liveness)
    pids = [fleet.start_chaos_worker(w, processor=processor, env=w1_env if w == "w1" else None) for w in WORKERS]
    assert wait_until(lambda: heartbeating(app.rows, set(WORKERS), liveness), timeout_s=40)
    return pids[0]


def heartbeating(rows: WorkerMetricsStore, worker_ids: set[str], liveness: str) -> bool:
    """Every one of ``worker_ids`` beats, and says it runs in ``liveness`` (the scenario tests the mode it claims)."""
    return set(worker_liveness(rows, worker_ids).values()) == {liveness}


# --- 1. a worker that announces its shutdown and then hangs -------------------------------------------------------


@pytest.mark.timeout(180)
def test_worker_that_departs_and_hangs_gets_nothing_and_its_shards_move(
    app: App, tmp_path: Path, liveness: str
) -> None:
    cycle_s = 4.0
    app.create_stream(SHARDS)
    problems: list[str] = []
    with handover_fleet(app, tmp_path, cycle_s=cycle_s, liveness=liveness) as fleet:
        # GIVEN an application in liveness mode `liveness`, three workers (w1's processor hangs in
        # shutdown_requested) and a leader process, 4 shards, a producer
        hang = {HANG_ENV: "600", "SHARDLEASE_SHUTDOWN_TIMEOUT_MS": str(int(SHUTDOWN_TIMEOUT_S * 1000))}
        victim = start_workers(fleet, app, liveness, processor=HANGING_PROCESSOR, w1_env=hang)  # w2, w3: hang 0
        fleet.start_leader_process("L1")
        with Producer(app.kinesis, app.stream) as producer, OwnerLog(app.store) as owners:
            assert wait_until(lambda: fleet.shards_processed() >= SHARDS, timeout_s=60)
            assert wait_until(lambda: bool(fleet.holding("w1")), timeout_s=30), "w1 never processed a shard"
            held = fleet.holding("w1")
            # WHEN w1 gets SIGTERM: it announces DEPARTING, asks its processors to checkpoint — and they hang
            term_at = fleet.signal("w1", signal.SIGTERM)
            assert wait_until(lambda: _state(app.rows, "w1") is WorkerState.DEPARTING, timeout_s=5), "no DEPARTING"
            departing_seen = time.monotonic()
            beat_then = _beats(app.rows, "w1")
            assert wait_until(lambda: "SHUTDOWN" in {x.kind for x in fleet.lines() if x.pid == victim}, timeout_s=10)
            # WHEN, while w1 hangs (it keeps its leases renewed until its shutdown timeout), a busy worker is
            # SIGKILLed: its leases are up for grabs, and w1 reports fresh metrics — the natural target if DEPARTING
            # were ignored
            assert _beats(app.rows, "w1") > beat_then or wait_until(
                lambda: _beats(app.rows, "w1") > beat_then, timeout_s=3
            ), "the departing worker's heartbeat stopped"
            second = fleet.busy(["w2", "w3"])[0]
            second_pid = fleet.pid(second)
            kill_at = fleet.signal(second, signal.SIGKILL)
            # THEN its shards move to the last active worker through the fast path (heartbeat silent > failover)
            bound_kill = FAILOVER_S + SKEW_S + 2 * TICK_S + NOTICE_S + MARGIN_S
            assert wait_until(lambda: failover_s(fleet.lines(), second_pid, kill_at) is not None, timeout_s=40), (
                f"seed={SEED}: the shards of the killed {second} were not taken over"
            )
            kill_failover = failover_s(fleet.lines(), second_pid, kill_at)
            assert fleet.alive("w1"), "w1 finished its shutdown early: the scenario needs it hanging"
            assert _state(app.rows, "w1") is WorkerState.DEPARTING
            hung_for = time.monotonic() - term_at
            # THEN once its shutdown timeout runs out, w1 fences itself and says STOPPED, and its shards move at
            # once (one tick, one beat) — not after an expiry or a full cycle
            bound_hang = SHUTDOWN_TIMEOUT_S + 2 * TICK_S + NOTICE_S + MARGIN_S
            assert wait_until(lambda: failover_s(fleet.lines(), victim, term_at) is not None, timeout_s=60), (
                f"seed={SEED}: w1's shards {held} were not taken over after its shutdown timeout"
            )
            hang_failover = failover_s(fleet.lines(), victim, term_at)
            assert hang_failover is not None and hang_failover >= SHUTDOWN_TIMEOUT_S - 1.0, (
                f"seed={SEED}: w1's shards moved after {hang_failover} s, before its shutdown timeout: its leases "
                "were not kept while it finished"
            )
            # AND the leader gave the departing worker nothing (a grace of one pass for decisions read before it)
            given = owners.given_to("w1", after=departing_seen + 1.0)
            problems += [f"lease {c.lease_key} given to the departing w1 at +{c.t - term_at:.1f} s" for c in given]
            assert not (owners.owned_by("w1") - held), f"w1 owns {owners.owned_by('w1')}, held {held} at SIGTERM"
            # clean-up: it would hang for another 10 min (and it never finished its shutdown: an abnormal end)
            fleet.signal("w1", signal.SIGKILL)
            producer.stop()
        produced = producer.produced
        remaining = [w for w in ("w2", "w3") if w != second]
        # THEN every produced record is processed
        assert wait_until(lambda: fleet.processed_all(produced), timeout_s=60), f"seed={SEED}: records still missing"
        codes = fleet.stop(remaining)
    verdict = fleet.verdict(produced, lease_bound_s=FAILOVER_S)
    problems += verdict.violations
    # AND the hanging worker journaled nothing on a shard once another process had started on it
    problems += fenced_after_stop(fleet.lines(), victim, term_at)
    fleet.record(
        "handover-departing-hangs",
        verdict,
        producer,
        held_at_sigterm=len(held),
        failover_hang_s=hang_failover,
        failover_kill_s=kill_failover,
        hung_for_s=round(hung_for, 1),
    )
    assert not problems, f"seed={SEED}: {problems[:10]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED}: exit codes {codes}"
    assert hang_failover is not None and hang_failover < bound_hang, f"hang failover {hang_failover} s"
    assert kill_failover is not None and kill_failover < bound_kill, f"kill failover {kill_failover} s"


def _state(rows: WorkerMetricsStore, worker_id: str) -> WorkerState | None:
    row = rows.get(worker_id)
    return row.heartbeat.state if row is not None and row.heartbeat is not None else None


def _beats(rows: WorkerMetricsStore, worker_id: str) -> int:
    row = rows.get(worker_id)
    return row.heartbeat.counter if row is not None and row.heartbeat is not None else -1


# --- 2. a leader killed between two fast ticks ----------------------------------------------------------------


@pytest.mark.timeout(150)
def test_leader_killed_between_fast_ticks_and_replaced_with_a_worker_killed(
    app: App, tmp_path: Path, liveness: str
) -> None:
    rng = random.Random(SEED + 2)
    cycle_s = 15.0  # long: a hand-over within a few seconds of the failover time is the fast path's, not a cycle's
    lock = DynamoDBLeaderLock(app.name, "observer", client=app.ddb)  # reads only: current_leader()
    app.create_stream(SHARDS)
    with handover_fleet(app, tmp_path, cycle_s=cycle_s, liveness=liveness) as fleet:
        # GIVEN an application in liveness mode `liveness`, three workers and a leader process L1 (started once the
        # workers beat, so its first cycle deals all four shards), a producer
        start_workers(fleet, app, liveness)
        fleet.start_leader_process("L1")
        with Producer(app.kinesis, app.stream) as producer:
            assert wait_until(lambda: fleet.shards_processed() >= SHARDS, timeout_s=60)
            assert wait_until(lambda: lock.current_leader() == "L1", timeout_s=10)
            # WHEN L1 is SIGKILLed between two fast ticks, a new leader L2 starts at once, and a busy worker is
            # SIGKILLed at the same moment
            time.sleep(rng.uniform(0.0, TICK_S))  # the phase within a tick; nothing to inject a clock into
            first = fleet.busy(WORKERS)[0]
            first_pid = fleet.pid(first)
            fleet.signal("L1", signal.SIGKILL)
            fleet.start_leader_process("L2")
            kill_a = fleet.signal(first, signal.SIGKILL)
            # THEN its shards are served again within lock duration + failover + a margin (the new leader takes
            # the lock when L1's expires, and judges the silent worker by its own heartbeat stamp at once)
            bound_a = LOCK_S + SKEW_S + FAILOVER_S + NOTICE_S + MARGIN_S
            assert wait_until(lambda: failover_s(fleet.lines(), first_pid, kill_a) is not None, timeout_s=40), (
                f"seed={SEED}: {first}'s shards not taken over after the leader was replaced"
            )
            failover_a = failover_s(fleet.lines(), first_pid, kill_a)
            assert wait_until(lambda: lock.current_leader() == "L2", timeout_s=10)
            # WHEN L2 is killed between two fast ticks in turn and L3 starts at once; once L3 leads, another busy
            # worker is SIGKILLed
            time.sleep(rng.uniform(0.0, TICK_S))
            fleet.signal("L2", signal.SIGKILL)
            fleet.start_leader_process("L3")
            assert wait_until(lambda: lock.current_leader() == "L3", timeout_s=LOCK_S + SKEW_S + 10)
            time.sleep(rng.uniform(0.0, TICK_S))
            survivors = [w for w in WORKERS if w != first]
            second = fleet.busy(survivors)[0]
            second_pid = fleet.pid(second)
            kill_b = fleet.signal(second, signal.SIGKILL)
            # THEN L3's fast path moves its shards within failover + a tick or two — not at L3's next full cycle
            bound_b = FAILOVER_S + SKEW_S + 2 * TICK_S + NOTICE_S + MARGIN_S
            # (full cycles alone would need up to the cycle interval after L3's first one, minus the ≤ 2 s before
            # the kill: more than this bound)
            assert bound_b < cycle_s - 2.0
            assert wait_until(lambda: failover_s(fleet.lines(), second_pid, kill_b) is not None, timeout_s=40), (
                f"seed={SEED}: {second}'s shards not taken over under the new leader"
            )
            failover_b = failover_s(fleet.lines(), second_pid, kill_b)
            producer.stop()
        produced = producer.produced
        last = next(w for w in survivors if w != second)
        assert wait_until(lambda: fleet.processed_all(produced), timeout_s=60), f"seed={SEED}: records still missing"
        assert fleet.holding(last) == {x.shard for x in fleet.lines()}
        codes = fleet.stop([last])
        codes.update(fleet.stop(["L3"], sig=signal.SIGINT))  # the leader CLI releases its lock on SIGINT
    verdict = fleet.verdict(produced, lease_bound_s=FAILOVER_S)
    fleet.record(
        "handover-leader-killed",
        verdict,
        producer,
        failover_leader_and_worker_killed_s=failover_a,
        failover_worker_killed_under_new_leader_s=failover_b,
    )
    assert not verdict.violations, f"seed={SEED}: {verdict.violations[:10]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED}: exit codes {codes}"
    assert failover_a is not None and failover_a < bound_a, f"seed={SEED}: failover {failover_a} s > {bound_a}"
    assert failover_b is not None and failover_b < bound_b, f"seed={SEED}: failover {failover_b} s > {bound_b}"


# --- 3. throttling on the fast reads ------------------------------------------------------------------------------

# AwsConfig.max_attempts=2 gives botocore 2 retries (3 attempts; worker_lib/core/aws.py passes it as botocore's
# `max_attempts`, which counts retries): a throttled call holds the leader loop for at most 1 + 2 s of backoff.
TEST_RETRY_BACKOFF_S = 3.0


def in_process_leader(app: App, *, max_attempts: int, cycle_s: float, liveness: str = "lease") -> InProcessLeader:
    return InProcessLeader(
        app=app.name,
        stream=app.stream,
        aws_config=AwsConfig(
            endpoint_url=app.endpoint, max_attempts=max_attempts, connect_timeout_s=2, read_timeout_s=10
        ),
        kinesis=app.kinesis,
        owner="leader-in-test",
        cycle_ms=int(cycle_s * 1000),
        lock=LeaderLockConfig(
            lease_duration_ms=int(LOCK_S * 1000), heartbeat_interval_ms=1000, max_clock_skew_ms=int(SKEW_S * 1000)
        ),
        failover_ms=int(FAILOVER_S * 1000),
        liveness=liveness,
    )


@pytest.mark.timeout(150)
def test_throttled_fast_reads_fall_back_to_full_cycles_and_never_stop_assigning(
    app: App, tmp_path: Path, liveness: str
) -> None:
    rng = random.Random(SEED + 3)
    cycle_s = 4.0
    app.create_stream(SHARDS)
    # The leader runs in this process, on its own client: that is where the throttling is injected.
    leader = in_process_leader(app, max_attempts=2, cycle_s=cycle_s, liveness=liveness)
    with (
        handover_fleet(app, tmp_path, cycle_s=cycle_s, liveness=liveness) as fleet,
        throttle_worker_rows_scans(leader.ddb, worker_metrics_table_name(app.name), fast_only=True) as throttle,
    ):
        try:
            # GIVEN an application in liveness mode `liveness`, three workers, the leader in this process, 4 shards
            # and a producer
            start_workers(fleet, app, liveness)
            leader.start()
            with Producer(app.kinesis, app.stream) as producer:
                assert wait_until(lambda: fleet.shards_processed() >= SHARDS, timeout_s=60)
                assert wait_until(lambda: len(throttle.fast_calls) >= 2, timeout_s=10), "the fast path never read"
                # WHEN every fast read of the worker rows is throttled (the full cycle's read of the same table
                # is not: it is what must keep going)
                throttle.active.set()
                window_start = time.monotonic()
                assert wait_until(lambda: throttle.throttled > 0, timeout_s=10), "the throttling never hit"
                # AND a busy worker is SIGKILLed
                time.sleep(rng.uniform(0.0, TICK_S))
                first = fleet.busy(WORKERS)[0]
                first_pid = fleet.pid(first)
                kill_at = fleet.signal(first, signal.SIGKILL)
                # THEN the full cycles move its shards: its heartbeat's last value is first seen at one cycle and
                # judged silent at the next one (a throttled tick may delay a cycle by its retries' backoff)
                bound_kill = FAILOVER_S + 2 * cycle_s + TEST_RETRY_BACKOFF_S + NOTICE_S + MARGIN_S
                assert wait_until(lambda: failover_s(fleet.lines(), first_pid, kill_at) is not None, timeout_s=40), (
                    f"seed={SEED}: {first}'s shards not taken over while the fast reads were throttled"
                )
                failover_kill = failover_s(fleet.lines(), first_pid, kill_at)
                # WHEN another busy worker stops gracefully (gives its leases up, announces STOPPED)
                survivors = [w for w in WORKERS if w != first]
                second = fleet.busy(survivors)[0]
                second_pid = fleet.pid(second)
                term_at = fleet.signal(second, signal.SIGTERM)
                # THEN the next full cycle assigns the leases it gave up (once its batch in flight is done, ≤ 1 s)
                bound_term = 1.0 + cycle_s + TEST_RETRY_BACKOFF_S + NOTICE_S + MARGIN_S
                assert wait_until(lambda: failover_s(fleet.lines(), second_pid, term_at) is not None, timeout_s=40), (
                    f"seed={SEED}: {second}'s shards not taken over while the fast reads were throttled"
                )
                failover_term = failover_s(fleet.lines(), second_pid, term_at)
                codes: dict[str, int | None] = {second: fleet.wait(second, timeout_s=40)}
                window_end = time.monotonic()
                throttle.active.clear()
                # AND once the throttling ends, the fast path reads again (within one backoff: at most a cycle)
                recovered_at = time.monotonic()
                assert wait_until(
                    lambda: len(throttle.fast_between(recovered_at, time.monotonic())) >= 3,
                    timeout_s=cycle_s + 3 * TICK_S + MARGIN_S,
                ), f"seed={SEED}: the fast path did not resume after the throttling ended"
                producer.stop()
            produced = producer.produced
            last = next(w for w in survivors if w != second)
            assert wait_until(lambda: fleet.processed_all(produced), timeout_s=60), (
                f"seed={SEED}: records still missing"
            )
            codes.update(fleet.stop([last]))
        finally:
            stopped = leader.stop()
    window_s = window_end - window_start
    fast_reads = throttle.fast_between(window_start, window_end)
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(fast_reads)]
    in_window = leader.between(window_start, window_end)
    full_cycles = [r for r in in_window if r.leader and not r.fast]
    marks = [window_start, *leader.full_cycle_times(window_start, window_end), window_end]
    cycle_gaps = [round(b - a, 2) for a, b in itertools.pairwise(marks)]
    verdict = fleet.verdict(produced, lease_bound_s=FAILOVER_S)
    fleet.record(
        "handover-fast-reads-throttled",
        verdict,
        producer,
        window_s=round(window_s, 1),
        fast_reads_in_window=len(fast_reads),
        fast_read_gaps_s=gaps,
        throttled_attempts=throttle.throttled,
        full_cycles_in_window=len(full_cycles),
        full_cycle_gaps_s=cycle_gaps,
        failed_full_cycles=sum(1 for r in full_cycles if r.error),
        fast_passes_in_window=sum(1 for r in in_window if r.fast),
        failover_kill_s=failover_kill,
        failover_term_s=failover_term,
    )
    # AND every invariant holds (the graceful stop is not abnormal: no duplicate may come from it)
    assert not verdict.violations, f"seed={SEED}: {verdict.violations[:10]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED}: exit codes {codes}"
    assert stopped, "the leader loop did not stop"
    # AND the hand-overs came from the full cycles, within their bounds
    assert failover_kill is not None and failover_kill < bound_kill, f"seed={SEED}: kill failover {failover_kill} s"
    assert failover_term is not None and failover_term < bound_term, f"seed={SEED}: stop failover {failover_term} s"
    assert not any(r.fast for r in in_window), f"seed={SEED}: a fast pass ran although every fast read failed"
    # AND the full cycles kept running, without failing, through the whole window: never further apart than the
    # cycle interval plus a throttled tick's backoff and a margin for the cycle itself
    assert not any(r.error for r in full_cycles), f"seed={SEED}: {[r.error for r in full_cycles if r.error]}"
    assert max(cycle_gaps) < cycle_s + TEST_RETRY_BACKOFF_S + MARGIN_S, f"seed={SEED}: full cycles {cycle_gaps}"
    # AND the fast path backed off: each wait at least the backoff (1, 2, 4 s … capped at the cycle interval;
    # 0.2 s of tolerance for the hook's clock), so far fewer reads than the window has ticks
    for i, gap in enumerate(gaps):
        assert gap >= min(2.0**i, cycle_s) - 0.2, f"seed={SEED}: fast reads {gaps} do not back off"
    assert len(fast_reads) <= window_s / cycle_s + 4, f"seed={SEED}: {len(fast_reads)} fast reads in {window_s:.0f} s"


# --- 3b. the production retry budget on a throttled fast read -------------------------------------------------------


@pytest.mark.timeout(90)
def test_a_throttled_fast_read_does_not_cost_the_leader_its_lock(app: App) -> None:
    """The fast tick runs on the leader loop's thread, between lock heartbeats, with the leader's client and its
    retry budget. With the production default (AwsConfig().max_attempts = 5, i.e. 6 attempts in botocore's standard
    mode) one throttled Scan takes on average ~15 s (up to ~31 s) before FastPath.tick sees the error and backs off;
    meanwhile the lock is not heartbeaten. With the production lock (10 s, 3 s beats) the same run with
    LeaderLockConfig() lost the lock on 2 of 2 throttled reads (blocked 21.7 s and 20.4 s; "leader lock acquired
    (previous holder <itself>)" = a new term each time). Here with the suite's short lock (3 s / 1 s / 0.5 s skew)."""
    app.create_stream(1)
    observer = DynamoDBLeaderLock(app.name, "observer", client=app.ddb)  # reads only
    leader = in_process_leader(app, max_attempts=AwsConfig().max_attempts, cycle_s=4.0)
    lapses: list[str | None] = []
    with throttle_worker_rows_scans(leader.ddb, worker_metrics_table_name(app.name), fast_only=True) as throttle:
        try:
            # GIVEN the leader leading and ticking
            leader.start()
            assert wait_until(lambda: observer.current_leader() == leader.owner, timeout_s=15)
            assert wait_until(lambda: len(throttle.fast_calls) >= 2, timeout_s=10), "the fast path never read"
            # WHEN its fast reads are throttled
            throttle.active.set()
            assert wait_until(lambda: throttle.throttled > 0, timeout_s=10)
            window_start = time.monotonic()
            # THEN it keeps its lock: the lock never looks free or foreign to another contender
            deadline = window_start + LOCK_S + SKEW_S + 3.0
            while time.monotonic() < deadline:
                holder = observer.current_leader()
                if holder != leader.owner:
                    lapses.append(holder)
                time.sleep(0.1)
            throttle.active.clear()
        finally:
            stopped = leader.stop(timeout_s=45)
    new_terms = [
        r
        for r in leader.between(window_start, time.monotonic())
        if r.assignment is not None and not r.fast and r.assignment.run_number == 1
    ]
    assert stopped
    assert not lapses, f"the lock lapsed {len(lapses)} times in {LOCK_S + SKEW_S + 3.0:.1f} s (seen: {set(lapses)})"
    assert not new_terms, f"the leader re-acquired its own lock: {len(new_terms)} new term(s)"
