"""Chaos on the hand-over paths (docs/failover.md): worker heartbeats, the leader's fast path, departures.

Real `shardlease worker` processes on moto with the chaos journal processor, no embedded leaders (leadership is in
``shardlease leader`` processes, or in this process where faults are injected), a steady producer, and the
suite's invariants (tests/support/chaos.py, ``check_journal``): nothing lost; duplicates only after an abnormal
ownership change and only past the new session's start checkpoint; per-session order; one owner at a time (by journal
order, whatever the load). Workers run with the production discovery default (heartbeat on: new leases arrive by
the leader's notice; the index query is only a safety net), so every hand-over below goes through the notice path.

How fast each hand-over was is a recorded figure (``record_figures``), measured by bench/failover.py (kill,
leader, hang); here every wait is a liveness bound derived from the configured timings (``ChaosFleet.timings``,
tests/support/stalls.py): a miss means something hangs, and names how late the machine ran timers meanwhile.

1. A worker announces its shutdown (SIGTERM) and then hangs in ``shutdown_requested``: it says DEPARTING and keeps
   beating and (in ``lease`` mode) renewing what it holds; the leader gives it nothing while it hangs (not a dead
   worker's leases), and when its shutdown timeout runs out it fences itself, says STOPPED, and its shards move.
2. A leader SIGKILLed between two fast ticks and replaced at once, with a worker SIGKILLed at the same moment: the
   worker's shards are served again once the new leader took the lock. Then the next leader is killed and
   replaced, and a worker killed under the new one: the new leader moves its shards (that its fast path does so
   within about a tick of the failover time, not at its next full cycle, is tests/integration/test_fast_path.py's,
   on a manual clock; the seconds here are a figure).
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
from collections.abc import Sequence
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
from tests.support.stalls import eventually, hang_bound_s, stall_note
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import WorkerState
from worker_lib.leader.config import LeaderLockConfig
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.tables.schema import worker_metrics_table_name
from worker_lib.testing.producers import Producer
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

SEED = chaos_seed()
SHARDS = 4
# The in-process leader's settings (scenario 3), as the processes' (tests/support/processes.py FAST_ENV and
# LEADER_TIMINGS); the processes' own come from their environment (ChaosFleet.timings).
FAILOVER_S = 3.0  # SHARDLEASE_FAILOVER_TIME_MS
LOCK_S = 3.0  # SHARDLEASE_LEADER_LOCK_DURATION_MS
SKEW_S = 0.5  # SHARDLEASE_MAX_CLOCK_SKEW_MS
TICK_S = 1.0  # the fast tick's default
LOCK_POLL_S = 1.0  # how often a contender re-reads the lock (LeaderLockConfig's default)
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
    eventually(
        lambda: heartbeating(app.rows, set(WORKERS), liveness),
        bound_s=hang_bound_s(fleet.timings.heartbeat_s),
        what=f"the workers do not all beat in {liveness} mode",
    )
    return pids[0]


def all_shards_processed(fleet: ChaosFleet) -> None:
    """Every shard processed, once the leader (started last) took the free lock and dealt the leases."""
    eventually(
        lambda: fleet.shards_processed() >= SHARDS,
        bound_s=hang_bound_s(fleet.timings.start_s),
        what=f"seed={SEED}: not every shard processed after the start",
    )


def drained(fleet: ChaosFleet, produced: list[str]) -> None:
    """Every produced record processed (a shard may still be in transit after the last kill)."""
    eventually(
        lambda: fleet.processed_all(produced),
        bound_s=hang_bound_s(fleet.timings.silent_worker_s),
        what=f"seed={SEED}: records still missing",
    )


def signal_busy(fleet: ChaosFleet, among: Sequence[str], sig: signal.Signals) -> tuple[str, int, float]:
    """Send ``sig`` to the first of ``among`` that processes a shard; its name, its pid and when it was sent."""
    name = fleet.busy(among)[0]
    pid = fleet.pid(name)
    return name, pid, fleet.signal(name, sig)


def failed_over(fleet: ChaosFleet, pid: int, at: float, *, expected_s: float, what: str) -> float:
    """Wait until every shard ``pid`` was processing at ``at`` has a session in another process — at most the
    liveness bound of ``expected_s`` from ``at`` — and return that failover's seconds (a figure, by the journal)."""
    bound = hang_bound_s(expected_s)
    eventually(
        lambda: failover_s(fleet.lines(), pid, at) is not None,
        bound_s=max(0.0, at + bound - time.monotonic()),
        what=f"seed={SEED}: {what} (liveness bound {bound:.0f} s from the signal)",
    )
    seconds = failover_s(fleet.lines(), pid, at)
    assert seconds is not None
    return seconds


def heartbeating(rows: WorkerMetricsStore, worker_ids: set[str], liveness: str) -> bool:
    """Every one of ``worker_ids`` beats, and says it runs in ``liveness`` (the scenario tests the mode it claims)."""
    return set(worker_liveness(rows, worker_ids).values()) == {liveness}


# --- 1. a worker that announces its shutdown and then hangs -------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.timeout(180)
def test_worker_that_departs_and_hangs_gets_nothing_and_its_shards_move(
    app: App, tmp_path: Path, liveness: str
) -> None:
    cycle_s = 4.0
    app.create_stream(SHARDS)
    problems: list[str] = []
    with handover_fleet(app, tmp_path, cycle_s=cycle_s, liveness=liveness) as fleet:
        t = fleet.timings
        # GIVEN an application in liveness mode `liveness`, three workers (w1's processor hangs in
        # shutdown_requested) and a leader process, 4 shards, a producer
        hang = {HANG_ENV: "600", "SHARDLEASE_SHUTDOWN_TIMEOUT_MS": str(int(SHUTDOWN_TIMEOUT_S * 1000))}
        victim = start_workers(fleet, app, liveness, processor=HANGING_PROCESSOR, w1_env=hang)  # w2, w3: hang 0
        fleet.start_leader_process("L1")
        with Producer(app.kinesis, app.stream) as producer, OwnerLog(app.store) as owners:
            all_shards_processed(fleet)
            eventually(
                lambda: bool(fleet.holding("w1")), bound_s=hang_bound_s(t.start_s), what="w1 never processed a shard"
            )
            held = fleet.holding("w1")
            # WHEN w1 gets SIGTERM: it announces DEPARTING (with its next beat), asks its processors to checkpoint
            # — and they hang (once their batch in flight is done)
            term_at = fleet.signal("w1", signal.SIGTERM)
            eventually(
                lambda: _state(app.rows, "w1") is WorkerState.DEPARTING,
                bound_s=hang_bound_s(t.heartbeat_s),
                what="w1 never said DEPARTING",
            )
            departing_seen = time.monotonic()
            beat_then = _beats(app.rows, "w1")
            eventually(
                lambda: "SHUTDOWN" in {x.kind for x in fleet.lines() if x.pid == victim},
                bound_s=hang_bound_s(t.idle_s),
                what="w1's processors were never asked to shut down",
            )
            # WHEN, while w1 hangs (it keeps its leases renewed until its shutdown timeout), a busy worker is
            # SIGKILLed: its leases are up for grabs, and w1 reports fresh metrics — the natural target if DEPARTING
            # were ignored
            eventually(
                lambda: _beats(app.rows, "w1") > beat_then,
                bound_s=hang_bound_s(t.heartbeat_s),
                what="the departing worker's heartbeat stopped",
            )
            second = fleet.busy(["w2", "w3"])[0]
            second_pid = fleet.pid(second)
            second_held = fleet.holding(second)
            # (whether w1 still departs at the kill, and at its failover, are figures: on a starved machine its
            # shutdown timeout may run out first, and the checks below hold either way)
            departing_at_kill = _state(app.rows, "w1") is WorkerState.DEPARTING
            kill_at = fleet.signal(second, signal.SIGKILL)
            # THEN its shards move to the last active worker through the fast path (heartbeat silent > failover)
            kill_failover = failed_over(
                fleet,
                second_pid,
                kill_at,
                expected_s=t.silent_worker_s,
                what=f"the shards of the killed {second} were not taken over",
            )
            departing_at_kill_failover = _state(app.rows, "w1") is WorkerState.DEPARTING
            assert fleet.alive("w1"), "w1 ended although its processor hangs"
            hung_for = time.monotonic() - term_at
            # THEN once its shutdown timeout runs out, w1 fences itself and says STOPPED, and its shards move (a tick,
            # a beat) — not after an expiry or a full cycle
            hang_failover = failed_over(
                fleet,
                victim,
                term_at,
                expected_s=SHUTDOWN_TIMEOUT_S + 2 * t.pass_s + t.notice_s,
                what=f"w1's shards {held} were not taken over after its shutdown timeout",
            )
            # AND not before it: its leases were kept while it finished (a lower bound: a late machine only makes it
            # later — unless it starved w1 past its failover time, which the message would show)
            assert hang_failover >= SHUTDOWN_TIMEOUT_S - 1.0, (
                f"seed={SEED}: w1's shards moved after {hang_failover} s, before its shutdown timeout: its leases "
                f"were not kept while it finished; {stall_note(term_at)}"
            )
            # AND the leader gave the departing worker nothing: never one of the killed worker's leases (the pass
            # that moves them read the rows after the kill, after DEPARTING), and nothing else once a pass that may
            # have read the rows before DEPARTING was over (a grace of one pass)
            given = owners.given_to("w1", after=kill_at)
            problems += [
                f"the killed {second}'s lease {c.lease_key} given to the departing w1 at +{c.t - term_at:.1f} s"
                for c in given
                if c.lease_key in second_held
            ]
            given = owners.given_to("w1", after=departing_seen + t.pass_s)
            problems += [f"lease {c.lease_key} given to the departing w1 at +{c.t - term_at:.1f} s" for c in given]
            assert not (owners.owned_by("w1") - held), f"w1 owns {owners.owned_by('w1')}, held {held} at SIGTERM"
            # clean-up: it would hang for another 10 min (and it never finished its shutdown: an abnormal end)
            fleet.signal("w1", signal.SIGKILL)
            producer.stop()
        produced = producer.produced
        remaining = [w for w in ("w2", "w3") if w != second]
        # THEN every produced record is processed
        drained(fleet, produced)
        codes = fleet.stop(remaining, timeout_s=fleet.stop_bound_s())
    verdict = fleet.verdict(produced)
    problems += verdict.violations
    # AND the hanging worker journaled nothing on a shard once another process had started on it (but the batch it
    # had in flight)
    problems += fenced_after_stop(fleet.lines(), victim, term_at)
    fleet.record(
        "handover-departing-hangs",
        verdict,
        producer,
        held_at_sigterm=len(held),
        failover_hang_s=hang_failover,
        failover_hang_past_timeout_s=round(hang_failover - SHUTDOWN_TIMEOUT_S, 2),
        failover_kill_s=kill_failover,
        departing_at_kill=departing_at_kill,
        departing_at_kill_failover=departing_at_kill_failover,
        hung_for_s=round(hung_for, 1),
    )
    assert not problems, f"seed={SEED}: {problems[:10]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED}: exit codes {codes}"


def _state(rows: WorkerMetricsStore, worker_id: str) -> WorkerState | None:
    row = rows.get(worker_id)
    return row.heartbeat.state if row is not None and row.heartbeat is not None else None


def _beats(rows: WorkerMetricsStore, worker_id: str) -> int:
    row = rows.get(worker_id)
    return row.heartbeat.counter if row is not None and row.heartbeat is not None else -1


# --- 2. a leader killed between two fast ticks ----------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.timeout(150)
def test_leader_killed_between_fast_ticks_and_replaced_with_a_worker_killed(
    app: App, tmp_path: Path, liveness: str
) -> None:
    rng = random.Random(SEED + 2)
    cycle_s = 15.0  # long: a hand-over within a few seconds of the failover time is the fast path's, not a cycle's
    lock = DynamoDBLeaderLock(app.name, "observer", client=app.ddb)  # reads only: current_leader()
    app.create_stream(SHARDS)
    with handover_fleet(app, tmp_path, cycle_s=cycle_s, liveness=liveness) as fleet:
        t = fleet.timings

        def leads(owner: str) -> None:
            eventually(
                lambda: lock.current_leader() == owner,
                bound_s=hang_bound_s(t.leader_takeover_s),
                what=f"{owner} does not hold the leader lock",
            )

        # GIVEN an application in liveness mode `liveness`, three workers and a leader process L1 (started once the
        # workers beat, so its first cycle deals all four shards), a producer
        start_workers(fleet, app, liveness)
        fleet.start_leader_process("L1")
        with Producer(app.kinesis, app.stream) as producer:
            all_shards_processed(fleet)
            leads("L1")
            # WHEN L1 is SIGKILLed between two fast ticks, a new leader L2 starts at once, and a busy worker is
            # SIGKILLed at the same moment
            time.sleep(rng.uniform(0.0, t.tick_s))  # the phase within a tick; nothing to inject a clock into
            first = fleet.busy(WORKERS)[0]
            first_pid = fleet.pid(first)
            fleet.signal("L1", signal.SIGKILL)
            fleet.start_leader_process("L2")
            kill_a = fleet.signal(first, signal.SIGKILL)
            # THEN its shards are served again once L2 took the lock (when L1's expires) and judged the silent
            # worker by its own heartbeat stamp
            failover_a = failed_over(
                fleet,
                first_pid,
                kill_a,
                expected_s=t.leader_takeover_s + t.silent_worker_s,
                what=f"{first}'s shards not taken over after the leader was replaced",
            )
            leads("L2")
            # WHEN L2 is killed between two fast ticks in turn and L3 starts at once; once L3 leads, another busy
            # worker is SIGKILLed
            time.sleep(rng.uniform(0.0, t.tick_s))
            fleet.signal("L2", signal.SIGKILL)
            fleet.start_leader_process("L3")
            leads("L3")
            time.sleep(rng.uniform(0.0, t.tick_s))
            survivors = [w for w in WORKERS if w != first]
            second, second_pid, kill_b = signal_busy(fleet, survivors, signal.SIGKILL)
            # THEN L3 moves its shards: failover, a tick or two, a notice (how soon is the figure)
            failover_b = failed_over(
                fleet,
                second_pid,
                kill_b,
                expected_s=t.silent_worker_s,
                what=f"{second}'s shards not taken over under the new leader",
            )
            producer.stop()
        produced = producer.produced
        last = next(w for w in survivors if w != second)
        drained(fleet, produced)
        assert fleet.holding(last) == {x.shard for x in fleet.lines()}
        codes = fleet.stop([last], timeout_s=fleet.stop_bound_s())
        # (the leader CLI releases its lock on SIGINT, between two waits: nothing configured to wait for)
        codes.update(fleet.stop(["L3"], sig=signal.SIGINT, timeout_s=hang_bound_s(t.lock_beat_s)))
    verdict = fleet.verdict(produced)
    fleet.record(
        "handover-leader-killed",
        verdict,
        producer,
        failover_leader_and_worker_killed_s=failover_a,
        failover_worker_killed_under_new_leader_s=failover_b,
    )
    assert not verdict.violations, f"seed={SEED}: {verdict.violations[:10]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED}: exit codes {codes}"


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


@pytest.mark.heavy
@pytest.mark.timeout(150)
def test_throttled_fast_reads_fall_back_to_full_cycles_and_never_stop_assigning(
    app: App, tmp_path: Path, liveness: str
) -> None:
    rng = random.Random(SEED + 3)
    cycle_s = 4.0
    app.create_stream(SHARDS)
    # The leader runs in this process, on its own client: that is where the throttling is injected.
    leader = in_process_leader(app, max_attempts=2, cycle_s=cycle_s, liveness=liveness)
    # How long a full cycle may be held up by a throttled tick before it (its retries' backoff)
    full_cycle_s = cycle_s + TEST_RETRY_BACKOFF_S
    with (
        handover_fleet(app, tmp_path, cycle_s=cycle_s, liveness=liveness) as fleet,
        throttle_worker_rows_scans(leader.ddb, worker_metrics_table_name(app.name), fast_only=True) as throttle,
    ):
        t = fleet.timings
        try:
            # GIVEN an application in liveness mode `liveness`, three workers, the leader in this process, 4 shards
            # and a producer
            start_workers(fleet, app, liveness)
            leader.start()
            with Producer(app.kinesis, app.stream) as producer:
                all_shards_processed(fleet)
                eventually(
                    lambda: len(throttle.fast_calls) >= 2,
                    bound_s=hang_bound_s(2 * TICK_S),
                    what="the fast path never read",
                )
                # WHEN every fast read of the worker rows is throttled (the full cycle's read of the same table
                # is not: it is what must keep going)
                throttle.active.set()
                window_start = time.monotonic()
                eventually(
                    lambda: throttle.throttled > 0, bound_s=hang_bound_s(TICK_S), what="the throttling never hit"
                )
                # AND a busy worker is SIGKILLed
                time.sleep(rng.uniform(0.0, TICK_S))  # the phase within a tick
                first, first_pid, kill_at = signal_busy(fleet, WORKERS, signal.SIGKILL)
                # THEN the full cycles move its shards: its heartbeat's last value is first seen at one cycle and
                # judged silent at the next one (a throttled tick may delay a cycle by its retries' backoff)
                failover_kill = failed_over(
                    fleet,
                    first_pid,
                    kill_at,
                    expected_s=FAILOVER_S + SKEW_S + 2 * full_cycle_s + t.notice_s,
                    what=f"{first}'s shards not taken over while the fast reads were throttled",
                )
                # WHEN another busy worker stops gracefully (gives its leases up, announces STOPPED)
                survivors = [w for w in WORKERS if w != first]
                second, second_pid, term_at = signal_busy(fleet, survivors, signal.SIGTERM)
                # THEN the next full cycle assigns the leases it gave up (once its batch in flight is done)
                failover_term = failed_over(
                    fleet,
                    second_pid,
                    term_at,
                    expected_s=t.idle_s + full_cycle_s + t.notice_s,
                    what=f"{second}'s shards not taken over while the fast reads were throttled",
                )
                codes: dict[str, int | None] = {second: fleet.wait(second, timeout_s=fleet.stop_bound_s())}
                window_end = time.monotonic()
                throttle.active.clear()
                # AND once the throttling ends, the fast path reads again (within one backoff: at most a cycle)
                recovered_at = time.monotonic()
                eventually(
                    lambda: len(throttle.fast_between(recovered_at, time.monotonic())) >= 3,
                    bound_s=hang_bound_s(cycle_s + 3 * TICK_S),
                    what=f"seed={SEED}: the fast path did not resume after the throttling ended",
                )
                producer.stop()
            produced = producer.produced
            last = next(w for w in survivors if w != second)
            drained(fleet, produced)
            codes.update(fleet.stop([last], timeout_s=fleet.stop_bound_s()))
        finally:
            stopped = leader.stop()
    window_s = window_end - window_start
    fast_reads = throttle.fast_between(window_start, window_end)
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(fast_reads)]
    in_window = leader.between(window_start, window_end)
    full_cycles = [r for r in in_window if r.leader and not r.fast]
    marks = [window_start, *leader.full_cycle_times(window_start, window_end), window_end]
    cycle_gaps = [round(b - a, 2) for a, b in itertools.pairwise(marks)]
    verdict = fleet.verdict(produced)
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
    # AND the hand-overs came from the full cycles: no fast pass ran while every fast read failed
    assert not any(r.fast for r in in_window), f"seed={SEED}: a fast pass ran although every fast read failed"
    # AND the full cycles kept running, without failing, through the whole window: never further apart than the
    # liveness bound of a cycle held up by a throttled tick's backoff (their gaps are a figure)
    assert not any(r.error for r in full_cycles), f"seed={SEED}: {[r.error for r in full_cycles if r.error]}"
    assert max(cycle_gaps) < hang_bound_s(full_cycle_s), (
        f"seed={SEED}: full cycles {cycle_gaps} (liveness bound {hang_bound_s(full_cycle_s):.0f} s); "
        f"{stall_note(window_start)}"
    )
    # AND the fast path backed off: each wait at least the backoff (1, 2, 4 s … capped at the cycle interval;
    # 0.2 s of tolerance for the hook's clock) — a lower bound, which a late machine only makes easier to meet — so
    # far fewer reads than the window has ticks
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
            eventually(
                lambda: observer.current_leader() == leader.owner,
                bound_s=hang_bound_s(LOCK_POLL_S),
                what="the leader never took the free lock",
            )
            eventually(
                lambda: len(throttle.fast_calls) >= 2, bound_s=hang_bound_s(2 * TICK_S), what="the fast path never read"
            )
            # WHEN its fast reads are throttled
            throttle.active.set()
            eventually(lambda: throttle.throttled > 0, bound_s=hang_bound_s(TICK_S), what="the throttling never hit")
            window_start = time.monotonic()
            # THEN it keeps its lock: the lock never looks free or foreign to another contender, over a watch of
            # the lock's validity and 3 s more (a fixed window, sampled: there is no event to wait for)
            deadline = window_start + LOCK_S + SKEW_S + 3.0
            while time.monotonic() < deadline:
                holder = observer.current_leader()
                if holder != leader.owner:
                    lapses.append(holder)
                time.sleep(0.1)
            throttle.active.clear()
        finally:
            stopped = leader.stop()
    new_terms = [
        r
        for r in leader.between(window_start, time.monotonic())
        if r.assignment is not None and not r.fast and r.assignment.run_number == 1
    ]
    assert stopped
    # (a leader starved past its lock's validity would lapse whatever the fast read does: the probe's view of the
    # watch is in the message)
    assert not lapses, (
        f"the lock lapsed {len(lapses)} times in {LOCK_S + SKEW_S + 3.0:.1f} s (seen: {set(lapses)}); "
        f"{stall_note(window_start)}"
    )
    assert not new_terms, (
        f"the leader re-acquired its own lock: {len(new_terms)} new term(s); {stall_note(window_start)}"
    )
