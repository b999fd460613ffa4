"""worker_lib.testing's producer, process fleet and wait helper, without emulators: a fake Kinesis client, a manual
clock and short-lived Python processes."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import PROCESS_START_S
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.core.clock import ManualClock
from worker_lib.testing.processes import ProcessFleet
from worker_lib.testing.producers import Producer, shard_hash_keys
from worker_lib.testing.waiting import wait_until


class FakeKinesis:
    """Answers PutRecords like Kinesis: each record into shard ``s-<its explicit hash key or 0>``. ``raise_calls``:
    call numbers (from 0) that raise; ``fail``: record ids the reply marks failed (once each)."""

    def __init__(self, *, raise_calls: set[int] | None = None, fail: set[str] | None = None) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.raise_calls = raise_calls or set()
        self.fail = fail or set()
        self.lock = threading.Lock()

    def put_records(self, *, StreamName: str, Records: list[dict[str, Any]]) -> dict[str, Any]:
        with self.lock:
            self.calls.append(Records)
            if len(self.calls) - 1 in self.raise_calls:
                raise ConnectionError("the emulator is busy")
            out: list[dict[str, Any]] = []
            for record in Records:
                if record["PartitionKey"] in self.fail:
                    self.fail.discard(record["PartitionKey"])
                    out.append({"ErrorCode": "ProvisionedThroughputExceededException"})
                else:
                    out.append({"ShardId": f"s-{record.get('ExplicitHashKey', '0')}", "SequenceNumber": "1"})
            return {"Records": out}

    def list_shards(self, **_: Any) -> dict[str, Any]:
        return {
            "Shards": [
                {"ShardId": "b", "HashKeyRange": {"StartingHashKey": "200"}, "SequenceNumberRange": {}},
                {"ShardId": "a", "HashKeyRange": {"StartingHashKey": "100"}, "SequenceNumberRange": {}},
                {
                    "ShardId": "closed",
                    "HashKeyRange": {"StartingHashKey": "0"},
                    "SequenceNumberRange": {"EndingSequenceNumber": "9"},
                },
            ]
        }


def produce(kinesis: FakeKinesis, count: int, **options: Any) -> Producer:
    """Run a producer until it has ``count`` records accepted, then stop it."""
    with Producer(kinesis, "s", tick_s=0.001, **options) as producer:
        eventually(
            lambda: len(producer.produced) >= count,
            bound_s=hang_bound_s(count * 0.001),  # a record or more per 1 ms tick
            what=f"{count} records produced",
            step_s=0.001,
        )
    return producer


def test_records_are_numbered_aimed_in_turn_and_padded() -> None:
    # GIVEN a producer of 4 records a tick, aimed at two hash keys in turn, padded to 10 bytes
    kinesis = FakeKinesis()
    # WHEN it has produced 8 records
    producer = produce(kinesis, 8, per_tick=4, prefix="x", digits=3, hash_keys=["1", "2"], payload_bytes=10)
    # THEN they are numbered from 0, in order, and each went to its key's shard in turn
    assert producer.produced[:8] == [f"x{n:03d}" for n in range(8)]
    placed = producer.placed()
    assert [placed[f"x{n:03d}"].shard_id for n in range(4)] == ["s-1", "s-2", "s-1", "s-2"]
    assert placed["x001"].hash_key == "2"
    # AND each record's data is its id, a bar and padding to the size asked for
    assert kinesis.calls[0][0]["Data"] == b"x000|xxxxx"
    assert producer.per_shard()["s-1"] == producer.per_shard()["s-2"]
    assert producer.errors == 0


def test_a_function_of_the_record_number_aims_each_record() -> None:
    # GIVEN a producer whose hash key is a function of the record number
    kinesis = FakeKinesis()
    # WHEN it produces
    produce(kinesis, 3, per_tick=3, hash_keys=lambda n: str(n * 10))
    # THEN each record was aimed with the key for its number; without padding its data is its id
    assert [r["ExplicitHashKey"] for r in kinesis.calls[0]] == ["0", "10", "20"]
    assert kinesis.calls[0][1]["Data"] == b"r0000001"


def test_a_call_that_raises_is_retried_with_the_same_numbers_and_failed_records_are_skipped() -> None:
    # GIVEN an emulator whose first call raises and whose reply marks r0000001 failed
    kinesis = FakeKinesis(raise_calls={0}, fail={"r0000001"})
    # WHEN the producer runs
    producer = produce(kinesis, 5, per_tick=3)
    # THEN the raising call's records went out again with the same numbers; the failed record is not produced
    assert producer.produced[:5] == ["r0000000", "r0000002", "r0000003", "r0000004", "r0000005"]
    # AND both count as errors
    assert producer.errors == 2


def test_a_tick_goes_out_in_calls_of_at_most_500_records() -> None:
    # GIVEN a producer of 1 200 records a tick
    kinesis = FakeKinesis()
    # WHEN it has produced one tick
    produce(kinesis, 1200, per_tick=1200)
    # THEN the tick took three calls: 500, 500 and 200 records
    assert [len(call) for call in kinesis.calls[:3]] == [500, 500, 200]


def test_shard_hash_keys_are_the_open_shards_starting_keys_lowest_first() -> None:
    # GIVEN a stream with two open shards and a closed one WHEN its hash keys are listed
    keys = shard_hash_keys(FakeKinesis(), "s")
    # THEN they are the open shards' starting keys, lowest first
    assert keys == ["100", "200"]


def test_a_producer_needs_records_and_time_between_ticks() -> None:
    # GIVEN / WHEN a producer is asked for no records a tick, or no time between ticks, THEN it refuses
    with pytest.raises(ValueError, match="per_tick"):
        Producer(FakeKinesis(), "s", per_tick=0)
    with pytest.raises(ValueError, match="tick_s"):
        Producer(FakeKinesis(), "s", tick_s=0)


@pytest.mark.parametrize(("holds_after", "expected"), [(3, True), (None, False)])
def test_wait_until_polls_until_the_predicate_holds_or_time_runs_out(holds_after: int | None, expected: bool) -> None:
    # GIVEN a predicate that holds from its 3rd call (or never), and a manual clock
    clock = ManualClock()
    start = clock.monotonic()
    calls: list[int] = []

    def predicate() -> bool:
        calls.append(1)
        return holds_after is not None and len(calls) >= holds_after

    # WHEN waiting up to 5 s in steps of 1 s
    held = wait_until(predicate, timeout_s=5, step_s=1, clock=clock)
    # THEN it says whether the predicate held: after two steps, or at the deadline (asked once more there)
    assert held is expected
    assert clock.monotonic() - start == (2 if expected else 5)


SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]  # (until signalled)
START_BOUND_S = hang_bound_s(PROCESS_START_S)
"""A Python process starts and prints."""
EXIT_BOUND_S = hang_bound_s(0.0)
"""A process signalled to die (SIGTERM unhandled, SIGKILL) is gone at once: the liveness bound is the floor."""


def test_a_fleet_starts_by_name_signals_by_pid_and_kills_what_is_left(tmp_path: Path) -> None:
    with ProcessFleet(tmp_path) as fleet:
        # GIVEN two processes of a fleet, each in a session of its own, logging to a file
        a = fleet.start("a", SLEEPER)
        fleet.start("b", SLEEPER, role="worker")
        eventually(lambda: "up" in fleet.log("a"), bound_s=START_BOUND_S, what="the sleeper's start")
        # WHEN one is killed and the other stopped
        killed_at = fleet.signal("a", signal.SIGKILL)
        codes = fleet.stop(["b"], timeout_s=EXIT_BOUND_S)
        # THEN the stopped one's exit code says SIGTERM, and the killed one counts as killed at that time
        assert codes == {"b": -signal.SIGTERM}
        assert fleet.wait("a", timeout_s=EXIT_BOUND_S) == -signal.SIGKILL
        assert fleet.abnormal_pids() == {a.pid}
        assert fleet.cut_at() == {a.pid: [killed_at]}
        assert fleet["b"].sent("SIGTERM") is not None and fleet["b"].role == "worker"
        # AND a name cannot be used twice (a restarted worker needs a name of its own)
        with pytest.raises(ValueError, match="name of its own"):
            fleet.start("a", SLEEPER)
        left = fleet.start("c", SLEEPER)
        assert fleet.live() == [left]
    # AND leaving the fleet killed what was left
    assert left.process.returncode == -signal.SIGKILL


def test_closing_with_exited_groups_kills_what_an_exited_process_left_in_its_session(tmp_path: Path) -> None:
    # GIVEN a process that starts a child in its session, says its pid and exits (as a Spark application's JVM
    # can outlive its Python main process)
    parent = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(child.pid, flush=True)"
    )
    fleet = ProcessFleet(tmp_path)
    fleet.start("parent", [sys.executable, "-c", parent])
    assert fleet.wait("parent", timeout_s=START_BOUND_S) == 0
    child = int(fleet.log("parent").split()[0])
    assert Path(f"/proc/{child}").exists()
    # WHEN the fleet is closed with exited_groups
    fleet.close(exited_groups=True)
    # THEN the child is gone too (killed; reaped by init, as it is not ours)
    eventually(lambda: not _running(child), bound_s=EXIT_BOUND_S, what="the child's end")


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
