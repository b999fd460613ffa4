"""Exactly-once effects through process chaos (issue 39; docs/exactly-once.md), once per sink: DynamoDB (outputs
staged and committed with the checkpoint in TransactWriteItems), sqlite3 and PostgreSQL (outputs and the shard's
position in one transaction of the database, fenced by the lease's token).

Real `shardlease worker` processes with embedded leaders (leases on moto, Kinesis on kinesalite: moto routes
records to a closed parent after a reshard) run tests/support/exactly_once_processor.py while a producer writes
50 records/s. In each round, in an order drawn from the seed:

* kill: a busy worker SIGKILLed at its sink's worst moment (held at a gate: DynamoDB with a batch's outputs staged,
  not committed; SQL with a batch committed in the database, not in the lease — the next owner must start after the
  sink's position, which its log says), and restarted;
* zombie: a busy worker held at its gate before the commit (outputs staged, or rows written), frozen with SIGSTOP
  until its shards were taken over, then resumed: its commit must be refused, "transaction refused … (fenced)";
* term: a busy worker stopped with SIGTERM (exit 0) and restarted;
* rebalance: a worker started, so that the leader (by lease count) moves a lease to it by a graceful hand-off;
* leader: the worker holding the leader lock SIGKILLed, restarted under a new id;
* reshard: a shard split (in longer runs, once the stream grew by two, two adjacent shards merged).

Then, with everything drained: the sink holds every produced record's effect exactly once — 0 duplicates, 0 lost —
and every live worker exits 0 on SIGTERM. The refused transactions of all workers are counted (a recorded figure,
``refused``), as are the records delivered more than once (``redelivered``: at-least-once deliveries whose effects
landed once).

Every wait is a liveness bound derived from the fleet's timings (tests/support/stalls.py); how fast anything went
is a figure only (bench/failover.py measures it).

    SHARDLEASE_CHAOS_SEED=7 SHARDLEASE_CHAOS_ROUNDS=5 .venv/bin/pytest tests/chaos/test_exactly_once_chaos.py -s

CI runs one round with the default seed. The seed is printed with every failure.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.conftest import App
from tests.support.chaos import Timings, chaos_rounds, chaos_seed, failover_s, holding
from tests.support.exactly_once_fleet import Effects, ExactlyOnceFleet, SinkSpec
from tests.support.exactly_once_processor import AFTER, BEFORE, SINKS
from tests.support.processes import EMBEDDED_LEADER_ENV, FAST_ENV, PROCESS_START_S, fleet_start_s
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.assignment.config import AssignmentConfig
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.leader.lock import DynamoDBLeaderLock
from worker_lib.testing.producers import Producer
from worker_lib.testing.streams import list_all_shards, merge_shards, split_shard

SHARDS = 4
RATE = 50  # records/s: dozens of records in flight at every fault; the DynamoDB sink's items stay few on moto
WORKERS = ("w1", "w2", "w3")
WORKER_ENV = {
    **EMBEDDED_LEADER_ENV,
    # by lease count: a worker that joins takes a lease from one holding more, by a graceful hand-off
    "SHARDLEASE_ASSIGNMENT_STRATEGY": "count",
}
# What every worker runs with (FAST_ENV under WORKER_ENV): failover 3 s, lock 3 s + 0.5 s skew bound, leader cycle
# and fast tick 0.5 s, discovery 0.2 s, shard sync 1 s, parent poll 0.5 s.
TIMINGS = Timings.of({**FAST_ENV, **WORKER_ENV})
# A victim's shards in other workers' sessions, had it been the leader too: the lock's takeover, then a silent worker.
FAILOVER_EXPECTED_S = TIMINGS.leader_takeover_s + TIMINGS.silent_worker_s
# Every record's effect in the sink once the producer stopped: a shard may be in transit, a child waiting for its
# lease and its parents.
DRAIN_EXPECTED_S = FAILOVER_EXPECTED_S + TIMINGS.assignment_s + TIMINGS.parent_poll_s
# A worker that joins gets a lease by a hand-off: it starts and reports, a balancing run (every few full cycles)
# asks the donor, whose consumer checkpoints and lets go at its next step, and the joiner notices.
HANDOFF_EXPECTED_S = (
    PROCESS_START_S
    + AssignmentConfig().balancing_frequency * TIMINGS.cycle_s
    + TIMINGS.heartbeat_s
    + TIMINGS.idle_s
    + TIMINGS.notice_s
)
# A busy worker's next delivery (the producer's records arrive every 0.1 s, on every shard within a few ticks).
DELIVERY_EXPECTED_S = TIMINGS.idle_s + TIMINGS.discovery_s
ROUNDS = chaos_rounds()
SEED = chaos_seed()
ACTIONS = ("kill", "zombie", "term", "rebalance", "leader", "reshard")

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.kinesalite, pytest.mark.timeout(120 + 90 * ROUNDS)]


class Chaos:
    """One run's fleet, stream and seeded choices; each action returns its figure and adds what went wrong to
    :attr:`problems`."""

    def __init__(self, sink: str, fleet: ExactlyOnceFleet, app: App, rng: random.Random) -> None:
        self.sink, self.fleet, self.app, self.rng = sink, fleet, app, rng
        self.problems: list[str] = []
        self.figures: dict[str, list[Any]] = {action: [] for action in ACTIONS}

    def wait(
        self,
        predicate: Callable[[], bool],
        *,
        bound_s: float,
        what: str,
        detail: Callable[[], str] | None = None,
        step_s: float = 0.1,
    ) -> bool:
        """A liveness wait whose miss is a problem of the run (``detail()`` added), not the end of it: the sink's
        verdict says more."""
        try:
            eventually(predicate, bound_s=bound_s, what=f"seed={SEED}: {what}", step_s=step_s)
        except AssertionError as exc:
            self.problems.append(str(exc) if detail is None else f"{exc}\n{detail()}")
            return False
        return True

    def _failover(self, pid: int, at: float, what: str) -> float | None:
        """Seconds until every shard ``pid`` held at ``at`` was in another process's session."""
        self.wait(
            lambda: failover_s(self.fleet.lines(), pid, at) is not None,
            bound_s=hang_bound_s(FAILOVER_EXPECTED_S),
            what=what,
        )
        return failover_s(self.fleet.lines(), pid, at)

    def _non_leaders(self) -> list[str]:
        leader = self.fleet.leader()
        return [w for w in self.fleet.live_workers() if w != leader]

    def _restart(self, victim: str, *, new_id: bool) -> str:
        worker_id = f"{victim}-r{self.fleet.starts}" if new_id else victim
        self.fleet.start_chaos_worker(worker_id)
        self.fleet.wait_started(worker_id)
        return worker_id

    def kill(self) -> dict[str, Any]:
        """SIGKILL a busy worker (not the leader) at its sink's worst moment, and restart it (same or a new worker
        id). DynamoDB: a batch's outputs staged, not committed (the next owner must commit them, once). SQL: a batch
        committed in the database, not in the lease (the next owner must start after the sink's position)."""
        point = BEFORE if self.sink == "dynamodb" else AFTER
        victim = self.rng.choice(self.fleet.busy(self._non_leaders()))
        name, pid = self.fleet.latest[victim], self.fleet.pid(victim)
        resumed = self.fleet.resumed_after_sink()  # (lease -> times a next owner started after the sink's position)
        self.fleet.close_gate(pid, point)
        try:
            reached = self.wait(
                lambda: bool(self.fleet.held(pid, point)),
                bound_s=hang_bound_s(DELIVERY_EXPECTED_S),
                what=f"{victim} (pid {pid}) never reached its gate {point} the commit",
            )
            killed_at = self.fleet.signal(name, signal.SIGKILL)
        finally:
            self.fleet.open_gate(pid, point)
        held = self.fleet.held(pid, point)
        self._restart(victim, new_id=self.rng.random() < 0.5)
        failover = self._failover(pid, killed_at, f"no failover after SIGKILL of {victim} (pid {pid})")
        if reached and point == AFTER:
            self.wait(
                lambda: all(self.fleet.resumed_after_sink()[lease] > resumed[lease] for lease in held),
                bound_s=hang_bound_s(FAILOVER_EXPECTED_S),
                what=f"{held} of the killed {victim}: no next owner started after the sink's position",
            )
        return {"victim": victim, "held": held, "failover_s": failover}

    def zombie(self) -> dict[str, Any]:
        """Hold a busy worker (not the leader) at its gate before the commit, its outputs staged or written; freeze
        it there (SIGSTOP) until its shards were taken over; resume it: its commit must be refused (fenced)."""
        victim = self.rng.choice(self.fleet.busy(self._non_leaders()))
        name, pid = self.fleet.latest[victim], self.fleet.pid(victim)
        self.fleet.close_gate(pid, BEFORE)
        failover: float | None = None
        try:
            if not self.wait(
                lambda: bool(self.fleet.held(pid, BEFORE)),
                bound_s=hang_bound_s(DELIVERY_EXPECTED_S),
                what=f"{victim} (pid {pid}) never reached its gate before the commit",
            ):
                return {"victim": victim}
            stopped_at = self.fleet.signal(name, signal.SIGSTOP)
            self.fleet.open_gate(pid, BEFORE)  # opened while it is frozen: on waking, its held commits go on
            failover = self._failover(pid, stopped_at, f"the shards of {victim} (pid {pid}), frozen, not taken over")
        finally:
            self.fleet.open_gate(pid, BEFORE)
            self.fleet.signal(name, signal.SIGCONT)
        held = self.fleet.held(pid, BEFORE)
        # its held commits go on at once on waking (the gate is polled every 50 ms)
        self.wait(
            lambda: self.fleet.refused(name) >= 1,
            bound_s=hang_bound_s(TIMINGS.failover_s),
            what=f"the zombie {victim} (pid {pid}, held on {held}) logged no refused transaction",
            detail=lambda: self.fleet.log(name)[-3000:],
        )
        return {
            "victim": victim,
            "held": held,
            "failover_s": failover,
            "refused": self.fleet.refused(name),
            "lines": self.fleet.refused_lines(name)[:3],
        }

    def term(self) -> float | None:
        """SIGTERM a busy worker (it must exit 0), and restart it (unless a joiner grew the fleet past three)."""
        victim = self.rng.choice(self.fleet.busy())
        name, pid = self.fleet.latest[victim], self.fleet.pid(victim)
        code = self.fleet.stop_workers([victim])[victim]
        if code != 0:
            self.problems.append(f"seed={SEED}: {victim} (pid {pid}) exited {code} after SIGTERM")
        term_at = self.fleet.processes[name].sent("SIGTERM")
        assert term_at is not None
        if len(self.fleet.live_workers()) < len(WORKERS):
            self._restart(victim, new_id=False)
        return self._failover(pid, term_at, f"the shards of {victim} (pid {pid}), stopped, not served again")

    def _settle(self) -> None:
        """Wait until every open shard is in a live worker's session (none in transit, no child unassigned)."""
        shards = {s["ShardId"] for s in open_shards(self.app.kinesis, self.app.stream)}

        def settled() -> bool:
            lines = self.fleet.lines()
            served = {shard for w in self.fleet.live_workers() for shard in holding(lines, self.fleet.pid(w))}
            return shards <= served

        self.wait(settled, bound_s=hang_bound_s(DRAIN_EXPECTED_S), what=f"the open shards {sorted(shards)} not served")

    def rebalance(self) -> dict[str, Any]:
        """Start a worker once every open shard is served: the leader, balancing by lease count, moves a lease to it
        by a graceful hand-off. (A joiner gets a lease only if the fleet has fewer workers than open shards: in
        longer runs a random worker is stopped first when it would not.)"""
        self._settle()
        left: list[str] = []
        while len(self.fleet.live_workers()) + 1 > len(open_shards(self.app.kinesis, self.app.stream)):
            victim = self.rng.choice(self.fleet.live_workers())
            code = self.fleet.stop_workers([victim])[victim]
            if code != 0:
                self.problems.append(f"seed={SEED}: {victim} exited {code} after SIGTERM")
            left.append(victim)
            self._settle()
        before = self.fleet.handoffs()
        joiner = next(f"w{n}" for n in range(len(WORKERS) + 1, 1000) if f"w{n}" not in self.fleet.latest)
        self.fleet.start_chaos_worker(joiner)
        self.fleet.wait_started(joiner)
        self.wait(
            lambda: self.fleet.handoffs() > before and bool(self.fleet.holding(joiner)),
            bound_s=hang_bound_s(HANDOFF_EXPECTED_S),
            what=f"no lease handed off to the joiner {joiner}",
        )
        return {"joiner": joiner, "left": left, "handoffs": self.fleet.handoffs() - before}

    def leader(self) -> float | None:
        """SIGKILL the worker whose embedded leader holds the lock; restart it under a new worker id (the lock's
        next holder is then told from the dead one by name)."""
        live: list[str] = []

        def has_leader() -> bool:
            leader = self.fleet.leader()
            live[:] = [w for w in self.fleet.live_workers() if w == leader]
            return bool(live)

        if not self.wait(has_leader, bound_s=hang_bound_s(TIMINGS.leader_takeover_s), what="no live leader"):
            return None
        victim = live[0]
        pid = self.fleet.pid(victim)
        killed_at = self.fleet.signal(self.fleet.latest[victim], signal.SIGKILL)
        self._restart(victim, new_id=True)
        self.wait(
            lambda: self.fleet.leader() not in (None, victim),
            bound_s=hang_bound_s(TIMINGS.leader_takeover_s),
            what=f"no new leader after SIGKILL of the leader {victim}",
        )
        return self._failover(pid, killed_at, f"no failover after SIGKILL of the leader {victim} (pid {pid})")

    def reshard(self) -> str:
        """Split a random open shard (merge two adjacent ones instead once the stream has grown by two)."""
        shards = open_shards(self.app.kinesis, self.app.stream)
        if len(shards) >= SHARDS + 2:
            i = self.rng.randrange(len(shards) - 1)
            merge_shards(self.app.kinesis, self.app.stream, shards[i]["ShardId"], shards[i + 1]["ShardId"])
            return f"merge {shards[i]['ShardId']} {shards[i + 1]['ShardId']}"
        shard = self.rng.choice(shards)["ShardId"]
        split_shard(self.app.kinesis, self.app.stream, shard)
        return f"split {shard}"

    def run(self, action: str) -> None:
        self.figures[action].append(getattr(self, action)())


def open_shards(kinesis: Any, stream: str) -> list[dict[str, Any]]:
    """The stream's open shards, lowest hash range first."""
    shards = [
        s for s in list_all_shards(kinesis, stream) if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})
    ]
    return sorted(shards, key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))


def sink_spec(kind: str, app: App, tmp_path: Path, request: pytest.FixtureRequest) -> SinkSpec:
    if kind == "dynamodb":
        return SinkSpec(kind, app.name, f"{app.name}-out")
    if kind == "sqlite3":
        return SinkSpec(kind, app.name, "eo_outputs", sqlite_path=str(tmp_path / "sink.db"))
    return SinkSpec(kind, app.name, "eo_outputs", dsn=str(request.getfixturevalue("postgres_dsn")))


def who_wrote(fleet: ExactlyOnceFleet, spec: SinkSpec, effects: Effects, keys: list[str]) -> list[str]:
    """For a failure message: each duplicated effect's rows (token, writer) and its record's deliveries."""
    writers = spec.writers(keys)
    lines = fleet.lines()

    def name(pid: int) -> str:
        process = fleet.by_pid(pid)
        return f"{process.name if process else '?'} (pid {pid})"

    out = []
    for key in keys:
        data = effects.data.get(key, "?")
        rows = [f"token {token} by {name(pid)}" for token, pid in writers.get(key, [])]
        delivered = [f"{name(x.pid)} at {x.t:.3f}" for x in lines if x.kind == "REC" and x.c == data]
        out.append(f"{key} ({data}): rows {rows or '-'}, delivered to {delivered}")
    return out


def where_lost(fleet: ExactlyOnceFleet, producer: Producer, ids: list[str]) -> list[str]:
    """For a failure message: where each lost record was put, and who it was delivered to."""
    placed, lines = producer.placed(), fleet.lines()
    out = []
    for rid in ids:
        put = placed.get(rid)
        delivered = [f"pid {x.pid} {x.shard} {x.a} at {x.t:.3f}" for x in lines if x.kind == "REC" and x.c == rid]
        out.append(f"{rid} put in {put.shard_id if put else '?'}, delivered to {delivered or 'nobody'}")
    return out


@pytest.mark.parametrize("sink", SINKS)
def test_every_record_lands_exactly_once_through_kills_a_zombie_stops_handoffs_a_leader_kill_and_a_reshard(
    sink: str, app: App, kinesalite_endpoint: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    app = replace(app, kinesis=aws.client("kinesis", AwsConfig(endpoint_url=kinesalite_endpoint, max_attempts=3)))
    app.create_stream(SHARDS)
    spec = sink_spec(sink, app, tmp_path, request)
    spec.create(app.ddb)
    gates = tmp_path / "gates"
    gates.mkdir()
    env = {
        **WORKER_ENV,
        **spec.env(),
        "SHARDLEASE_CHAOS_JOURNAL": str(app.journal),
        "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesalite_endpoint,
    }
    fleet = ExactlyOnceFleet(
        tmp_path,
        args=app.args,
        env=env,
        journal=app.journal,
        gate_dir=gates,
        lock=DynamoDBLeaderLock(app.name, "observer", client=app.ddb),  # reads only: current_leader()
        labels={"sink": sink, "seed": SEED, "rounds": ROUNDS},
    )
    with fleet:
        # GIVEN 3 workers with embedded leaders on a 4-shard stream, each record's effect committed with the shard's
        # position in the sink, while a producer writes RATE records/s
        for worker_id in WORKERS:
            fleet.start_chaos_worker(worker_id)
        chaos = Chaos(sink, fleet, app, rng)
        with Producer(app.kinesis, app.stream, per_tick=RATE // 10, tick_s=0.1) as producer:
            eventually(
                lambda: fleet.shards_processed() == SHARDS,
                bound_s=hang_bound_s(fleet_start_s(len(WORKERS)) + TIMINGS.start_s),
                what=f"seed={SEED}: not every shard processed after the start",
            )
            # WHEN, round after round, in an order drawn from the seed: a SIGKILL and restart, a zombie refused at
            # its commit, a SIGTERM and restart, a joiner given a lease by hand-off, the leader SIGKILLed, a reshard
            for _ in range(ROUNDS):
                actions = list(ACTIONS)
                rng.shuffle(actions)
                for action in actions:
                    chaos.run(action)
            producer.stop()
        produced = producer.produced
        # THEN every produced record's effect reaches the sink once the fleet drained
        missing: list[str] = []

        def drained() -> bool:
            missing[:] = spec.effects(app.ddb).lost(produced)
            return not missing

        chaos.wait(
            drained,
            bound_s=hang_bound_s(DRAIN_EXPECTED_S),
            step_s=1.0,  # (a read of the whole sink each time)
            what="effects still missing",
            detail=lambda: f"{len(missing)} missing, e.g. {missing[:5]}",
        )
        # AND a graceful stop of every live worker exits 0
        codes = fleet.stop_workers()
        effects = spec.effects(app.ddb)
        lines = fleet.lines()
    deliveries = Counter(x.c for x in lines if x.kind == "REC")
    duplicates, lost = effects.duplicates(), effects.lost(produced)
    verdict = fleet.verdict(produced)
    fleet.record(
        f"exactly-once-{sink}",
        verdict,
        producer,
        effects=sum(effects.counts.values()),
        duplicates=len(duplicates),
        lost=len(lost),
        doubly_put=len(effects.doubly_put()),
        unacknowledged=len(effects.ids() - set(produced)),
        redelivered=sum(1 for n in deliveries.values() if n > 1),
        refused=fleet.refused(),
        handoffs=fleet.handoffs(),
        journal_violations=verdict.violations[:5],
        wall_s=round(time.monotonic() - started, 1),
        **{action: chaos.figures[action] for action in ACTIONS},
    )
    # AND the sink holds every produced record exactly once: none twice, none missing
    assert not duplicates, (
        f"seed={SEED} sink={sink}: {len(duplicates)} records' effects landed more than once, e.g. "
        f"{dict(list(duplicates.items())[:10])}; {who_wrote(fleet, spec, effects, list(duplicates)[:5])}"
    )
    assert not lost, (
        f"seed={SEED} sink={sink}: {len(lost)} of {len(produced)} records lost, e.g. "
        f"{where_lost(fleet, producer, lost[:5])}"
    )
    # AND every fault was survived within its liveness bound, the zombie's commit refused, every stop clean
    assert not chaos.problems, f"seed={SEED} sink={sink}: {chaos.problems[:5]}"
    assert all(code == 0 for code in codes.values()), f"seed={SEED} sink={sink}: exit codes {codes}"
    assert fleet.refused() >= ROUNDS, f"seed={SEED} sink={sink}: {fleet.refused()} refused transactions"
