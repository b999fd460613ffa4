"""The leader lock against moto and dynalite: one holder among concurrent contenders, expiry, fencing, KCL items.

Timing tests use :class:`ManualClock` (shared between contenders, or one per host with ``skew_wall``); only the
real-concurrency tests (threads, processes) use the system clock, bounded by liveness bounds (tests/support/stalls.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.faults import lose_replies
from tests.support.processes import fleet_start_s
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core import aws
from worker_lib.core.clock import ManualClock
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import TableMissingError
from worker_lib.leader.config import LeaderLockConfig
from worker_lib.leader.lock import DynamoDBLeaderLock, LeaderLock
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.coordinator_items import LOCK_KEY
from worker_lib.tables.schema import coordinator_state_table_name

CONFIG = LeaderLockConfig(lease_duration_ms=30_000, heartbeat_interval_ms=10_000, max_clock_skew_ms=1_000)
DURATION_S = CONFIG.lease_duration_ms / 1000
SKEW_S = CONFIG.max_clock_skew_ms / 1000
POLL_S = CONFIG.poll_interval_ms / 1000
LOG = "worker_lib.leader.lock"
# Liveness bounds (tests/support/stalls.py) of the real-concurrency tests: a few calls each (no timing: the floor),
# and ten interpreters starting at once
CALLS_BOUND_S = hang_bound_s(0.0)
READY_BOUND_S = hang_bound_s(fleet_start_s(10))


@pytest.fixture
def ddb(ddb_aws: AwsConfig, app_name: str) -> Any:
    client = aws.client("dynamodb", ddb_aws)
    ensure_tables(app_name, client)
    return client


def lock(ddb: Any, app: str, owner: str, clock: ManualClock | None = None) -> DynamoDBLeaderLock:
    return DynamoDBLeaderLock(app, owner, config=CONFIG, client=ddb, clock=clock or ManualClock())


def two_locks(
    ddb: Any, app: str, first: str, second: str
) -> tuple[ManualClock, DynamoDBLeaderLock, DynamoDBLeaderLock]:
    """Two contenders for the application's lock, ``first`` and ``second``, on one manual clock."""
    clock = ManualClock()
    return clock, lock(ddb, app, first, clock), lock(ddb, app, second, clock)


def raw_item(ddb: Any, app: str) -> dict[str, Any]:
    item = ddb.get_item(TableName=coordinator_state_table_name(app), Key={"key": {"S": LOCK_KEY}}, ConsistentRead=True)
    return dict(item["Item"])


def test_the_dynamodb_lock_satisfies_the_protocol(ddb: Any, app_name: str) -> None:
    assert isinstance(lock(ddb, app_name, "x"), LeaderLock)


def test_the_item_is_in_kcl_lock_client_format(ddb: Any, app_name: str) -> None:
    # GIVEN a fresh table WHEN a host acquires the lock
    clock = ManualClock(wall=1_800_000_000.0)
    holder = lock(ddb, app_name, "holder", clock)
    assert holder.try_acquire()
    # THEN the item carries KCL's attributes with KCL's types, plus our wall-clock expiry
    item = raw_item(ddb, app_name)
    assert item["ownerName"] == {"S": "holder"}
    assert item["leaseDuration"] == {"S": "30000"}
    assert uuid.UUID(item["recordVersionNumber"]["S"])
    assert "isReleased" not in item  # the lock client reads its mere presence as "released"
    assert item["entityType"] == {"S": "LEADER"}  # as KCL 3.5 writes it
    assert item["expiresAtMillis"] == {"N": str(1_800_000_000_000 + 30_000)}
    assert item["lastUpdatedMillis"] == {"N": "1800000000000"}
    # AND every heartbeat writes a new recordVersionNumber
    first = item["recordVersionNumber"]["S"]
    clock.advance(10)
    assert holder.heartbeat()
    assert raw_item(ddb, app_name)["recordVersionNumber"]["S"] != first


# --- exactly one holder -------------------------------------------------------------------------------------


def test_exactly_one_of_ten_threads_wins_each_round(ddb: Any, app_name: str) -> None:
    # GIVEN 10 contenders released at the same instant (scenario 17), for three rounds
    contenders = [lock(ddb, app_name, f"c{n}") for n in range(10)]
    for _round in range(3):
        barrier = threading.Barrier(10)
        results: dict[str, bool] = {}

        def contend(
            contender: DynamoDBLeaderLock, barrier: threading.Barrier = barrier, results: dict[str, bool] = results
        ) -> None:
            barrier.wait(timeout=CALLS_BOUND_S)
            results[contender.owner] = contender.try_acquire()

        threads = [threading.Thread(target=contend, args=(c,), daemon=True) for c in contenders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=CALLS_BOUND_S)
        assert not any(thread.is_alive() for thread in threads), "a contender hangs"
        # THEN exactly one holds the lock, and everyone agrees who
        winners = [owner for owner, won in results.items() if won]
        assert len(results) == 10 and len(winners) == 1
        assert all(c.current_leader() == winners[0] for c in contenders)
        assert [c.owner for c in contenders if c.is_leader()] == winners
        # AND WHEN the winner releases, the next round starts from a free lock
        winner = next(c for c in contenders if c.owner == winners[0])
        assert winner.release() and winner.current_leader() is None


CONTENDER = """
import sys
from pathlib import Path
from worker_lib.core import aws
from worker_lib.core.clock import SYSTEM_CLOCK
from worker_lib.core.config import AwsConfig
from worker_lib.leader.config import LeaderLockConfig
from worker_lib.leader.lock import DynamoDBLeaderLock
endpoint, app, owner, barrier, bound_s = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), float(sys.argv[5])
client = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint, max_attempts=2))
lock = DynamoDBLeaderLock(app, owner, config=LeaderLockConfig(lease_duration_ms=30_000), client=client)
lock.current_leader()  # warm the connection so that every process starts its attempt equally ready
(barrier / f"ready-{owner}").touch()
deadline = SYSTEM_CLOCK.monotonic() + bound_s  # the others are ready by then, or the test failed
while not (barrier / "go").exists():
    if SYSTEM_CLOCK.monotonic() > deadline:
        sys.exit(3)
    SYSTEM_CLOCK.sleep(0.001)
print("WON" if lock.try_acquire() else "LOST", flush=True)
"""


# Not gated by a share: ten interpreters starting load the machine for seconds, but the test judges no time (exactly
# one wins, whatever the load), and a share's wait would hold the light tests queued behind it.
def test_exactly_one_of_ten_processes_wins(ddb: Any, ddb_endpoint: str, app_name: str, tmp_path: Path) -> None:
    # GIVEN 10 separate OS processes, each ready to try, released together through a file barrier
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, ddb_endpoint, app_name, f"p{n}", str(tmp_path), str(READY_BOUND_S)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(10)
    ]
    outputs: list[str] = []
    try:

        def ready() -> bool:
            assert all(p.poll() is None for p in procs), "a contender died before the start"
            return len(list(tmp_path.glob("ready-*"))) == 10

        eventually(ready, bound_s=READY_BOUND_S, what="10 contenders ready", step_s=0.01)
        # WHEN all try at once
        (tmp_path / "go").touch()
        for proc in procs:
            out, err = proc.communicate(timeout=CALLS_BOUND_S)
            assert proc.returncode == 0, err
            outputs.append(out.strip())
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, 9)
                proc.wait(timeout=10)
    # THEN exactly one process won, and the item names it
    assert sorted(outputs) == ["LOST"] * 9 + ["WON"]
    winner = f"p{outputs.index('WON')}"
    assert lock(ddb, app_name, "observer").current_leader() == winner


# --- holding, releasing, dying ------------------------------------------------------------------------------


def test_heartbeats_keep_the_lock_and_release_hands_it_over_at_once(ddb: Any, app_name: str) -> None:
    # GIVEN a holder and a contender
    clock, holder, other = two_locks(ddb, app_name, "holder", "other")
    assert holder.try_acquire()
    # WHEN the holder heartbeats every 10 s for two minutes (four lease durations)
    for _ in range(12):
        clock.advance(10)
        assert holder.heartbeat() and holder.is_leader()
        # THEN no contender can take it
        assert not other.try_acquire() and other.current_leader() == "holder"
    # WHEN it releases
    assert holder.release() and not holder.is_leader()
    assert raw_item(ddb, app_name)["isReleased"] == {"S": "1"}  # the lock client's value
    # THEN the next contender takes it immediately, without waiting for expiry
    assert other.current_leader() is None
    assert other.try_acquire() and other.current_leader() == "other"
    # AND the old holder can neither heartbeat nor release again
    assert not holder.heartbeat() and not holder.release()


def test_try_acquire_by_the_holder_extends_the_lock(ddb: Any, app_name: str) -> None:
    # GIVEN a holder WHEN it calls try_acquire again (as the leader loop may) THEN it stays holder with a new expiry
    clock, holder, other = two_locks(ddb, app_name, "holder", "other")
    assert holder.try_acquire()
    for _ in range(5):
        clock.advance(20)
        assert holder.try_acquire() and holder.is_leader()
    assert not other.try_acquire()


def test_a_dead_holder_is_replaced_within_lease_duration_plus_skew_plus_one_poll(ddb: Any, app_name: str) -> None:
    # GIVEN a holder that dies without releasing (it simply stops heartbeating)
    clock, dead, contender = two_locks(ddb, app_name, "dead", "contender")
    assert dead.try_acquire()
    died_at = clock.monotonic()
    # WHEN a contender waits for it with acquire(), which polls by sleeping on the (manual) clock
    assert contender.acquire(timeout_s=120)
    # THEN it takes over after the lease expired, within duration + skew + one poll
    waited = clock.monotonic() - died_at
    assert DURATION_S < waited <= DURATION_S + SKEW_S + POLL_S
    assert contender.current_leader() == "contender" and contender.is_leader()
    # AND the dead holder had stopped considering itself leader before that
    assert not dead.is_leader()


def test_acquire_gives_up_at_its_timeout_while_the_lock_is_held(ddb: Any, app_name: str) -> None:
    # GIVEN a live holder
    clock, holder, contender = two_locks(ddb, app_name, "holder", "contender")
    assert holder.try_acquire()
    # WHEN a contender waits 5.5 s THEN it gives up after exactly that long (polling every second)
    start = clock.monotonic()
    assert not contender.acquire(timeout_s=5.5)
    assert clock.monotonic() - start == pytest.approx(5.5)
    # AND a zero timeout is a single attempt
    assert not contender.acquire(timeout_s=0) and clock.monotonic() - start == pytest.approx(5.5)


def test_a_paused_holder_cannot_heartbeat_release_or_clobber_after_replacement(
    ddb: Any, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a holder paused (GC, SIGSTOP, a frozen Lambda) past its lease, and a new holder
    clock, paused, new = two_locks(ddb, app_name, "paused", "new")
    assert paused.try_acquire()
    clock.advance(DURATION_S + SKEW_S + 0.5)
    assert not paused.is_leader()
    assert new.try_acquire()
    item_of_new = raw_item(ddb, app_name)
    # WHEN the paused holder wakes up and tries everything
    with caplog.at_level(logging.INFO, logger=LOG):
        heartbeat, release, acquire = paused.heartbeat(), paused.release(), paused.try_acquire()
    # THEN all fail, the loss is logged once, and the new holder's item is untouched
    assert (heartbeat, release, acquire) == (False, False, False)
    assert not paused.is_leader()
    assert raw_item(ddb, app_name) == item_of_new
    assert [r.getMessage() for r in caplog.records] == ["leader lock lost owner=paused (replaced by another holder)"]
    assert new.current_leader() == "new" and new.heartbeat()


def test_a_holder_that_learns_of_its_replacement_on_acquire_logs_the_loss(
    ddb: Any, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a paused holder that was replaced WHEN it next calls try_acquire (not heartbeat)
    clock, paused, new = two_locks(ddb, app_name, "paused", "new")
    assert paused.try_acquire()
    clock.advance(DURATION_S + SKEW_S + 0.5)
    assert new.try_acquire()
    with caplog.at_level(logging.INFO, logger=LOG):
        assert not paused.try_acquire()
    # THEN one line says who took it
    assert [r.getMessage() for r in caplog.records] == ["leader lock lost owner=paused (taken over by new)"]


def test_transitions_are_logged_one_line_each(ddb: Any, app_name: str, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    holder = lock(ddb, app_name, "holder", clock)
    # WHEN a host acquires, heartbeats and releases
    with caplog.at_level(logging.INFO, logger=LOG):
        assert holder.try_acquire()
        clock.advance(10)
        assert holder.heartbeat()
        assert holder.release()
    # THEN acquired and released are logged at INFO (heartbeats are not transitions)
    assert [r.getMessage() for r in caplog.records] == [
        "leader lock acquired (previous holder none) owner=holder",
        "leader lock released owner=holder",
    ]


# --- clocks -------------------------------------------------------------------------------------------------


def test_is_leader_ends_before_anyone_else_can_take_the_lock(ddb: Any, app_name: str) -> None:
    # GIVEN a holder whose clock runs with the others
    clock, holder, other = two_locks(ddb, app_name, "holder", "other")
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
    # THEN the holder stopped acting at duration − skew, before the other could take it at duration + skew
    assert first_not_leader == DURATION_S - SKEW_S
    assert first_taken == DURATION_S + SKEW_S + 1


def test_is_leader_counts_from_when_the_heartbeat_was_sent(ddb: Any, app_name: str) -> None:
    # GIVEN a heartbeat whose reply takes 3 s to arrive (the clock moves while the request is in flight)
    clock = ManualClock()
    holder = lock(ddb, app_name, "holder", clock)
    assert holder.try_acquire()
    clock.advance(10)
    sent = clock.monotonic()

    def slow_reply(**_: Any) -> None:
        clock.advance(3)

    ddb.meta.events.register("after-call.dynamodb.UpdateItem", slow_reply, unique_id="slow-reply")
    try:
        assert holder.heartbeat()
    finally:
        ddb.meta.events.unregister("after-call.dynamodb.UpdateItem", unique_id="slow-reply")
    # THEN leadership ends at send time + duration − skew, not at reply time + ...
    clock.advance(sent + DURATION_S - SKEW_S - 0.01 - clock.monotonic())
    assert holder.is_leader()
    clock.advance(0.02)
    assert not holder.is_leader()


def test_a_wall_clock_skewed_contender_within_the_bound_cannot_steal(ddb: Any, app_name: str) -> None:
    # GIVEN a contender whose wall clock runs 0.9 s ahead (within the 1 s bound)
    holder_clock, contender_clock = ManualClock(), ManualClock()
    contender_clock.skew_wall(0.9)
    holder = lock(ddb, app_name, "holder", holder_clock)
    contender = lock(ddb, app_name, "contender", contender_clock)
    assert holder.try_acquire()
    # WHEN time passes on both in 0.1 s steps until the contender gets the lock
    while not contender.try_acquire():
        holder_clock.advance(0.1)
        contender_clock.advance(0.1)
        assert holder_clock.monotonic() < 1_000 + DURATION_S + SKEW_S, "never taken over"
    # THEN by then the holder had already stopped acting as leader (no moment with two leaders)
    assert not holder.is_leader()
    # AND the takeover came no earlier than duration + skew − 0.9 s of actual skew
    assert holder_clock.monotonic() - 1_000 >= DURATION_S + SKEW_S - 0.9


def test_skew_beyond_the_bound_is_warned_about_and_fenced_by_conditional_writes(
    ddb: Any, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN the documented assumption broken: a contender's wall clock 5 s ahead (bound: 1 s)
    holder_clock, fast_clock = ManualClock(), ManualClock()
    fast_clock.skew_wall(5)
    holder, fast = lock(ddb, app_name, "holder", holder_clock), lock(ddb, app_name, "fast", fast_clock)
    assert holder.try_acquire()
    # WHEN 27 s pass THEN the fast contender takes the lock early, while the holder still believes it leads
    # (docs/leader-lock.md: a broken clock bound may give two leaders for up to the excess skew)
    holder_clock.advance(27)
    fast_clock.advance(27)
    assert holder.is_leader() and fast.try_acquire()
    # BUT the holder's next heartbeat fails, ending its leadership at once, and it never overwrites the new item
    item_of_fast = raw_item(ddb, app_name)
    assert not holder.heartbeat() and not holder.is_leader()
    assert not holder.release() and raw_item(ddb, app_name) == item_of_fast
    # AND a host whose clock is 5 s *behind* sees the item stamped in its future: it warns and waits longer (safe)
    slow_clock = ManualClock()
    slow_clock.skew_wall(-5)
    slow_clock.advance(27)
    slow = lock(ddb, app_name, "slow", slow_clock)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOG):
        assert not slow.try_acquire()
        assert not slow.try_acquire()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "ahead of this host's wall clock" in warnings[0] and "writer=fast" in warnings[0]
    slow_clock.advance(DURATION_S + SKEW_S)  # the fast holder's expiry, read on the slow clock, is 10 s later
    assert not slow.try_acquire()
    slow_clock.advance(10.5)
    assert slow.try_acquire()


# --- items written by KCL -----------------------------------------------------------------------------------


def kcl_put(ddb: Any, app: str, **extra: dict[str, Any]) -> str:
    """Write the Leader item as KCL's lock client does: no expiresAtMillis, a new version each time."""
    version = str(uuid.uuid4())
    ddb.put_item(
        TableName=coordinator_state_table_name(app),
        Item={
            "key": {"S": LOCK_KEY},
            "ownerName": {"S": "java-worker"},
            "leaseDuration": {"S": "20000"},
            "recordVersionNumber": {"S": version},
            **extra,
        },
    )
    return version


def test_a_lock_item_written_by_kcl_is_respected_until_its_version_stands_still(ddb: Any, app_name: str) -> None:
    # GIVEN a KCL 3.x lock item (no expiresAtMillis, leaseDuration 20 s), heartbeated by a Java leader
    kcl_put(ddb, app_name)
    clock = ManualClock()
    contender = lock(ddb, app_name, "py", clock)
    # WHEN the Java leader keeps heartbeating every 5 s for 40 s (two of its lease durations)
    for _ in range(8):
        assert not contender.try_acquire()
        clock.advance(5)
        kcl_put(ddb, app_name)
    # THEN we never take it
    assert contender.current_leader() == "java-worker"
    # WHEN it stops, THEN we take it only after watching one version for its full 20 s on our monotonic clock
    assert not contender.try_acquire()
    clock.advance(19)
    assert not contender.try_acquire()
    clock.advance(1.5)
    assert contender.try_acquire()
    # AND the Java leader's next heartbeat (conditional on its old version) could no longer land
    assert raw_item(ddb, app_name)["ownerName"] == {"S": "py"}


def test_a_lock_held_by_kcl_is_reported_foreign_and_one_held_by_us_is_not(ddb: Any, app_name: str) -> None:
    # GIVEN a KCL worker holding the lock (the lock client's format: no expiry of ours)
    kcl_put(ddb, app_name)
    contender = lock(ddb, app_name, "py", ManualClock())
    # WHEN we try to take it THEN we do not, and the holder is foreign (metric LeaderLockForeignHolder, its alarm)
    assert not contender.try_acquire() and contender.last_seen_holder() == "java-worker"
    assert contender.holder_is_foreign()
    # AND a lock held by one of ours is not foreign
    ddb.delete_item(TableName=coordinator_state_table_name(app_name), Key={"key": {"S": LOCK_KEY}})
    assert lock(ddb, app_name, "ours").try_acquire()
    other = lock(ddb, app_name, "py-2", ManualClock())
    assert not other.try_acquire() and other.last_seen_holder() == "ours" and not other.holder_is_foreign()


def test_a_kcl_item_is_not_stolen_when_its_version_changes_just_before_expiry(ddb: Any, app_name: str) -> None:
    # GIVEN a contender that has watched a KCL item for 19.9 s
    kcl_put(ddb, app_name)
    clock = ManualClock()
    contender = lock(ddb, app_name, "py", clock)
    assert not contender.try_acquire()
    clock.advance(19.9)
    # WHEN the KCL leader heartbeats just before our watch completes
    kcl_put(ddb, app_name)
    clock.advance(0.2)
    # THEN the watch starts over: not expired now, nor 19.9 s later
    assert not contender.try_acquire()
    clock.advance(19.9)
    assert not contender.try_acquire()
    clock.advance(0.2)
    assert contender.try_acquire()


def test_a_kcl_item_marked_released_is_taken_at_once(ddb: Any, app_name: str) -> None:
    # GIVEN a KCL leader that released the lock on shutdown
    kcl_put(ddb, app_name, isReleased={"S": "1"})
    # WHEN a contender tries THEN it takes the lock immediately
    assert lock(ddb, app_name, "py").try_acquire()


def test_a_malformed_lock_item_without_version_is_replaced_after_a_lease_duration(ddb: Any, app_name: str) -> None:
    # GIVEN a Leader item some tool wrote without recordVersionNumber
    ddb.put_item(
        TableName=coordinator_state_table_name(app_name),
        Item={"key": {"S": LOCK_KEY}, "ownerName": {"S": "someone"}},
    )
    clock, a, b = two_locks(ddb, app_name, "a", "b")
    assert not a.try_acquire() and not b.try_acquire()
    # WHEN both have watched it for a lease duration THEN exactly one replaces it (never a stuck lock)
    clock.advance(DURATION_S)
    assert [a.try_acquire(), b.try_acquire()] == [True, False]


def test_a_deleted_lock_item_ends_the_holders_leadership(ddb: Any, app_name: str) -> None:
    # GIVEN a holder WHEN an operator deletes the Leader item
    _, holder, other = two_locks(ddb, app_name, "holder", "other")
    assert holder.try_acquire()
    ddb.delete_item(TableName=coordinator_state_table_name(app_name), Key={"key": {"S": LOCK_KEY}})
    # THEN the holder's heartbeat fails and anyone may create the lock again
    assert not holder.heartbeat() and not holder.is_leader()
    assert other.try_acquire() and not holder.try_acquire()


# --- lost replies and errors --------------------------------------------------------------------------------


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
    # GIVEN a free lock WHEN the acquiring PutItem's reply is lost and re-sent
    holder = lock(ddb, app_name, "holder")
    with lose_replies(ddb, "PutItem", times=1) as lost:
        assert holder.try_acquire()
    # THEN the holder knows it holds the lock
    assert lost and holder.is_leader() and holder.current_leader() == "holder" and holder.heartbeat()


def test_a_lost_takeover_reply_is_recognised(ddb: Any, app_name: str) -> None:
    # GIVEN a released lock WHEN a contender's takeover write (conditional on the observed version) loses its reply
    _, first, second = two_locks(ddb, app_name, "first", "second")
    assert first.try_acquire() and first.release()
    with lose_replies(ddb, "PutItem", times=1) as lost:
        assert second.try_acquire()
    assert lost and second.is_leader() and second.heartbeat()


def test_a_lost_release_reply_is_recognised(ddb: Any, app_name: str) -> None:
    _, holder, other = two_locks(ddb, app_name, "holder", "other")
    assert holder.try_acquire()
    # WHEN the release's reply is lost and re-sent THEN release still reports success and the lock is free
    with lose_replies(ddb, "UpdateItem", times=1) as lost:
        assert holder.release()
    assert lost and not holder.is_leader() and other.try_acquire()


def test_a_missing_table_raises_table_missing(ddb_aws: AwsConfig) -> None:
    # GIVEN no CoordinatorState table WHEN a host tries the lock THEN our typed error (not botocore's) is raised
    contender = DynamoDBLeaderLock("never-created", "x", client=aws.client("dynamodb", ddb_aws), clock=ManualClock())
    with pytest.raises(TableMissingError):
        contender.try_acquire()
    assert not contender.is_leader()


def test_an_owner_name_is_required(ddb: Any, app_name: str) -> None:
    with pytest.raises(ValueError, match="owner"):
        DynamoDBLeaderLock(app_name, "", client=ddb)


# --- both ways: KCL's lock items under our lock, and the lock client's requests on our items ------------------------
# Fixtures: tests/fixtures/kcl3_lock_items.json, each case with the source it was read from. The requests below are
# the lock client's (awslabs/amazon-dynamodb-lock-client 1.4.0, AmazonDynamoDBLockClient.java), with its condition
# expressions verbatim, sent with boto3: no Java runs here.

LOCK_CASES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "kcl3_lock_items.json").read_text())[
    "cases"
]


def kcl_takeover(ddb: Any, app: str, owner: str, *, condition: str, names: dict[str, str], value: str) -> bool:
    """The lock client's takeover: a new item (its attributes, a 120 s lease) put under ``condition``, with ``:v``
    bound to ``value``; False when the condition fails."""
    try:
        ddb.put_item(
            TableName=coordinator_state_table_name(app),
            Item={
                "key": {"S": LOCK_KEY},
                "ownerName": {"S": owner},
                "leaseDuration": {"S": "120000"},
                "recordVersionNumber": {"S": str(uuid.uuid4())},
            },
            ConditionExpression=condition,
            ExpressionAttributeNames={"#pk": "key", **names},
            ExpressionAttributeValues={":v": {"S": value}},
        )
    except ddb.exceptions.ConditionalCheckFailedException:
        return False
    return True


def kcl_take_released(ddb: Any, app: str, owner: str) -> bool:
    """upsertAndMonitorReleasedLock: PutItem conditioned on ``attribute_exists(#pk) AND #ir = :ir`` (:ir = "1")."""
    condition = "attribute_exists(#pk) AND #ir = :v"
    return kcl_takeover(ddb, app, owner, condition=condition, names={"#ir": "isReleased"}, value="1")


def kcl_take_expired(ddb: Any, app: str, owner: str, observed_version: str) -> bool:
    """upsertAndMonitorExpiredLock: PutItem conditioned on ``attribute_exists(#pk) AND #rvn = :rvn`` (the version it
    watched for a lease duration)."""
    condition = "attribute_exists(#pk) AND #rvn = :v"
    names = {"#rvn": "recordVersionNumber"}
    return kcl_takeover(ddb, app, owner, condition=condition, names=names, value=observed_version)


def kcl_sees_released(ddb: Any, app: str) -> bool:
    """createLockItem: ``isReleased = item.containsKey(IS_RELEASED)``; getLock then reports no lock at all."""
    return "isReleased" in raw_item(ddb, app)


@pytest.mark.parametrize("case", LOCK_CASES, ids=[c["name"] for c in LOCK_CASES])
def test_every_lock_item_kcl_or_we_wrote_is_judged_as_its_writer_meant(
    ddb: Any, app_name: str, case: dict[str, Any]
) -> None:
    # GIVEN the Leader item as the case's writer left it, and a contender whose wall clock is at the item's write
    ddb.put_item(TableName=coordinator_state_table_name(app_name), Item=case["item"])
    expect = case["expect"]
    clock = ManualClock(wall=1_800_000_000.0)
    contender = lock(ddb, app_name, "py", clock)
    # THEN the lock client's reading is the expected one
    assert kcl_sees_released(ddb, app_name) is expect["kcl_released"]
    if expect["shardlease_released"]:
        # AND a released lock is ours at once
        assert contender.current_leader() is None
        assert contender.try_acquire()
        return
    # AND a held one is not taken before its expiry (written) or its leaseDuration of unchanged version (KCL's)
    assert contender.current_leader() == expect["owner"]
    assert not contender.try_acquire()
    clock.advance(expect["duration_ms"] / 1000 - 0.5)
    assert not contender.try_acquire()
    clock.advance(0.5 + SKEW_S + 0.1)
    assert contender.try_acquire()


def test_kcl_takes_a_lock_we_released_at_once_and_we_respect_it_after(ddb: Any, app_name: str) -> None:
    # GIVEN a shardlease leader that held the lock and released it (a rollback to KCL, or our fleet stopping)
    clock = ManualClock(wall=1_800_000_000.0)
    ours = lock(ddb, app_name, "py-leader", clock)
    assert ours.try_acquire()
    assert not kcl_sees_released(ddb, app_name)
    assert not kcl_take_released(ddb, app_name, "java-worker")  # while held, KCL's released-lock takeover fails
    assert ours.release()
    # WHEN a KCL worker looks: it reads the lock as released and its takeover lands
    assert kcl_sees_released(ddb, app_name)
    assert kcl_take_released(ddb, app_name, "java-worker")
    # THEN our old holder can no longer heartbeat, and our contenders wait out KCL's 120 s of unchanged version
    assert not ours.heartbeat()
    contender = lock(ddb, app_name, "py-2", clock)
    assert contender.current_leader() == "java-worker"
    assert not contender.try_acquire()
    clock.advance(119)
    assert not contender.try_acquire()


def test_kcl_cannot_take_a_lock_we_hold_even_after_watching_it(ddb: Any, app_name: str) -> None:
    # GIVEN a shardlease leader holding the lock, heartbeating
    clock = ManualClock(wall=1_800_000_000.0)
    ours = lock(ddb, app_name, "py-leader", clock)
    assert ours.try_acquire()
    watched = raw_item(ddb, app_name)["recordVersionNumber"]["S"]
    # WHEN a KCL worker (lock client with the post-1.4.0 stale-lock fix) watched that version and then tries to take
    # it as expired, after our next heartbeat
    clock.advance(CONFIG.heartbeat_interval_ms / 1000)
    assert ours.heartbeat()
    # THEN its conditional takeover fails: our heartbeat changed the version, as the lock client's does
    assert not kcl_take_expired(ddb, app_name, "java-worker", watched)
    assert not kcl_sees_released(ddb, app_name) and not kcl_take_released(ddb, app_name, "java-worker")
    assert raw_item(ddb, app_name)["ownerName"] == {"S": "py-leader"}


def test_an_upgraded_holder_clears_the_old_released_false_marker(ddb: Any, app_name: str) -> None:
    # GIVEN a lock held by a shardlease leader of the previous version (isReleased = false, BOOL)
    case = next(c for c in LOCK_CASES if c["name"] == "shardlease-0.x-held")
    ddb.put_item(TableName=coordinator_state_table_name(app_name), Item=case["item"])
    # WHEN an upgraded host takes it over after its expiry and heartbeats
    clock = ManualClock(wall=1_800_000_000.0)
    upgraded = lock(ddb, app_name, "py-new", clock)
    assert not upgraded.try_acquire()  # held: the old marker is not read as "released"
    clock.advance(10 + SKEW_S + 0.1)
    assert upgraded.try_acquire()
    clock.advance(1)
    assert upgraded.heartbeat()
    # THEN the item carries no isReleased any more: a KCL worker reads it as held
    assert not kcl_sees_released(ddb, app_name)
