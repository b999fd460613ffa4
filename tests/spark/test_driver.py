"""The source's driver side without Spark: a :class:`SparkLeaseCoordinator` against a moto server heartbeats for the
application and follows the liveness mode (docs/liveness-modes.md) — in ``worker`` mode it holds its leases without
renewing them, completes a hand-off the leader asks for on its row once the batch reading the lease is committed,
and says STOPPED when it stops — and refuses to start in the other mode.

The coordinator's threads run on real time, so the timings are short (failover 1.5 s: renewals every 475 ms in
``lease`` mode, a beat every 500 ms) and every wait polls for an observable change, within a liveness bound on what
those timings give (tests/support/stalls.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.support import Env, last_sequence_per_shard
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core.models import WorkerMetricStats, WorkerState
from worker_lib.leases.mode import LivenessMode, LivenessModeMismatchError, StoredMode, handoff_request
from worker_lib.leases.mode_store import LivenessModeStore
from worker_lib.spark.driver import SparkLeaseCoordinator
from worker_lib.spark.options import SourceOptions
from worker_lib.spark.planning import plan_partitions
from worker_lib.spark.reading import read_task
from worker_lib.tables.state_store import CoordinatorStateStore
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

FAILOVER_MS = 1_500
RENEWER_S = (FAILOVER_MS // 3 - 25) / 1000
BEAT_S = FAILOVER_MS // 3 / 1000
"""The heartbeat's interval here: a third of the failover time, in either mode."""
ME = "spark-d"


@pytest.fixture
def drivers() -> Iterator[list[SparkLeaseCoordinator]]:
    started: list[SparkLeaseCoordinator] = []
    yield started
    for driver in started:
        driver.stop()


def record_mode(env: Env, mode: LivenessMode) -> None:
    LivenessModeStore(CoordinatorStateStore(env.app, client=env.ddb)).record_if_absent(mode, by="test")


def assign_all(env: Env, owner: str) -> list[str]:
    for lease in env.store.list_leases():
        assert env.store.assign_lease(lease, owner) is not None
    return sorted(lease.lease_key for lease in env.store.list_leases())


def make_driver(
    env: Env, setting: str, drivers: list[SparkLeaseCoordinator], *, discovery_ms: int = 500
) -> SparkLeaseCoordinator:
    options = SourceOptions.parse(
        {
            "app": env.app,
            "stream": env.stream,
            "endpoint_url": env.endpoint,
            "region": "us-east-1",
            "worker_id": ME,
            "failover_time_ms": str(FAILOVER_MS),
            "liveness_mode": setting,
            "discovery_interval_ms": str(discovery_ms),
            "metrics": "false",
        },
        env={},  # nothing from the developer's SHARDLEASE_* variables
    )
    driver = SparkLeaseCoordinator(options, dynamodb=env.ddb, kinesis=env.kinesis)
    drivers.append(driver)
    return driver


def counters(env: Env) -> dict[str, int]:
    return {lease.lease_key: lease.lease_counter for lease in env.store.list_leases()}


def row(env: Env, worker_id: str = ME) -> WorkerMetricStats:
    found = WorkerMetricsStore(env.app, client=env.ddb).get(worker_id)
    assert found is not None
    return found


def beats(env: Env) -> int:
    heartbeat = row(env).heartbeat
    assert heartbeat is not None
    return heartbeat.counter


def readable(driver: SparkLeaseCoordinator) -> set[str]:
    return {view.lease_key for view in driver.held_leases() if view.readable}


@pytest.mark.parametrize("mode", [LivenessMode.LEASE, LivenessMode.WORKER])
def test_the_driver_heartbeats_and_renews_only_in_lease_mode(
    env: Env, drivers: list[SparkLeaseCoordinator], mode: LivenessMode
) -> None:
    # GIVEN an application recorded in `mode` and its four leases assigned to the Spark application
    record_mode(env, mode)
    keys = assign_all(env, ME)
    # WHEN its driver starts
    driver = make_driver(env, mode.value, drivers)
    driver.start()
    # THEN it holds every lease at once (taken after its first beat landed) and follows the stored mode
    assert readable(driver) == set(keys)
    assert driver.liveness == StoredMode(mode=mode) and driver.renewing is (mode is LivenessMode.LEASE)
    taken, first_beat, since = counters(env), beats(env), time.monotonic()

    def renewed_twice() -> bool:
        now = counters(env)
        return all(now[key] >= taken[key] + 2 for key in keys)

    # WHEN four more beats land, and at least three renewer intervals have passed (in lease mode: each lease renewed
    # twice, which takes as long)
    eventually(
        lambda: (
            beats(env) >= first_beat + 4
            and time.monotonic() - since >= 3 * RENEWER_S
            and (mode is LivenessMode.WORKER or renewed_twice())
        ),
        bound_s=hang_bound_s(4 * BEAT_S),
        what="four beats (and in lease mode two renewals of every lease)",
    )
    # THEN in worker mode no lease counter moved; in lease mode every lease was renewed at least twice
    after = counters(env)
    if mode is LivenessMode.WORKER:
        assert after == taken
    else:
        assert all(after[key] >= taken[key] + 2 for key in keys), (taken, after)
    # AND its beats say which mode it runs in, at that mode's interval (a third of the failover time here)
    heartbeat = row(env).heartbeat
    assert heartbeat is not None and (heartbeat.liveness, heartbeat.interval_ms) == (mode.value, FAILOVER_MS // 3)
    assert readable(driver) == set(keys)


def test_a_handoff_asked_for_on_the_drivers_row_completes_once_its_batch_is_committed(
    env: Env, drivers: list[SparkLeaseCoordinator]
) -> None:
    # GIVEN a worker-mode application whose Spark driver holds every lease and has read batch 1 of each shard
    record_mode(env, LivenessMode.WORKER)
    keys = assign_all(env, ME)
    env.produce(40)
    rows = WorkerMetricsStore(env.app, client=env.ddb)
    rows.heartbeat("w2", interval_ms=1_000, state=WorkerState.ACTIVE, events=0)  # the receiver has a row
    driver = make_driver(env, "worker", drivers)
    driver.start()
    batch1 = driver.latest_offset(driver.initial_offset())
    assert sorted(batch1.shards) == keys
    driver.planned(batch1)
    for task in plan_partitions(batch1, driver.read_settings()):
        read_task(task)  # what the executors do: read, and record where the read ended
    # WHEN the leader hands one lease to w2 as it does in worker mode: leaseOwner = w2, checkpointOwner = us, and
    # the request on our row (no renewal will bring it)
    moved = keys[0]
    lease = env.store.get_lease(moved)
    assert lease is not None and env.store.initiate_graceful_handoff(lease, "w2") is not None
    assert rows.request_handoff(ME, [handoff_request(moved, 30_000)])
    # THEN a beat brings the request: the lease is planned into no new batch, but stays ours while batch 1 is open
    eventually(lambda: moved not in readable(driver), bound_s=hang_bound_s(BEAT_S), what="the request's beat")
    during = env.store.get_lease(moved)
    assert during is not None and (during.lease_owner, during.checkpoint_owner) == ("w2", ME)
    # WHEN Spark asks for the offset after batch 1 (so batch 1 is in its commit log)
    batch2 = driver.latest_offset(batch1)
    # THEN batch 1's checkpoint of the lease is written, w2 owns it outright and was told so, and batch 2 skips it
    after = env.store.get_lease(moved)
    assert after is not None and (after.lease_owner, after.checkpoint_owner) == ("w2", None)
    assert after.checkpoint.sequence == last_sequence_per_shard(env)[moved]
    assert rows.get("w2") is not None and rows.get("w2").assigned_keys == (moved,)  # type: ignore[union-attr]
    assert moved not in batch2.shards and set(batch2.shards) | {moved} == set(keys)
    # AND the next beat removes the request from our row
    eventually(lambda: row(env).handoff_requests == (), bound_s=hang_bound_s(BEAT_S), what="the next beat")


def test_a_lease_the_leader_announces_is_taken_at_the_next_beat(env: Env, drivers: list[SparkLeaseCoordinator]) -> None:
    # GIVEN a worker-mode Spark driver holding nothing, whose own discovery is a minute away
    record_mode(env, LivenessMode.WORKER)
    driver = make_driver(env, "worker", drivers, discovery_ms=60_000)
    driver.start()
    assert driver.held_leases() == []
    # WHEN the leader assigns it a lease and announces it on its row, as the leader's fast path does
    lease = env.store.list_leases()[0]
    assert env.store.assign_lease(lease, ME) is not None
    assert WorkerMetricsStore(env.app, client=env.ddb).notify_assigned(ME, [lease.lease_key])
    # THEN the next beat brings the notice and the driver takes that lease (a beat is 500 ms here)
    eventually(lambda: readable(driver) == {lease.lease_key}, bound_s=hang_bound_s(BEAT_S), what="the notice's beat")


def test_a_stopped_driver_gives_its_leases_up_and_says_stopped(env: Env, drivers: list[SparkLeaseCoordinator]) -> None:
    # GIVEN a worker-mode Spark driver holding every lease
    record_mode(env, LivenessMode.WORKER)
    keys = assign_all(env, ME)
    driver = make_driver(env, "worker", drivers)
    driver.start()
    assert readable(driver) == set(keys)
    # WHEN it stops
    driver.stop()
    # THEN every lease is unowned at once and its row says STOPPED (the leader moves nothing by waiting)
    assert all(lease.lease_owner is None for lease in env.store.list_leases())
    assert row(env).state is WorkerState.STOPPED and driver.held_leases() == []


def test_a_second_stop_returns_only_once_the_first_departure_is_done(
    env: Env, drivers: list[SparkLeaseCoordinator], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a driver holding every lease, whose departure is held while it gives its leases up (the source runner's
    # main thread in reader.stop(), as Spark closes its socket)
    record_mode(env, LivenessMode.WORKER)
    assign_all(env, ME)
    driver = make_driver(env, "worker", drivers)
    driver.start()
    journal: list[str] = []
    giving_up, release = threading.Event(), threading.Event()
    give_up = driver._keeper.give_up

    def held_give_up(keys: Any) -> Any:
        giving_up.set()
        release.wait()
        result = give_up(keys)
        journal.append("given up")
        return result

    monkeypatch.setattr(driver._keeper, "give_up", held_give_up)
    first = threading.Thread(target=driver.stop)
    first.start()
    assert giving_up.wait(hang_bound_s(BEAT_S))

    def second_stop() -> None:  # the SIGTERM handler's departure, which ends the process when stop() returns
        driver.stop()
        journal.append("second stop returned")

    # WHEN a second stop comes meanwhile (given the time to return early, were it to)
    second = threading.Thread(target=second_stop)
    second.start()
    second.join(0.5)
    release.set()
    first.join(hang_bound_s(BEAT_S))
    second.join(hang_bound_s(BEAT_S))
    # THEN it returned only after the first departure gave the leases up, and the row says STOPPED
    assert journal == ["given up", "second stop returned"]
    assert all(lease.lease_owner is None for lease in env.store.list_leases())
    assert row(env).state is WorkerState.STOPPED


@pytest.mark.parametrize(("stored", "setting"), [(LivenessMode.WORKER, "lease"), (LivenessMode.LEASE, "worker")])
def test_a_driver_configured_for_the_other_mode_refuses_to_start(
    env: Env, drivers: list[SparkLeaseCoordinator], stored: LivenessMode, setting: str
) -> None:
    # GIVEN an application recorded in one mode, with a lease assigned to the Spark application
    record_mode(env, stored)
    assign_all(env, ME)
    driver = make_driver(env, setting, drivers)
    # WHEN its driver, configured for the other mode, starts (Spark's first driver-side call)
    # THEN it refuses with one line naming both modes and the option to change
    with pytest.raises(LivenessModeMismatchError) as refused:
        driver.initial_offset()
    message = str(refused.value)
    assert f"'{setting}'" in message and f"'{stored.value}'" in message and "liveness_mode" in message
    assert "\n" not in message
    # AND nothing started: no heartbeat row, no lease taken, and asking again refuses again
    assert WorkerMetricsStore(env.app, client=env.ddb).get(ME) is None
    assert driver.held_leases() == []
    with pytest.raises(LivenessModeMismatchError):
        driver.start()


def test_an_available_now_query_waits_for_a_leaving_predecessor_before_its_first_batch(
    env: Env, drivers: list[SparkLeaseCoordinator]
) -> None:
    # GIVEN every lease assigned to the Spark application, and an earlier process under its worker id that beat a
    # moment ago and never said STOPPED (a stopped query's runner ended by its deadline, on a loaded machine)
    record_mode(env, LivenessMode.LEASE)
    keys = assign_all(env, ME)
    rows = WorkerMetricsStore(env.app, client=env.ddb)
    rows.heartbeat(ME, interval_ms=int(BEAT_S * 1000), state=WorkerState.ACTIVE, events=0, session="0-predecessor")
    # WHEN a Trigger.AvailableNow query starts on a new checkpoint: its first offset, then the batch after it
    driver = make_driver(env, "lease", drivers)
    start = driver.initial_offset()
    driver.prepare_available_now()
    first = driver.latest_offset(start)
    # THEN the first batch reads every lease: the query waited for the predecessor to fall silent and took them,
    # rather than ending at once with nothing (it held nothing when it started: the predecessor might still leave)
    assert sorted(first.shards) == keys
