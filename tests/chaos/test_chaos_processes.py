"""Seedable chaos with real `shardlease worker` processes (each with an embedded leader) and a steady producer.

Scenario A (moto): 3 workers on 4 shards; random SIGKILL + restart (same or new worker id), and a SIGSTOP
longer than the lease duration followed by SIGCONT — the resumed worker journals nothing on a shard another
process took, and no checkpoint moves backwards. Scenario B (kinesalite for Kinesis, moto for DynamoDB): a split
and a merge while producing, with a random SIGKILL in between in longer runs.

Both scenarios run in each liveness mode (docs/liveness-modes.md): ``lease`` (every lease renewed) and ``worker``
(the heartbeat alone proves a worker alive; the frozen worker's shards move once its heartbeat stood still for the
failover time, and on waking its first heartbeat reply comes after its fence ran out). The mode is recorded with
``shardlease liveness --set`` before the first process starts, and every process is configured for it. One case
of each runs key-ordered lanes (docs/worker.md; within CI's time, as cases of the two scenarios, not more of them):
scenario A in worker mode with parallelism 8 on threads (and a SIGTERM + restart of a busy worker in each round),
scenario B in lease mode with an async processor at parallelism 8; records then share 24 lane keys
(``tests.support.chaos:lane_key``), and each delivery takes a while, so that lanes have records waiting.

Invariants (tests/support/chaos.py, ``check_journal``), the same in both modes and exact whatever the load: nothing
lost; duplicates only after an abnormal ownership change and only past the new session's start checkpoint;
per-session order; nothing after a session's LOST; children after their parents' END; one owner at a time (once
another process started a session on a shard, the earlier owner journals there only the batch it had been handed
before). With lanes: order per key within a session; after a graceful stop, duplicates only of records past the
watermark it left; the earlier owner's deliveries after the next one's start at most one per lane and parallelism in
all, each handed over before it. Every wait is a liveness bound derived from the fleet's configured timings
(tests/support/stalls.py); the failover and unserved seconds are recorded figures — bench/failover.py measures them
(kill, stop, leader).

    SHARDLEASE_CHAOS_SEED=7 SHARDLEASE_CHAOS_ROUNDS=20 .venv/bin/pytest tests/chaos -s   # the longer run

CI runs one round with the default seed. The seed is printed with every failure.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.conftest import App
from tests.support.chaos import (
    ASYNC_PROCESSOR,
    DELIVERY_ENV,
    LANE_KEY,
    PROCESSOR,
    Line,
    Timings,
    chaos_rounds,
    chaos_seed,
    failover_s,
    unserved_s,
    worker_liveness,
)
from tests.support.chaos_fleet import ChaosFleet
from tests.support.processes import EMBEDDED_LEADER_ENV, FAST_ENV, liveness_env, shardlease_liveness
from tests.support.stalls import eventually, hang_bound_s, stall_note
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import Lease
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import list_all_shards, merge_shards, split_shard

# What every worker process runs with (FAST_ENV under EMBEDDED_LEADER_ENV): failover 3 s, lock 3 s + 0.5 s skew
# bound, leader cycle and fast tick 0.5 s, discovery 0.2 s, shard sync 1 s, parent poll 0.5 s.
TIMINGS = Timings.of({**FAST_ENV, **EMBEDDED_LEADER_ENV})
# A victim's shards in other workers' sessions, when it was also the leader: the lock's takeover, then a silent
# worker's failover (the liveness bound of every failover wait and of the longest unserved time).
FAILOVER_EXPECTED_S = TIMINGS.leader_takeover_s + TIMINGS.silent_worker_s
# Every record processed once the producer stopped: a shard may still be in transit, or a child shard waiting for
# its lease and its parents.
DRAIN_EXPECTED_S = FAILOVER_EXPECTED_S + TIMINGS.assignment_s + TIMINGS.parent_poll_s
ROUNDS = chaos_rounds()
SEED = chaos_seed()

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(120 + 90 * ROUNDS)]

PARALLELISM = 8  # the lanes cases' SHARDLEASE_PARALLELISM
# With lanes, each delivery takes this long: records wait behind their lane's delivery in flight, and ready lanes for
# a runner, so a kill, a freeze or a stop finds deliveries in flight and records waiting.
LANE_DELIVERY_MS = 300


def labels(liveness: str, parallelism: int, processor: str) -> dict[str, Any]:
    """What each scenario's figures say about its run."""
    return {"liveness": liveness, "parallelism": parallelism, "processor": processor, "seed": SEED, "rounds": ROUNDS}


def worker_env(journal: Path, liveness: str, parallelism: int = 1) -> dict[str, str]:
    """Every worker's environment; with ``parallelism`` > 1, lanes keyed by ``lane_key``, slow deliveries."""
    laned = (
        {
            "SHARDLEASE_PARALLELISM": str(parallelism),
            "SHARDLEASE_LANE_KEY": LANE_KEY,
            DELIVERY_ENV: str(LANE_DELIVERY_MS),
        }
        if parallelism > 1
        else {}
    )
    return {
        **liveness_env(liveness),
        "SHARDLEASE_CHAOS_JOURNAL": str(journal),
        **EMBEDDED_LEADER_ENV,
        **laned,
    }


@contextmanager
def producing(fleet: ChaosFleet, app: App, liveness: str, *, shards: int) -> Iterator[Producer]:
    """Record the application's liveness mode (before any process starts), start w1, w2 and w3, and produce 100
    records/s; once every shard is processed and every worker says it runs in ``liveness``, the producer."""
    shardlease_liveness(app.name, app.endpoint, target=liveness)
    for worker_id in ("w1", "w2", "w3"):
        fleet.start_chaos_worker(worker_id)
    with Producer(app.kinesis, app.stream) as producer:
        eventually(
            lambda: fleet.shards_processed() == shards,
            bound_s=hang_bound_s(TIMINGS.start_s),
            what=f"seed={SEED}: not every shard processed after the start",
        )
        eventually(
            lambda: in_mode(app, fleet, liveness),
            bound_s=hang_bound_s(TIMINGS.heartbeat_s),
            what=f"seed={SEED}: the workers do not all say {liveness}",
        )
        yield producer


def in_mode(app: App, fleet: ChaosFleet, liveness: str) -> bool:
    """Every live worker's beat says it runs in ``liveness`` (the scenario tests the mode it claims to)."""
    return set(worker_liveness(app.rows, fleet.live_workers()).values()) == {liveness}


def sigkill_and_restart(fleet: ChaosFleet, rng: random.Random) -> float | None:
    """SIGKILL a random busy worker, restart it (same or a new worker id); its failover time."""
    victim = rng.choice(fleet.busy())
    pid = fleet.pid(victim)
    killed_at = fleet.signal(fleet.latest[victim], signal.SIGKILL)
    time.sleep(rng.uniform(0.0, 2.0))  # a real process restarting: nothing to inject a clock into
    restarted = victim if rng.random() < 0.5 else f"{victim}-r{fleet.starts}"
    fleet.start_chaos_worker(restarted)
    fleet.wait_started(restarted)
    eventually(
        lambda: failover_s(fleet.lines(), pid, killed_at) is not None,
        bound_s=hang_bound_s(FAILOVER_EXPECTED_S),
        what=f"seed={SEED}: no failover after SIGKILL of {victim}",
    )
    return failover_s(fleet.lines(), pid, killed_at)


def sigterm_and_restart(fleet: ChaosFleet, rng: random.Random) -> tuple[float | None, list[str]]:
    """SIGTERM a random busy worker (a graceful stop: lanes drained, the watermark written), wait for its exit,
    restart it under the same worker id; its shards' failover time, and what went wrong (its exit code)."""
    victim = rng.choice(fleet.busy())
    pid, name = fleet.pid(victim), fleet.latest[victim]
    code = fleet.stop_workers([victim])[victim]
    term_at = fleet.processes[name].sent("SIGTERM")
    assert term_at is not None
    fleet.start_chaos_worker(victim)
    fleet.wait_started(victim)  # (its shards may be served by others at once: the next action may come right away)
    eventually(
        lambda: failover_s(fleet.lines(), pid, term_at) is not None,
        bound_s=hang_bound_s(FAILOVER_EXPECTED_S),
        what=f"seed={SEED}: shards of the stopped {victim} not served again",
    )
    problems = [] if code == 0 else [f"{victim} (pid {pid}) exited {code} after SIGTERM"]
    return failover_s(fleet.lines(), pid, term_at), problems


def sigstop_past_the_lease(
    fleet: ChaosFleet, rng: random.Random, store: DynamoDBLeaseStore
) -> tuple[float | None, list[str]]:
    """SIGSTOP a busy worker until others took its shards (> the lease duration), then SIGCONT it."""
    victim = rng.choice(fleet.busy())
    pid = fleet.pid(victim)
    name = fleet.latest[victim]
    held = fleet.holding(victim)
    stopped_at = fleet.signal(name, signal.SIGSTOP)
    try:
        eventually(
            lambda: failover_s(fleet.lines(), pid, stopped_at) is not None,
            bound_s=hang_bound_s(FAILOVER_EXPECTED_S),
            what=f"seed={SEED}: shards of the stopped {victim} were not taken over",
        )
        time.sleep(rng.uniform(0.0, 1.0))  # how long it stays frozen past the takeover: seeded, real time
        before = {lease.lease_key: lease for lease in store.list_leases() if lease.lease_key in held}
    finally:
        fleet.signal(name, signal.SIGCONT)
    failover = failover_s(fleet.lines(), pid, stopped_at)
    # The resumed worker notices at its next beat; the leader may give it leases again (assigned, or handed
    # over by a rebalancing move). A former lease that the table says the resumed worker processes (its actual
    # owner: checkpointOwner during a hand-off, else leaseOwner) must get a new session of it, or move on — never
    # stay owned by a worker that does not serve it. Sampled over two lease durations (a fixed watch: there is no
    # event to wait for); a lease still stranded then is waited for, until the liveness bound of a silent worker's
    # lease moving on has passed since it was first seen stranded.

    def stranded() -> set[str]:
        reinit = {x.shard for x in fleet.lines() if x.pid == pid and x.kind == "INIT" and x.t > stopped_at}
        owned = {key for key in before if _actual_owner(store, key) == victim}
        return owned - reinit

    stranded_since: dict[str, float] = {}

    def sample() -> set[str]:
        now, found = time.monotonic(), stranded()
        for key in found:
            stranded_since.setdefault(key, now)
        for key in set(stranded_since) - found:
            del stranded_since[key]
        return found

    watch_until = time.monotonic() + 2 * TIMINGS.failover_s
    while time.monotonic() < watch_until:
        sample()
        time.sleep(0.2)
    problems = fleet.fenced_after_stop(pid, stopped_at)
    if sample():
        bound = hang_bound_s(TIMINGS.silent_worker_s)
        first = min(stranded_since.values())
        try:
            eventually(
                lambda: not sample(),
                bound_s=max(0.0, first + bound - time.monotonic()),
                what=f"{sorted(stranded_since)}: owned by the resumed {victim} without a new session since "
                f"{time.monotonic() - first:.1f} s (liveness bound {bound:.0f} s)",
            )
        except AssertionError as exc:
            problems.append(str(exc))
    for key, old in before.items():
        new = store.get_lease(key)
        assert new is not None
        if _rewound(old, new):
            problems.append(f"{key}: checkpoint moved back from {old.checkpoint} to {new.checkpoint}")
    return failover, problems


def _actual_owner(store: DynamoDBLeaseStore, key: str) -> str | None:
    lease = store.get_lease(key)
    return None if lease is None else lease.actual_owner


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


def drained(fleet: ChaosFleet, produced: list[str]) -> None:
    """Every produced record processed, within the liveness bound of a drain after the last fault."""
    eventually(
        lambda: fleet.processed_all(produced),
        bound_s=hang_bound_s(DRAIN_EXPECTED_S),
        what=f"seed={SEED}: records still missing",
    )


def judge(
    scenario: str,
    fleet: ChaosFleet,
    store: DynamoDBLeaseStore,
    producer: Producer,
    *,
    served_until: float,
    parents: dict[str, list[str]] | None = None,
    **figures: Any,
) -> list[str]:
    """The journal invariants, the final checkpoints and the unserved times; what failed. The scenario's figures
    are recorded with the verdict's."""
    lines = fleet.lines()
    verdict = fleet.verdict(producer.produced, parents=parents)
    problems = verdict.violations + _final_checkpoints_match(store, lines)
    # (how long a shard went without a session is a speed figure — bench/failover.py measures it; here it is only
    # checked against the liveness bound of a failover, the probe's view of the run named with a miss)
    unserved = unserved_s(lines, cut_at=fleet.cut_at(), until=served_until)
    bound = hang_bound_s(FAILOVER_EXPECTED_S)
    problems += [
        f"{shard}: unserved for {s:.1f} s (liveness bound {bound:.0f} s); {stall_note(fleet.started)}"
        for shard, s in sorted(unserved.items())
        if s > bound
    ]
    fleet.record(scenario, verdict, producer, **figures, max_unserved_s=max(unserved.values(), default=0.0))
    return problems


@pytest.mark.parametrize(
    ("liveness", "parallelism"), [("lease", 1), ("worker", PARALLELISM)], ids=["lease", "worker-lanes-8"]
)
def test_sigkill_restart_and_sigstop_past_the_lease_lose_nothing(
    app: App, tmp_path: Path, liveness: str, parallelism: int
) -> None:
    rng = random.Random(SEED)
    app.create_stream(4)
    kills: list[float | None] = []
    stops: list[float | None] = []
    terms: list[float | None] = []
    problems: list[str] = []
    env = worker_env(app.journal, liveness, parallelism)
    with app.fleet(tmp_path, env, labels=labels(liveness, parallelism, "sync")) as fleet:
        # GIVEN an application in liveness mode `liveness`, and 3 workers with embedded leaders sharing 4 shards
        # (with `parallelism` > 1: in lanes keyed by 24 record keys) while a producer writes 100 records/s
        with producing(fleet, app, liveness, shards=4) as producer:
            # WHEN, round after round, a random busy worker is SIGKILLed and restarted, and another is frozen
            # with SIGSTOP past its lease duration and then resumed (order and victims from the seed); with lanes,
            # one more is stopped with SIGTERM and restarted
            for _ in range(ROUNDS):
                actions = rng.choice(
                    [["kill", "stop"], ["stop", "kill"], ["kill"], ["stop"]]
                    if ROUNDS > 1
                    else [
                        ["kill", "stop"],
                        ["stop", "kill"],
                    ]
                )
                if parallelism > 1:
                    actions.insert(rng.randrange(len(actions) + 1), "term")
                for action in actions:
                    if action == "kill":
                        kills.append(sigkill_and_restart(fleet, rng))
                    elif action == "term":
                        failover, found = sigterm_and_restart(fleet, rng)
                        terms.append(failover)
                        problems += found
                    else:
                        failover, found = sigstop_past_the_lease(fleet, rng, app.store)
                        stops.append(failover)
                        problems += found
            producer.stop()
        produced = producer.produced
        # THEN every produced record is processed
        drained(fleet, produced)
        # AND a graceful stop of every live worker exits 0
        served_until = time.monotonic()
        codes = fleet.stop_workers()
    problems += judge(
        "processes-moto",
        fleet,
        app.store,
        producer,
        served_until=served_until,
        sigkill=len(kills),
        sigstop=len(stops),
        sigterm=len(terms),
        failover_kill_s=kills,
        failover_stop_s=stops,
        failover_term_s=terms,
    )
    # AND the journal and the lease table satisfy every invariant (with lanes: per-key order, duplicates only past
    # the watermark); the fence held for the resumed worker
    assert not problems, f"seed={SEED}: {problems[:10]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED}: exit codes {codes}"
    # AND every kill, freeze and stop failed over (how fast is recorded above: failover_kill_s, failover_stop_s,
    # failover_term_s)
    assert all(f is not None for f in kills + stops + terms), f"seed={SEED}: failover {kills} {stops} {terms}"


def open_shards(kinesis: Any, stream: str) -> list[dict[str, Any]]:
    """The stream's open shards, lowest hash range first."""
    shards = [
        s for s in list_all_shards(kinesis, stream) if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})
    ]
    return sorted(shards, key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))


@pytest.mark.kinesalite
@pytest.mark.parametrize(
    ("liveness", "parallelism", "processor"),
    [("lease", PARALLELISM, ASYNC_PROCESSOR), ("worker", 1, PROCESSOR)],
    ids=["lease-async-lanes-8", "worker"],
)
def test_split_and_merge_while_producing_with_worker_processes(  # noqa: PLR0917 - pytest passes fixtures and parameters positionally
    kinesalite_endpoint: str, app: App, tmp_path: Path, liveness: str, parallelism: int, processor: str
) -> None:
    rng = random.Random(SEED + 1)
    # (Kinesis on kinesalite: moto keeps routing records to a closed parent after a reshard)
    app = replace(app, kinesis=aws.client("kinesis", AwsConfig(endpoint_url=kinesalite_endpoint, max_attempts=3)))
    app.create_stream(3)
    env = {**worker_env(app.journal, liveness, parallelism), "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesalite_endpoint}
    kills: list[float | None] = []
    kind = "async" if processor == ASYNC_PROCESSOR else "sync"
    with app.fleet(tmp_path, env, labels=labels(liveness, parallelism, kind)) as fleet:
        fleet.processor = processor
        # GIVEN an application in liveness mode `liveness`, 3 worker processes (Kinesis on kinesalite, leases on
        # moto) running `processor` (with `parallelism` > 1: in lanes), and a steady producer
        with producing(fleet, app, liveness, shards=3) as producer:
            for _ in range(ROUNDS):
                # WHEN a random open shard is split while records keep coming (with lanes: a worker then SIGKILLed)
                split_shard(app.kinesis, app.stream, rng.choice(open_shards(app.kinesis, app.stream))["ShardId"])
                time.sleep(rng.uniform(0.5, 2.0))
                # longer runs only, to keep CI within its budget — but the async lanes are killed once in every run
                if (ROUNDS > 1 and rng.random() < 0.5) or (parallelism > 1 and not kills):
                    kills.append(sigkill_and_restart(fleet, rng))
                # AND two random adjacent open shards are merged
                shards = open_shards(app.kinesis, app.stream)
                i = rng.randrange(len(shards) - 1)
                merge_shards(app.kinesis, app.stream, shards[i]["ShardId"], shards[i + 1]["ShardId"])
                time.sleep(rng.uniform(0.5, 2.0))
            producer.stop()
        produced = producer.produced
        # THEN every record is processed, children only after their parents ended (with lanes: in order per key)
        drained(fleet, produced)
        served_until = time.monotonic()
        codes = fleet.stop_workers()
    parents = {
        s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p]
        for s in list_all_shards(app.kinesis, app.stream)
    }
    problems = judge(
        "reshard-kinesalite",
        fleet,
        app.store,
        producer,
        served_until=served_until,
        parents=parents,
        splits=ROUNDS,
        merges=ROUNDS,
        sigkill=len(kills),
        failover_kill_s=kills,
    )
    assert not problems, f"seed={SEED}: {problems[:10]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED}: exit codes {codes}"
