"""A real in-process Worker in ``worker`` liveness mode against moto (docs/liveness-modes.md): it holds leases without
renewing them while its heartbeat runs at the mode's interval, hands a lease over when the leader asks on its own
item, follows a switch of the stored mode in both directions, refuses to start in the other mode, and writes a
lease's throughput only when it changed, without moving the counter.

Worker tests run on real time (the worker's threads sleep on the system clock): their waits are liveness bounds
derived from the timings below (tests/support/stalls.py), and what they say about a heartbeat's silences is stated
with the sampling's own gaps counted, so that a slow machine cannot make it pass or fail; the lease holder's
throughput test runs on a manual clock.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from tests.support.recording import recording_worker, stream_with_leases
from tests.support.stalls import eventually, hang_bound_s, stall_note
from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import EndpointUnreachableError
from worker_lib.core.models import Lease
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.leases.heartbeat import HeartbeatLoop
from worker_lib.leases.mode import LivenessMode, LivenessModeMismatchError, StoredMode, handoff_request
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.testing.streams import create_stream
from worker_lib.worker.worker import Worker
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

# Failover 6 s: the worker-mode beat is 2 s (its default), the lease-mode beat 1 s, renewals every 1.975 s.
FAILOVER_MS = 6_000
MODE_CHECK_MS = 1_000
WORKER_BEAT_S, RENEWAL_S = 2.0, 1.975
# Liveness bounds: a worker's start-up (first beat, discovery) and a few of its beats; a mode switch is seen within a
# check interval and shown in a beat; a renewal
BEATS_BOUND_S = hang_bound_s(2 * WORKER_BEAT_S)
SWITCH_BOUND_S = hang_bound_s(MODE_CHECK_MS / 1000 + WORKER_BEAT_S)
RENEWAL_BOUND_S = hang_bound_s(RENEWAL_S)


def modes(app: str, ddb: Any) -> LivenessModeStore:
    return LivenessModeStore(CoordinatorStateStore(app, client=ddb))


def make_worker(app: str, stream: str, ddb: Any, kinesis: Any, *, setting: str) -> Worker:
    lease = LeaseConfig(failover_time_ms=FAILOVER_MS, liveness_mode=setting, mode_check_interval_ms=MODE_CHECK_MS)
    return recording_worker(app, stream, ddb=ddb, kinesis=kinesis, lease=lease, report_worker_metrics=False)


def counters(app: str, ddb: Any) -> dict[str, int]:
    return {lease.lease_key: lease.lease_counter for lease in DynamoDBLeaseStore(app, client=ddb).list_leases()}


def beat(app: str, ddb: Any) -> tuple[int, int, str | None]:
    row = WorkerMetricsStore(app, client=ddb).get("w1")
    assert row is not None and row.heartbeat is not None
    return row.heartbeat.counter, row.heartbeat.interval_ms, row.heartbeat.liveness


def test_a_worker_mode_worker_holds_its_leases_without_renewing_them(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN an application in worker mode and two leases assigned to w1
    modes(app_name, ddb).record_if_absent(LivenessMode.WORKER, by="test")
    _, _, keys = stream_with_leases(app_name, ddb, kinesis, 2, owner="w1")
    keys.sort()
    # WHEN w1 (configured for worker mode) runs
    worker = make_worker(app_name, f"{app_name}-s", ddb, kinesis, setting="worker")
    workers.append(worker)
    worker.start()
    eventually(lambda: worker.held_leases == keys, bound_s=BEATS_BOUND_S, what="w1 holds both leases")
    taken = counters(app_name, ddb)
    beats_before, watched = beat(app_name, ddb)[0], time.monotonic()
    time.sleep(5)  # two and a half renewer intervals of lease mode (a window watched: not a bound)
    # THEN no lease counter moved, while its heartbeat beat at its 2 s interval (at most once per interval, and one
    # more, whatever the machine's speed) and says it runs in worker mode
    assert counters(app_name, ddb) == taken
    beats_after, interval_ms, liveness = beat(app_name, ddb)
    assert beats_after - beats_before <= (time.monotonic() - watched) / WORKER_BEAT_S + 1
    assert (interval_ms, liveness) == (2_000, "worker")
    assert worker.held_leases == keys
    # AND it keeps beating (liveness)
    eventually(lambda: beat(app_name, ddb)[0] >= beats_before + 2, bound_s=BEATS_BOUND_S, what="two more beats")


def test_a_handoff_asked_for_on_the_workers_item_is_completed(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN a worker-mode worker holding one lease
    modes(app_name, ddb).record_if_absent(LivenessMode.WORKER, by="test")
    _, _, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    worker = make_worker(app_name, f"{app_name}-s", ddb, kinesis, setting="worker")
    workers.append(worker)
    worker.start()
    eventually(lambda: worker.held_leases == [key], bound_s=BEATS_BOUND_S, what="w1 holds the lease")
    # WHEN the leader hands it to w2: leaseOwner = w2, checkpointOwner = w1, and the request on w1's item
    store = DynamoDBLeaseStore(app_name, client=ddb)
    rows = WorkerMetricsStore(app_name, client=ddb)
    lease = store.get_lease(key)
    assert lease is not None and store.initiate_graceful_handoff(lease, "w2") is not None
    assert rows.request_handoff("w1", [handoff_request(key, 30_000)])
    # THEN within a few beats w1 lets go: w2 owns the lease outright, w1 holds nothing
    eventually(lambda: worker.held_leases == [], bound_s=BEATS_BOUND_S, what="w1 let go")
    after = store.get_lease(key)
    assert after is not None and (after.lease_owner, after.checkpoint_owner) == ("w2", None)

    # AND its next beat removed the request from its item
    def requests_left() -> tuple[str, ...]:
        row = rows.get("w1")
        assert row is not None
        return row.handoff_requests

    eventually(lambda: requests_left() == (), bound_s=BEATS_BOUND_S, what="the request removed")


def test_an_auto_worker_follows_a_switch_in_both_directions(
    ddb: Any, kinesis: Any, app_name: str, workers: list[Worker]
) -> None:
    # GIVEN an application in lease mode and an auto worker holding its lease, renewing it
    store = modes(app_name, ddb)
    store.record_if_absent(LivenessMode.LEASE, by="test")
    _, _, (key,) = stream_with_leases(app_name, ddb, kinesis, 1, owner="w1")
    worker = make_worker(app_name, f"{app_name}-s", ddb, kinesis, setting="auto")
    workers.append(worker)
    worker.start()
    eventually(lambda: worker.held_leases == [key], bound_s=BEATS_BOUND_S, what="w1 holds the lease")
    first = counters(app_name, ddb)[key]
    eventually(lambda: counters(app_name, ddb)[key] > first, bound_s=RENEWAL_BOUND_S, what="a renewal")
    # WHEN the application switches to worker mode (asked, then completed as the leader would)
    lease_mode = StoredMode(mode=LivenessMode.LEASE)
    assert store.request(LivenessMode.WORKER, expected=lease_mode, by="test")
    assert store.complete(StoredMode(mode=LivenessMode.LEASE, target=LivenessMode.WORKER), by="test")
    # THEN within its check interval (1 s) and a beat it says worker and stops renewing
    eventually(lambda: beat(app_name, ddb)[2] == "worker", bound_s=SWITCH_BOUND_S, what="its beat says worker")
    time.sleep(0.5)  # a renewal already in flight lands (a fixed sleep, not a bound)
    stopped = counters(app_name, ddb)[key]
    time.sleep(4.5)  # more than two renewal intervals watched (not a bound)
    assert counters(app_name, ddb)[key] == stopped
    # WHEN lease mode is asked for again
    assert store.request(LivenessMode.LEASE, expected=StoredMode(mode=LivenessMode.WORKER), by="test")
    # THEN it renews again and its beats say so (what lets the leader complete the switch), holding the lease all along
    eventually(lambda: beat(app_name, ddb)[2] == "lease", bound_s=SWITCH_BOUND_S, what="its beat says lease")
    eventually(lambda: counters(app_name, ddb)[key] > stopped, bound_s=RENEWAL_BOUND_S, what="it renews again")
    assert worker.held_leases == [key]


@pytest.mark.parametrize(("stored", "setting"), [(LivenessMode.WORKER, "lease"), (LivenessMode.LEASE, "worker")])
def test_a_worker_configured_for_the_other_mode_refuses_to_start(
    ddb: Any, kinesis: Any, app_name: str, stored: LivenessMode, setting: str
) -> None:
    # GIVEN an application recorded in one mode, with its stream
    create_stream(kinesis, f"{app_name}-s", 1)
    modes(app_name, ddb).record_if_absent(stored, by="test")
    worker = make_worker(app_name, f"{app_name}-s", ddb, kinesis, setting=setting)
    # WHEN a worker configured for the other mode checks before starting
    # THEN it refuses with one line naming both
    with pytest.raises(LivenessModeMismatchError) as refused:
        worker.preflight()
    assert f"'{setting}'" in str(refused.value) and f"'{stored.value}'" in str(refused.value)
    # AND so does start() for a caller who skipped the check
    with pytest.raises(LivenessModeMismatchError):
        worker.start()


def test_throughput_is_written_only_when_it_changed_and_without_moving_the_counter(ddb: Any, app_name: str) -> None:
    # GIVEN a holder in worker mode (not renewing) holding one lease, with a throughput source we control
    clock = ManualClock()
    store = DynamoDBLeaseStore(app_name, client=ddb, clock=clock)
    assert store.create_lease_if_absent(Lease(lease_key="l0", lease_owner="w1", lease_counter=1))
    value: dict[str, float | None] = {"l0": None}
    holder = LeaseHolder(store, "w1", config=LeaseConfig(), clock=clock, throughput=lambda key: value[key])
    holder.set_renewing(False)
    lease = store.get_lease("l0")
    assert lease is not None and holder.take(lease)
    counter = store.get_lease("l0").lease_counter  # type: ignore[union-attr]

    def refresh(kbps: float | None) -> tuple[int, float | None]:
        value["l0"] = kbps
        written = holder.refresh_throughput()
        current = store.get_lease("l0")
        assert current is not None and current.lease_counter == counter  # never a renewal
        return written, current.throughput_kbps

    # WHEN nothing is known yet, or a lease with nothing stored carries nothing THEN nothing is written
    assert refresh(None) == (0, None)
    assert refresh(0.0) == (0, None)
    # WHEN a first value is known THEN it is written
    assert refresh(120.0) == (1, 120.0)
    # WHEN it moves by less than a fifth THEN nothing is written
    assert refresh(140.0) == (0, 120.0)
    # WHEN it moves by more THEN it is
    assert refresh(60.0) == (1, 60.0)
    # AND a small absolute change on a quiet lease is not worth a write
    assert refresh(60.5) == (0, 60.0)


class LandedTimeouts:
    """A heartbeat sink whose writes land while ``failing`` but whose replies never come back (a read timeout after
    the write was applied): the leader sees the counter move, the worker sees only failures."""

    def __init__(self, inner: WorkerMetricsStore) -> None:
        self._inner = inner
        self.failing = False

    def heartbeat(self, worker_id: str, **beat: Any) -> Any:
        row = self._inner.heartbeat(worker_id, **beat)
        if self.failing:
            raise EndpointUnreachableError("read timeout after the write landed (injected)")
        return row


def counter_over(
    rows: WorkerMetricsStore, seconds: float, step_s: float = 0.05, *, origin: float | None = None
) -> list[tuple[float, int]]:
    """(time since ``origin`` (default: now), heartbeat counter) every ``step_s`` for ``seconds``."""
    samples: list[tuple[float, int]] = []
    start = time.monotonic()
    origin = start if origin is None else origin
    while (now := time.monotonic()) - start < seconds:
        row = rows.get("w1")
        samples.append((now - origin, row.heartbeat.counter if row and row.heartbeat else 0))
        time.sleep(step_s)
    return samples


def longest_still(samples: list[tuple[float, int]]) -> float:
    """The longest stretch the samples saw one counter for. The silence it stands for was at most two sampling gaps
    longer (before its first sample and after its last) and at least as long."""
    longest, since, last = 0.0, 0.0, None
    for at, counter in samples:
        if counter != last:
            since, last = at, counter
        longest = max(longest, at - since)
    return longest


def still_counter(samples: list[tuple[float, int]]) -> int:
    """The counter of the longest stretch."""
    best, longest, since, last = 0, -1.0, 0.0, None
    for at, counter in samples:
        if counter != last:
            since, last = at, counter
        if at - since > longest:
            best, longest = counter, at - since
    return best


def widest_gap(samples: list[tuple[float, int]]) -> float:
    """The longest time between two samples (a slow machine's reads of the row)."""
    return max((b[0] - a[0] for a, b in itertools.pairwise(samples)), default=0.0)


def current_counter(rows: WorkerMetricsStore) -> int:
    row = rows.get("w1")
    return row.heartbeat.counter if row and row.heartbeat else 0


FENCE_CONFIG = LeaseConfig(failover_time_ms=1_000, heartbeat_interval_ms=100)
FENCE_BEAT_S = FENCE_CONFIG.heartbeat_interval_ms / 1000


def fence_rig(
    ddb: Any, app_name: str, liveness: str, *, quiet_after_lapse_ms: int
) -> tuple[WorkerMetricsStore, LeaseHolder, LandedTimeouts, HeartbeatLoop]:
    """w1's heartbeat loop in ``liveness`` mode (:data:`FENCE_CONFIG`), started, fencing its lease holder, beating
    into a :class:`LandedTimeouts` sink on the worker rows: (rows, holder, sink, loop). The test stops the loop."""
    rows = WorkerMetricsStore(app_name, client=ddb)
    holder = LeaseHolder(DynamoDBLeaseStore(app_name, client=ddb), "w1", config=FENCE_CONFIG)
    sink = LandedTimeouts(rows)
    loop = HeartbeatLoop(
        sink,
        "w1",
        interval_ms=FENCE_CONFIG.heartbeat_interval_ms,
        fence=holder,
        on_notice=lambda keys: None,
        quiet_after_lapse_ms=quiet_after_lapse_ms,
    )
    loop.liveness = liveness
    loop.start()
    return rows, holder, sink, loop


@pytest.mark.parametrize("liveness", ["worker", "lease"])
def test_a_fenced_worker_mode_worker_falls_silent_so_the_leader_moves_its_leases(
    ddb: Any, app_name: str, liveness: str
) -> None:
    # GIVEN a heartbeat loop (failover 1 s, beats every 100 ms) whose beats land but whose replies stop coming back
    config = FENCE_CONFIG
    quiet_s = config.quiet_after_lapse_ms / 1000  # the failover time and two beats: 1.2 s
    rows, holder, sink, loop = fence_rig(ddb, app_name, liveness, quiet_after_lapse_ms=config.quiet_after_lapse_ms)
    try:
        eventually(lambda: loop.beats >= 3, bound_s=hang_bound_s(3 * FENCE_BEAT_S), what="3 beats")
        # WHEN every reply is lost for 4.5 s (four and a half failover times)
        sink.failing = True
        watched = time.monotonic()
        samples = counter_over(rows, 4.5)
        if liveness == "worker":
            # (it beats again after its silence: liveness)
            silent_at = still_counter(samples)
            eventually(
                lambda: current_counter(rows) > silent_at,
                bound_s=hang_bound_s(quiet_s + FENCE_BEAT_S),
                what="a beat after the silence",
            )
    finally:
        loop.stop()
    # THEN the worker is fenced, and in worker mode — once fenced for the failover time — it falls silent for the
    # quiet time, longer than the failover time (the leader sees its counter stand still and judges it gone), then
    # beats again; in lease mode it never falls silent for the quiet time (its leases expire by counter anyway)
    assert holder.fenced
    gap = widest_gap(samples)
    if liveness == "worker":
        still = longest_still(samples)
        assert still + 2 * gap >= quiet_s > config.failover_time_ms / 1000, (still, gap)
    else:
        assert longest_still(samples) + 2 * gap < quiet_s, (longest_still(samples), gap, stall_note(watched))


def test_a_short_lapse_does_not_silence_a_worker_mode_worker(ddb: Any, app_name: str) -> None:
    # GIVEN the same loop in worker mode
    quiet_s = 1.2
    rows, holder, sink, loop = fence_rig(ddb, app_name, "worker", quiet_after_lapse_ms=int(quiet_s * 1000))
    try:
        eventually(lambda: loop.beats >= 3, bound_s=hang_bound_s(3 * FENCE_BEAT_S), what="3 beats")
        # WHEN replies are lost for 1.5 s: the fence runs out, but for less than the failover time
        sink.failing = True
        watched = time.monotonic()
        samples = counter_over(rows, 1.5, origin=watched)
        sink.failing = False
        samples += counter_over(rows, 1.0, origin=watched)
    finally:
        loop.stop()
    # THEN it never falls silent for the quiet time (counting the sampling's gaps), and the fence holds again
    gap = widest_gap(samples)
    assert longest_still(samples) + 2 * gap < quiet_s, (longest_still(samples), gap, stall_note(watched))
    assert not holder.fenced
