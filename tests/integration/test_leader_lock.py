"""The leader lock against moto and dynalite: one holder among concurrent contenders, expiry, fencing, KCL items."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest

from tests.support.faults import lose_replies
from worker_lib import aws
from worker_lib.clock import ManualClock
from worker_lib.config import AwsConfig, LeaderLockConfig
from worker_lib.leader.lock import LOCK_KEY, DynamoDBLeaderLock
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import coordinator_state_table_name

CONFIG = LeaderLockConfig(lease_duration_ms=30_000, heartbeat_interval_ms=10_000, max_clock_skew_ms=1_000)


@pytest.fixture
def ddb(ddb_aws: AwsConfig, app_name: str) -> Any:
    client = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, client)
    return client


def lock(ddb: Any, app: str, owner: str, clock: ManualClock | None = None) -> DynamoDBLeaderLock:
    return DynamoDBLeaderLock(app, owner, config=CONFIG, client=ddb, clock=clock or ManualClock())


def test_exactly_one_of_ten_threads_wins(ddb: Any, app_name: str) -> None:
    # GIVEN 10 contenders released at the same instant (scenario 17)
    contenders = [lock(ddb, app_name, f"c{n}") for n in range(10)]
    barrier = threading.Barrier(10)
    results: dict[str, bool] = {}

    def contend(contender: DynamoDBLeaderLock) -> None:
        barrier.wait(timeout=10)
        results[contender.owner] = contender.try_acquire()

    threads = [threading.Thread(target=contend, args=(c,)) for c in contenders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # THEN exactly one holds the lock, and everyone agrees who
    winners = [owner for owner, won in results.items() if won]
    assert len(results) == 10 and len(winners) == 1
    assert all(c.current_leader() == winners[0] for c in contenders)
    assert [c.owner for c in contenders if c.is_leader()] == winners


CONTENDER = """
import sys, time
from worker_lib import aws
from worker_lib.config import AwsConfig, LeaderLockConfig
from worker_lib.leader.lock import DynamoDBLeaderLock
endpoint, app, owner, start_at = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
client = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint, max_attempts=2))
lock = DynamoDBLeaderLock(app, owner, config=LeaderLockConfig(lease_duration_ms=30_000), client=client)
while time.time() < start_at:
    time.sleep(0.001)
print("WON" if lock.try_acquire() else "LOST", flush=True)
"""


def test_exactly_one_of_ten_processes_wins(ddb: Any, ddb_endpoint: str, app_name: str) -> None:
    # GIVEN 10 separate OS processes that all try at the same wall-clock instant
    import time

    start_at = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, ddb_endpoint, app_name, f"p{n}", str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(10)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            outputs.append(out.strip())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    # THEN exactly one process won
    assert sorted(outputs) == ["LOST"] * 9 + ["WON"]
    winner = f"p{outputs.index('WON')}"
    assert lock(ddb, app_name, "observer").current_leader() == winner


def test_heartbeats_keep_the_lock_and_release_hands_it_over_at_once(ddb: Any, app_name: str) -> None:
    clock = ManualClock()
    holder, other = lock(ddb, app_name, "holder", clock), lock(ddb, app_name, "other", clock)
    assert holder.try_acquire()
    # WHEN the holder heartbeats every 10 s for a minute
    for _ in range(6):
        clock.advance(10)
        assert holder.heartbeat() and holder.is_leader()
        # THEN no contender can take it
        assert not other.try_acquire()
    # WHEN it releases
    assert holder.release() and not holder.is_leader()
    # THEN the next contender takes it immediately, without waiting for expiry
    assert other.try_acquire() and other.current_leader() == "other"


def test_a_dead_holder_is_replaced_within_lease_duration_plus_skew_plus_one_poll(ddb: Any, app_name: str) -> None:
    # GIVEN a holder that dies without releasing (it simply stops heartbeating)
    clock = ManualClock()
    dead, contender = lock(ddb, app_name, "dead", clock), lock(ddb, app_name, "contender", clock)
    assert dead.try_acquire()
    died_at = clock.monotonic()
    # WHEN a contender polls every second
    while not contender.try_acquire():
        clock.advance(CONFIG.poll_interval_ms / 1000)
        assert clock.monotonic() - died_at < 60, "never replaced"
    # THEN it takes over within duration + skew + one poll
    waited = clock.monotonic() - died_at
    limit = (CONFIG.lease_duration_ms + CONFIG.max_clock_skew_ms + CONFIG.poll_interval_ms) / 1000
    assert CONFIG.lease_duration_ms / 1000 < waited <= limit
    # AND the dead holder had stopped considering itself leader before that
    assert not dead.is_leader()


def test_a_paused_holder_cannot_heartbeat_release_or_clobber_after_replacement(ddb: Any, app_name: str) -> None:
    # GIVEN a holder paused (GC, SIGSTOP) past its lease, and a new holder
    clock = ManualClock()
    paused, new = lock(ddb, app_name, "paused", clock), lock(ddb, app_name, "new", clock)
    assert paused.try_acquire()
    clock.advance(32)
    assert not paused.is_leader()
    assert new.try_acquire()
    # WHEN the paused holder wakes up and tries everything
    heartbeat, release, acquire = paused.heartbeat(), paused.release(), paused.try_acquire()
    # THEN all fail and the new holder is untouched
    assert (heartbeat, release, acquire) == (False, False, False)
    assert new.current_leader() == "new" and new.heartbeat()


def test_is_leader_ends_before_anyone_else_can_take_the_lock(ddb: Any, app_name: str) -> None:
    # GIVEN a holder whose clock runs with the others
    clock = ManualClock()
    holder, other = lock(ddb, app_name, "holder", clock), lock(ddb, app_name, "other", clock)
    assert holder.try_acquire()
    # WHEN time advances second by second
    first_not_leader = first_taken = None
    for second in range(1, 40):
        clock.advance(1)
        if first_not_leader is None and not holder.is_leader():
            first_not_leader = second
        if first_taken is None and other.try_acquire():
            first_taken = second
            break
    # THEN the holder stopped acting (duration − skew) before the other could take it (duration + skew)
    assert first_not_leader is not None and first_taken is not None
    assert first_not_leader <= 29
    assert first_taken >= 31


def test_a_wall_clock_skewed_contender_within_the_bound_cannot_steal(ddb: Any, app_name: str) -> None:
    # GIVEN a contender whose wall clock runs 0.9 s ahead (within the 1 s bound)
    holder_clock, contender_clock = ManualClock(), ManualClock()
    contender_clock.skew_wall(0.9)
    holder = lock(ddb, app_name, "holder", holder_clock)
    contender = lock(ddb, app_name, "contender", contender_clock)
    assert holder.try_acquire()
    # WHEN 29 s pass on both (the holder still thinks it leads until 29 s)
    holder_clock.advance(28.9)
    contender_clock.advance(28.9)
    # THEN the contender cannot take the lock while the holder may still act
    assert holder.is_leader() and not contender.try_acquire()


def test_a_lock_item_written_by_kcl_is_respected_until_its_version_stands_still(ddb: Any, app_name: str) -> None:
    # GIVEN a KCL 3.x lock item (no expiresAtMillis), heartbeated by a Java leader
    table = coordinator_state_table_name(app_name)

    def kcl_heartbeat() -> None:
        ddb.put_item(
            TableName=table,
            Item={
                "key": {"S": LOCK_KEY},
                "ownerName": {"S": "java-worker"},
                "leaseDuration": {"S": "20000"},
                "recordVersionNumber": {"S": str(uuid.uuid4())},
            },
        )

    kcl_heartbeat()
    clock = ManualClock()
    contender = lock(ddb, app_name, "py", clock)
    # WHEN the Java leader keeps heartbeating every 5 s
    for _ in range(8):
        assert not contender.try_acquire()
        clock.advance(5)
        kcl_heartbeat()
    # THEN we never take it; WHEN it stops, we take it only after watching one version for its 20 s
    assert contender.current_leader() == "java-worker"
    assert not contender.try_acquire()
    clock.advance(19)
    assert not contender.try_acquire()
    clock.advance(1.5)
    assert contender.try_acquire()


def test_a_lost_heartbeat_reply_is_recognised(ddb: Any, app_name: str) -> None:
    clock = ManualClock()
    holder = lock(ddb, app_name, "holder", clock)
    assert holder.try_acquire()
    clock.advance(10)
    # WHEN the heartbeat's reply is lost and botocore re-sends it (its condition then fails)
    with lose_replies(ddb, "UpdateItem", times=1) as lost:
        assert holder.heartbeat()
    # THEN the holder recognises its own applied write and keeps the lock
    assert lost and holder.is_leader() and holder.heartbeat()


def test_a_lost_acquire_reply_is_recognised(ddb: Any, app_name: str) -> None:
    holder = lock(ddb, app_name, "holder")
    with lose_replies(ddb, "PutItem", times=1) as lost:
        assert holder.try_acquire()
    assert lost and holder.is_leader() and holder.current_leader() == "holder"
