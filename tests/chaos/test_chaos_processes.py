"""Seedable chaos with real `shardlease worker` processes (each with an embedded leader) and a steady producer.

Scenario A (moto): 3 workers on 4 shards; random SIGKILL + restart (same or new worker id), and a SIGSTOP
longer than the lease duration followed by SIGCONT — the resumed worker journals nothing on a shard another
process took, and no checkpoint moves backwards. Scenario B (kinesalite for Kinesis, moto for DynamoDB): a split
and a merge while producing, with a random SIGKILL in between in longer runs.

Both scenarios run in each liveness mode (docs/liveness-modes.md): ``lease`` (every lease renewed) and ``worker``
(the heartbeat alone proves a worker alive; the frozen worker's shards move once its heartbeat stood still for the
failover time, and on waking its first heartbeat reply comes after its fence ran out). The mode is recorded with
``shardlease liveness --set`` before the first process starts, and every process is configured for it.

Invariants (tests/support/chaos.py, ``check_journal``), the same in both modes: nothing lost; duplicates only after
an abnormal ownership change and only past the new session's start checkpoint; per-session order; nothing after a
session's LOST; children after their parents' END; overlap of two processes on one shard within the lease bound.

    SHARDLEASE_CHAOS_SEED=7 SHARDLEASE_CHAOS_ROUNDS=20 .venv/bin/pytest tests/chaos -s   # the longer run

CI runs one round with the default seed. The seed is printed with every failure.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos import (
    PROCESSOR,
    Line,
    Producer,
    chaos_rounds,
    chaos_seed,
    check_journal,
    failover_s,
    fenced_after_stop,
    read_lines,
    record_figures,
    unserved_s,
    wait_for,
    worker_liveness,
)
from tests.support.processes import (
    EMBEDDED_LEADER_ENV,
    LIVENESS_MODES,
    ProcessGroup,
    liveness_env,
    process_group,
    shardlease_liveness,
)
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import Lease
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.tables.admin import ensure_tables
from worker_lib.testing.streams import create_stream, list_all_shards, merge_shards, split_shard
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

LEASE_S = 3.0  # SHARDLEASE_FAILOVER_TIME_MS in tests/support/processes.py FAST_ENV
# The longest a shard may go unserved after a kill or a freeze: the failover time, the lock's takeover when the
# victim led (3 s lock + 0.5 s skew bound + a poll), then one leader pass and one beat (measured: at most 7.1 s in
# a 20-round run, docs/reliability.md).
MAX_UNSERVED_S = 12.0
ROUNDS = chaos_rounds()
SEED = chaos_seed()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120 + 90 * ROUNDS)]


def worker_env(journal: Path, liveness: str) -> dict[str, str]:
    return {
        **liveness_env(liveness),
        "SHARDLEASE_CHAOS_JOURNAL": str(journal),
        **EMBEDDED_LEADER_ENV,
    }


class Fleet:
    """Worker processes of one scenario, by name; remembers which pids died or were frozen."""

    def __init__(self, group: ProcessGroup, args: list[str], env: dict[str, str], journal: Path) -> None:
        self.group, self.args, self.env, self.journal = group, args, env, journal
        self.live: dict[str, int] = {}  # worker id -> pid
        self.abnormal: set[int] = set()
        self.cut_at: dict[int, list[float]] = {}  # pid -> when the test killed or froze it (it served nothing after)
        self._starts = 0

    def start(self, worker_id: str) -> int:
        self._starts += 1
        name = f"{worker_id}.{self._starts}"  # process-group key (log file); the worker id may repeat
        process = self.group.start(
            name, ["worker", *self.args, "--processor", PROCESSOR, "--worker-id", worker_id], self.env
        )
        self.live[worker_id] = process.pid
        return process.pid

    def process_name(self, worker_id: str) -> str:
        pid = self.live[worker_id]
        return next(name for name, p in self.group.processes.items() if p.pid == pid)

    def lines(self) -> list[Line]:
        return read_lines(self.journal)

    def holding(self, pid: int) -> set[str]:
        held: set[str] = set()
        for line in self.lines():
            if line.pid == pid and line.kind == "INIT":
                held.add(line.shard)
            elif line.pid == pid and line.kind in ("LOST", "END", "SHUTDOWN"):
                held.discard(line.shard)
        return held

    def busy_worker(self, rng: random.Random) -> str:
        """A live worker that is processing at least one shard (waits for one, bounded)."""
        assert wait_for(lambda: any(self.holding(pid) for pid in self.live.values()), timeout_s=30)
        candidates = sorted(w for w, pid in self.live.items() if self.holding(pid))
        return rng.choice(candidates)

    def sigkill_and_restart(self, rng: random.Random) -> float | None:
        victim = self.busy_worker(rng)
        pid = self.live.pop(victim)
        killed_at = time.monotonic()
        self.group.signal(self.process_name_for_pid(pid), signal.SIGKILL)
        self.abnormal.add(pid)
        self.cut_at.setdefault(pid, []).append(killed_at)
        time.sleep(rng.uniform(0.0, 2.0))  # a real process restarting: nothing to inject a clock into
        self.start(victim if rng.random() < 0.5 else f"{victim}-r{self._starts}")
        assert wait_for(lambda: failover_s(self.lines(), pid, killed_at) is not None, timeout_s=40), (
            f"seed={SEED}: no failover after SIGKILL of {victim}"
        )
        return failover_s(self.lines(), pid, killed_at)

    def process_name_for_pid(self, pid: int) -> str:
        return next(name for name, p in self.group.processes.items() if p.pid == pid)

    def sigstop_past_the_lease(self, rng: random.Random, store: DynamoDBLeaseStore) -> tuple[float | None, list[str]]:
        """SIGSTOP a busy worker until others took its shards (> the lease duration), then SIGCONT it."""
        victim = self.busy_worker(rng)
        pid = self.live[victim]
        name = self.process_name_for_pid(pid)
        held = self.holding(pid)
        stopped_at = time.monotonic()
        self.group.signal(name, signal.SIGSTOP)
        self.abnormal.add(pid)
        self.cut_at.setdefault(pid, []).append(stopped_at)
        try:
            taken = wait_for(lambda: failover_s(self.lines(), pid, stopped_at) is not None, timeout_s=40)
            time.sleep(rng.uniform(0.0, 1.0))
            before = {lease.lease_key: lease for lease in store.list_leases() if lease.lease_key in held}
        finally:
            self.group.signal(name, signal.SIGCONT)
        assert taken, f"seed={SEED}: shards of the stopped {victim} were not taken over"
        failover = failover_s(self.lines(), pid, stopped_at)
        # The resumed worker notices at its next beat; the leader may give it leases again (assigned, or handed
        # over by a rebalancing move). Watch for two lease durations: a former lease that the table says the resumed
        # worker processes (its actual owner: checkpointOwner during a hand-off, else leaseOwner) must get a new
        # session of it, or move on, within the failover time — never stay owned by a worker that does not serve it.
        stranded_since: dict[str, float] = {}
        stranded_for: dict[str, float] = {}
        watch_until = time.monotonic() + 2 * LEASE_S
        while time.monotonic() < watch_until:
            now = time.monotonic()
            reinit = {x.shard for x in self.lines() if x.pid == pid and x.kind == "INIT" and x.t > stopped_at}
            for key in before:
                current = store.get_lease(key)
                if current is not None and current.actual_owner == victim and key not in reinit:
                    since = stranded_since.setdefault(key, now)
                    stranded_for[key] = max(stranded_for.get(key, 0.0), now - since)
                else:
                    stranded_since.pop(key, None)
            time.sleep(0.2)
        problems = fenced_after_stop(self.lines(), pid, stopped_at)
        problems += [
            f"{key}: owned by the resumed {victim} without a new session for {s:.1f} s"
            for key, s in sorted(stranded_for.items())
            if s > LEASE_S
        ]
        for key, old in before.items():
            new = store.get_lease(key)
            assert new is not None
            if _rewound(old, new):
                problems.append(f"{key}: checkpoint moved back from {old.checkpoint} to {new.checkpoint}")
        return failover, problems

    def shutdown_all(self) -> dict[str, int | None]:
        for worker_id in list(self.live):
            self.group.signal(self.process_name(worker_id), signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for worker_id in list(self.live):
            name = self.process_name(worker_id)
            try:
                codes[worker_id] = self.group.wait(name, timeout_s=40)
            except Exception:
                codes[worker_id] = None
        return codes


def in_mode(rows: WorkerMetricsStore, fleet: Fleet, liveness: str) -> bool:
    """Every live worker's beat says it runs in ``liveness`` (the scenario tests the mode it claims to)."""
    return set(worker_liveness(rows, fleet.live).values()) == {liveness}


def _rewound(old: Lease, new: Lease) -> bool:
    a, b = old.checkpoint, new.checkpoint
    if a.sequence.isdigit() and b.sequence.isdigit():
        return (int(b.sequence), b.sub_sequence) < (int(a.sequence), a.sub_sequence)
    return a.is_shard_end and not b.is_shard_end


def _final_checkpoints_match(store: DynamoDBLeaseStore, lines: list[Line]) -> list[str]:
    """No lease's checkpoint is ahead of what was journaled on its shard (a checkpoint past the processed records
    would lose them on the next restart). Behind is allowed: at-least-once, replayed after a restart."""
    last: dict[str, tuple[int, int]] = {}
    for line in lines:
        if line.kind == "REC":
            last[line.shard] = max(last.get(line.shard, (-1, -1)), (int(line.a), int(line.b)))
    problems = []
    for lease in store.list_leases():
        cp = lease.checkpoint
        if cp.sequence.isdigit() and (int(cp.sequence), cp.sub_sequence) > last.get(lease.lease_key, (-1, -1)):
            problems.append(f"{lease.lease_key}: checkpoint {cp} is past the last journaled record")
    return problems


@pytest.fixture
def moto_setup(moto_aws: AwsConfig, app_name: str) -> tuple[Any, Any, DynamoDBLeaseStore]:
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    return ddb, aws.client("kinesis", moto_aws), DynamoDBLeaseStore(app_name, client=ddb)


@pytest.mark.parametrize("liveness", LIVENESS_MODES)
def test_sigkill_restart_and_sigstop_past_the_lease_lose_nothing(
    moto_setup: tuple[Any, Any, DynamoDBLeaseStore], moto_endpoint: str, app_name: str, tmp_path: Path, liveness: str
) -> None:
    ddb, kinesis, store = moto_setup
    rows = WorkerMetricsStore(app_name, client=ddb)
    rng = random.Random(SEED)
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 4)
    journal = tmp_path / "journal.txt"
    journal.touch()
    args = ["--app", app_name, "--stream", stream, "--endpoint-url", moto_endpoint]
    started = time.monotonic()
    kills: list[float | None] = []
    stops: list[float | None] = []
    problems: list[str] = []
    with process_group(tmp_path) as group:
        fleet = Fleet(group, args, worker_env(journal, liveness), journal)
        # GIVEN an application in liveness mode `liveness`, and 3 workers with embedded leaders sharing 4 shards
        # while a producer writes 100 records/s
        shardlease_liveness(app_name, moto_endpoint, target=liveness)
        for worker_id in ("w1", "w2", "w3"):
            fleet.start(worker_id)
        with Producer(kinesis, stream) as producer:
            assert wait_for(lambda: len({x.shard for x in fleet.lines() if x.kind == "REC"}) == 4, timeout_s=60)
            assert wait_for(lambda: in_mode(rows, fleet, liveness), timeout_s=10), worker_liveness(rows, fleet.live)
            # WHEN, round after round, a random busy worker is SIGKILLed and restarted, and another is frozen
            # with SIGSTOP past its lease duration and then resumed (order and victims from the seed)
            for _ in range(ROUNDS):
                actions = rng.choice(
                    [["kill", "stop"], ["stop", "kill"], ["kill"], ["stop"]]
                    if ROUNDS > 1
                    else [
                        ["kill", "stop"],
                        ["stop", "kill"],
                    ]
                )
                for action in actions:
                    if action == "kill":
                        kills.append(fleet.sigkill_and_restart(rng))
                    else:
                        failover, found = fleet.sigstop_past_the_lease(rng, store)
                        stops.append(failover)
                        problems += found
            producer.stop()
        produced = producer.produced
        # THEN every produced record is processed (bounded wait)
        assert wait_for(lambda: {x.c for x in fleet.lines() if x.kind == "REC"} >= set(produced), timeout_s=60), (
            f"seed={SEED}: records still missing"
        )
        # AND a graceful stop of every live worker exits 0
        served_until = time.monotonic()
        codes = fleet.shutdown_all()
    lines = read_lines(journal)
    verdict = check_journal(lines, produced, abnormal_pids=fleet.abnormal, lease_bound_s=LEASE_S)
    problems += verdict.violations
    problems += _final_checkpoints_match(store, lines)
    unserved = unserved_s(lines, cut_at=fleet.cut_at, until=served_until)
    problems += [f"{shard}: unserved for {s:.1f} s" for shard, s in sorted(unserved.items()) if s > MAX_UNSERVED_S]
    record_figures(
        "processes-moto",
        {
            "liveness": liveness,
            "seed": SEED,
            "rounds": ROUNDS,
            "sigkill": len(kills),
            "sigstop": len(stops),
            "failover_kill_s": kills,
            "failover_stop_s": stops,
            "max_unserved_s": max(unserved.values(), default=0.0),
            "runtime_s": round(time.monotonic() - started, 1),
            "producer_errors": producer.errors,
            **verdict.figures(),
        },
    )
    # AND the journal and the lease table satisfy every invariant; the fence held for the resumed worker
    assert not problems, f"seed={SEED}: {problems[:10]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED}: exit codes {codes}"
    # AND failover after SIGKILL or a freeze is bounded: lock takeover + lease expiry + a few cycles
    assert all(f is not None and f < 20 for f in kills + stops), f"seed={SEED}: failover {kills} {stops}"


@pytest.mark.kinesalite
@pytest.mark.parametrize("liveness", LIVENESS_MODES)
def test_split_and_merge_while_producing_with_worker_processes(  # noqa: PLR0917 - pytest passes them positionally
    kinesalite_endpoint: str, moto_aws: AwsConfig, moto_endpoint: str, app_name: str, tmp_path: Path, liveness: str
) -> None:
    rng = random.Random(SEED + 1)
    ddb = aws.client("dynamodb", moto_aws)
    ensure_tables(app_name, ddb)
    store = DynamoDBLeaseStore(app_name, client=ddb)
    rows = WorkerMetricsStore(app_name, client=ddb)
    kinesis = aws.client("kinesis", AwsConfig(endpoint_url=kinesalite_endpoint, max_attempts=3))
    stream = f"{app_name}-s"
    create_stream(kinesis, stream, 3)
    journal = tmp_path / "journal.txt"
    journal.touch()
    args = ["--app", app_name, "--stream", stream, "--endpoint-url", moto_endpoint]
    env = {**worker_env(journal, liveness), "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesalite_endpoint}
    started = time.monotonic()
    kills: list[float | None] = []
    with process_group(tmp_path) as group:
        fleet = Fleet(group, args, env, journal)
        # GIVEN an application in liveness mode `liveness`, 3 worker processes (Kinesis on kinesalite, leases on
        # moto) and a steady producer
        shardlease_liveness(app_name, moto_endpoint, target=liveness)
        for worker_id in ("w1", "w2", "w3"):
            fleet.start(worker_id)
        with Producer(kinesis, stream) as producer:
            assert wait_for(lambda: len({x.shard for x in fleet.lines() if x.kind == "REC"}) == 3, timeout_s=60)
            assert wait_for(lambda: in_mode(rows, fleet, liveness), timeout_s=10), worker_liveness(rows, fleet.live)
            for _ in range(ROUNDS):
                shards = [
                    s
                    for s in list_all_shards(kinesis, stream)
                    if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})
                ]
                shards.sort(key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
                # WHEN a random open shard is split while records keep coming
                split_shard(kinesis, stream, rng.choice(shards)["ShardId"])
                time.sleep(rng.uniform(0.5, 2.0))
                if ROUNDS > 1 and rng.random() < 0.5:  # longer runs only: keep CI within its budget
                    kills.append(fleet.sigkill_and_restart(rng))
                # AND two random adjacent open shards are merged
                shards = [
                    s
                    for s in list_all_shards(kinesis, stream)
                    if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})
                ]
                shards.sort(key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
                i = rng.randrange(len(shards) - 1)
                merge_shards(kinesis, stream, shards[i]["ShardId"], shards[i + 1]["ShardId"])
                time.sleep(rng.uniform(0.5, 2.0))
            producer.stop()
        produced = producer.produced
        # THEN every record is processed, children only after their parents ended
        assert wait_for(lambda: {x.c for x in fleet.lines() if x.kind == "REC"} >= set(produced), timeout_s=90), (
            f"seed={SEED}: records still missing"
        )
        served_until = time.monotonic()
        codes = fleet.shutdown_all()
    parents = {
        s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p]
        for s in list_all_shards(kinesis, stream)
    }
    lines = read_lines(journal)
    verdict = check_journal(lines, produced, abnormal_pids=fleet.abnormal, parents=parents, lease_bound_s=LEASE_S)
    problems = verdict.violations + _final_checkpoints_match(store, lines)
    unserved = unserved_s(lines, cut_at=fleet.cut_at, until=served_until)
    problems += [f"{shard}: unserved for {s:.1f} s" for shard, s in sorted(unserved.items()) if s > MAX_UNSERVED_S]
    record_figures(
        "reshard-kinesalite",
        {
            "liveness": liveness,
            "seed": SEED,
            "rounds": ROUNDS,
            "splits": ROUNDS,
            "merges": ROUNDS,
            "sigkill": len(kills),
            "failover_kill_s": kills,
            "max_unserved_s": max(unserved.values(), default=0.0),
            "runtime_s": round(time.monotonic() - started, 1),
            "producer_errors": producer.errors,
            **verdict.figures(),
        },
    )
    assert not problems, f"seed={SEED}: {problems[:10]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED}: exit codes {codes}"
