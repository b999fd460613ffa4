"""Chaos-test support: a timestamped journal processor, journal invariants, the fleet's timings, DynamoDB faults.

Journal lines (one ``write`` each, O_APPEND, so the file order is the global order of writes)::

    <monotonic s> <pid> <shard> REC <sequence> <sub-sequence> <data> <delivered s>
    <monotonic s> <pid> <shard> INIT <checkpoint sequence> <checkpoint sub-sequence> -
    <monotonic s> <pid> <shard> SHUTDOWN <checkpoint sequence> <checkpoint sub-sequence> -
    <monotonic s> <pid> <shard> LOST|END - - -

(``<pid>`` is the worker's tag for in-process workers: several share one process.) Every REC line of one delivery
(one ``process_records`` call) carries the same stamp and is written in one ``write``: a batch is told by its
stamp. ``<delivered s>`` is when the consumer handed the batch over (its ``cache_exit_time``, taken right after
its fence check; in a lane, when the lane's delivery started), on the same clock. A SHUTDOWN line carries the
checkpoint the session left (with lanes, the watermark: records past it may be processed again by the next owner).

``time.monotonic()`` is CLOCK_MONOTONIC on Linux: one clock for every process on the machine, so the test
process can compare its own readings (when it sent SIGKILL) with the workers' lines. A starved machine makes
every stamp late, never out of order: the invariants compare stamps only with each other, never with a duration.

``shardlease worker --processor tests.support.chaos:ChaosProcessor`` with ``SHARDLEASE_CHAOS_JOURNAL=/path``
(``AsyncChaosProcessor``: the same journal from an ``async def process_records``; with
``SHARDLEASE_LANE_KEY=tests.support.chaos:lane_key`` records share :data:`KEYS` lane keys).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import botocore.exceptions
from botocore.awsrequest import AWSResponse, HTTPHeaders
from botocore.httpsession import URLLib3Session

from worker_lib.core.env import env_int
from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.mode import LivenessMode
from worker_lib.leases.renewer import LeaseHolder
from worker_lib.leases.store import LeaseStore
from worker_lib.processing.config import LaneKeyFunction
from worker_lib.processing.lanes import lane_count, lane_of
from worker_lib.processing.processor import (
    AsyncCheckpointer,
    InitializationInput,
    KinesisRecord,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from worker_lib.shardsync.config import ShardSyncConfig
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

DEFAULT_SEED = 20240607
PROCESSOR = "tests.support.chaos:ChaosProcessor"
ASYNC_PROCESSOR = "tests.support.chaos:AsyncChaosProcessor"
LANE_KEY = "tests.support.chaos:lane_key"
DELIVERY_ENV = "SHARDLEASE_CHAOS_DELIVERY_MS"
KEYS = 24  # lane keys of the records with LANE_KEY: each has many records on every shard, and 8 lanes all get some


def chaos_seed() -> int:
    raw = os.environ.get("SHARDLEASE_CHAOS_SEED", "")
    return int(raw) if raw.strip() else DEFAULT_SEED


def chaos_rounds() -> int:
    raw = os.environ.get("SHARDLEASE_CHAOS_ROUNDS", "")
    return max(1, int(raw)) if raw.strip() else 1


# --- the processor (runs inside `shardlease worker`) --------------------------------------------------------------


def record_key(data: str) -> str:
    """The lane key of a producer's record (``r0000047`` -> ``k7``): its number modulo :data:`KEYS`. (The
    producer's partition key is the record id, one record per key: with it, per-key order would say nothing.)"""
    digits = "".join(ch for ch in data.split("|", 1)[0] if ch.isdigit())
    return f"k{int(digits) % KEYS}"


def lane_key(record: KinesisRecord) -> str:
    """``SHARDLEASE_LANE_KEY=tests.support.chaos:lane_key``: :func:`record_key` of the record's data."""
    return record_key(record.data.decode())


def journal_key(key_of: LaneKeyFunction) -> Callable[[str], str]:
    """A worker's lane key function applied to a journaled record (its data): the producer's records carry their
    id as data and as partition key."""
    return lambda data: key_of(KinesisRecord(data=data.encode(), partition_key=data, sequence_number="0"))


class _Journaling:
    """What both chaos processors journal: one ``write`` per call (O_APPEND), from any thread. Each delivery takes
    ``$SHARDLEASE_CHAOS_DELIVERY_MS`` (default 0) before it journals: records queue up in lanes behind deliveries in
    flight, as behind a processor that calls a service."""

    def __init__(self, path: str | None = None, *, tag: int | None = None) -> None:
        self.path = path if path is not None else os.environ["SHARDLEASE_CHAOS_JOURNAL"]
        self.tag = tag
        self.delivery_s = env_int(os.environ, DELIVERY_ENV, 0) / 1000

    def _append(self, lines: list[str]) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, "".join(lines).encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _line(
        self,
        shard: str,
        kind: str,
        a: str = "-",
        b: str = "-",
        c: str = "-",
        *,
        t: float | None = None,
        delivered: float | None = None,
    ) -> str:
        tag = os.getpid() if self.tag is None else self.tag
        tail = "" if delivered is None else f" {delivered:.6f}"
        return f"{time.monotonic() if t is None else t:.6f} {tag} {shard} {kind} {a} {b} {c}{tail}\n"

    def _records(self, input: ProcessRecordsInput) -> list[str]:
        """The delivery's REC lines, one stamp for all of them (the journal tells a delivery by it)."""
        wall = time.time()
        now = time.monotonic()
        delivered = _delivered_at(input, wall=wall, now=now)
        return [
            self._line(
                input.shard_id,
                "REC",
                r.sequence_number,
                str(r.sub_sequence_number),
                r.data.decode(),
                t=now,
                delivered=delivered,
            )
            for r in input.records
        ]

    def initialize(self, input: InitializationInput) -> None:
        cp = input.checkpoint
        self._append([self._line(input.shard_id, "INIT", cp.sequence, str(cp.sub_sequence))])

    def lease_lost(self, input: LeaseLostInput) -> None:
        self._append([self._line(input.shard_id, "LOST")])

    def shard_ended(self, input: ShardEndedInput) -> None:
        self._append([self._line(input.shard_id, "END")])
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        # journaled after the checkpoint, with what it left: the next owner starts there (the lease moves only after
        # this returns)
        try:
            input.checkpointer.checkpoint()
        finally:
            cp = input.checkpointer.last_checkpoint
            a, b = ("-", "-") if cp is None else (cp.sequence, str(cp.sub_sequence))
            self._append([self._line(input.shard_id, "SHUTDOWN", a, b)])


class ChaosProcessor(_Journaling):
    """Journals every record *before* checkpointing (so a checkpointed record is always in the journal).

    In a ``shardlease worker`` process it takes the journal from ``$SHARDLEASE_CHAOS_JOURNAL`` and tags its lines
    with the process id; in-process workers (several in one process) give a journal and a tag of their own.
    Thread-safe: with lanes, several deliveries of a shard run at once."""

    def process_records(self, input: ProcessRecordsInput) -> None:
        lines = self._records(input)
        if self.delivery_s:
            time.sleep(self.delivery_s)
        self._append(lines)
        input.checkpointer.checkpoint()


class AsyncChaosProcessor(_Journaling):
    """:class:`ChaosProcessor` with ``async def process_records``: its lanes are tasks on the worker's event loop;
    the journal's write and fsync run on a thread, so other lanes go on meanwhile."""

    async def process_records(self, input: ProcessRecordsInput) -> None:
        lines = self._records(input)
        if self.delivery_s:
            await asyncio.sleep(self.delivery_s)
        await asyncio.to_thread(self._append, lines)
        checkpointer = input.checkpointer
        assert isinstance(checkpointer, AsyncCheckpointer)  # an async processor is given the awaitable forms
        await checkpointer.acheckpoint()


def _delivered_at(input: ProcessRecordsInput, *, wall: float, now: float) -> float:
    """When the consumer handed the batch over (``cache_exit_time``, a wall-clock time), on the monotonic clock:
    ``now`` minus the wall time since. ``wall`` is read just before ``now``: a pause between the two readings makes
    the result later, never earlier, than the hand-over."""
    handed = input.cache_exit_time
    if handed is None:
        return now
    return now - max(0.0, wall - handed.timestamp())


@dataclass(frozen=True)
class Line:
    index: int  # position in the file (global order)
    t: float
    pid: int
    shard: str
    kind: str
    a: str
    b: str
    c: str
    delivered: float | None = None  # REC lines: when the consumer handed the batch over (monotonic)

    @property
    def handed_over(self) -> float:
        """When the record was delivered (its line's own stamp, later, if the line does not say)."""
        return self.t if self.delivered is None else self.delivered


def read_lines(path: Path) -> list[Line]:
    out: list[Line] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        parts = raw.split()
        if len(parts) in (7, 8):
            t, pid, shard, kind, a, b, c = parts[:7]
            delivered = float(parts[7]) if len(parts) == 8 else None
            out.append(Line(len(out), float(t), int(pid), shard, kind, a, b, c, delivered))
    return out


# --- invariants ------------------------------------------------------------------------------------------------------


def _seq_key(sequence: str, sub: str) -> tuple[int, int]:
    return int(sequence), int(sub)


def _checkpoint_covers(at: Line, rec: Line) -> bool:
    """Whether the checkpoint on ``at`` — a session's INIT (where it started) or SHUTDOWN (where it left) — already
    includes ``rec`` (then processing it again is a bug)."""
    if not at.a.isdigit():
        return at.a == "SHARD_END"  # TRIM_HORIZON / LATEST / AT_TIMESTAMP cover nothing
    return _seq_key(at.a, at.b) >= _seq_key(rec.a, rec.b)


@dataclass
class Verdict:
    """What the journal shows. ``violations`` is empty when every invariant holds."""

    produced: int = 0
    processed: int = 0
    unique: int = 0
    duplicated: int = 0
    lost: int = 0
    sessions: int = 0
    in_flight_after_successor: int = 0  # sessions that journaled their batch in flight after the next owner's INIT
    max_overlap_s: float = 0.0  # a figure only: the longest time two owners' journaled records overlapped
    violations: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "violations"}


def check_journal(
    lines: list[Line],
    produced: list[str],
    *,
    abnormal_pids: set[int],
    parents: dict[str, list[str]] | None = None,
    key_of: Callable[[str], str] | None = None,
    parallelism: int = 1,
) -> Verdict:
    """Every invariant of the chaos suite, from one journal; none of them depends on how fast anything ran.

    * no record lost: every produced record has a REC line;
    * duplicates only after an ownership change, only for records the new session's start checkpoint did not
      cover, and only when the first processing session ended abnormally (its process killed or stopped, or
      its lease lost);
    * per-shard order within one ownership session (INIT to the next INIT of that pid and shard);
    * nothing processed in a session after its LOST line (the lease was lost: processing stops there);
    * a child shard's first record comes after every parent's END line;
    * one owner at a time (:func:`two_owners`): once another process's session started on a shard, the earlier
      session journals there only the one batch it had been handed before that start.

    With lanes (``key_of``: a record's lane key from its data; ``parallelism``: the workers'), order holds per key
    within a session, not per shard; a session that ended normally (SHUTDOWN) may have processed records past the
    checkpoint it left (the watermark: a later lane was done before an earlier one), so those — and only those — may
    be processed again; and the earlier owner may journal, after the next owner's INIT, the deliveries it had in
    flight then: one per lane, ``parallelism`` at most (:func:`two_owners`).
    """
    v = Verdict(produced=len(produced))
    session_of: dict[int, int] = {}  # REC line index -> INIT line index
    open_session: dict[tuple[int, str], Line] = {}
    lost_sessions: set[int] = set()
    left_at: dict[int, Line] = {}  # session (INIT line index) -> its SHUTDOWN line: the checkpoint it left
    last_seq: dict[tuple[int, str], tuple[int, int]] = {}  # (session, key; the shard without lanes) -> last record
    first_rec: dict[str, int] = {}
    ended: dict[str, int] = {}
    recs: list[Line] = []
    for line in lines:
        key = (line.pid, line.shard)
        if line.kind == "INIT":
            open_session[key] = line
            v.sessions += 1
        elif line.kind == "REC":
            init = open_session.get(key)
            if init is None:
                v.violations.append(f"record without INIT: {line}")
                continue
            session_of[line.index] = init.index
            seq = _seq_key(line.a, line.b)
            ordered = (init.index, line.shard if key_of is None else key_of(line.c))
            if seq <= last_seq.get(ordered, (-1, -1)):
                what = "" if key_of is None else f" for key {ordered[1]}"
                v.violations.append(f"order broken{what} in session {init.index}: {line}")
            last_seq[ordered] = seq
            first_rec.setdefault(line.shard, line.index)
            recs.append(line)
        elif line.kind == "LOST" and key in open_session:
            lost_sessions.add(open_session[key].index)
        elif line.kind == "SHUTDOWN" and key in open_session:
            left_at.setdefault(open_session[key].index, line)
        if line.kind == "REC" and line.index in session_of and session_of[line.index] in lost_sessions:
            v.violations.append(f"record after its session's LOST line (the fence did not hold): {line}")
        elif line.kind == "END":
            ended.setdefault(line.shard, line.index)
    by_index = {line.index: line for line in lines}
    v.processed = len(recs)
    counts = Counter(r.c for r in recs)
    v.unique = len(counts)
    v.duplicated = sum(n - 1 for n in counts.values())
    missing = set(produced) - set(counts)
    v.lost = len(missing)
    if missing:
        v.violations.append(f"{len(missing)} records lost, e.g. {sorted(missing)[:5]}")
    first_seen: dict[str, Line] = {}
    # in delivery order, not file order: a frozen owner journals its delivery in flight on waking, after its successor
    # may have processed the same records (the earlier owner is the one that had them first)
    for rec in sorted(recs, key=lambda r: (r.handed_over, r.index)):
        earlier = first_seen.get(rec.c)
        if earlier is None:
            first_seen[rec.c] = rec
            continue
        s1, s2 = session_of[earlier.index], session_of[rec.index]
        if s1 == s2:
            v.violations.append(f"{rec.c} processed twice in one session {s1}")
            continue
        if _checkpoint_covers(by_index[s2], rec):
            v.violations.append(f"{rec.c} re-processed although session {s2} started from a checkpoint covering it")
        if earlier.pid in abnormal_pids or s1 in lost_sessions:
            continue
        left = left_at.get(s1)
        if key_of is None or left is None:
            v.violations.append(f"{rec.c} duplicated but its first session {s1} (pid {earlier.pid}) ended normally")
        elif _checkpoint_covers(left, rec):
            v.violations.append(
                f"{rec.c} duplicated although its first session {s1} (pid {earlier.pid}) ended normally at a "
                f"checkpoint covering it ({left.a} {left.b}, line {left.index})"
            )
    for child, ps in (parents or {}).items():
        if child not in first_rec:
            continue
        for parent in ps:
            if parent not in ended:
                v.violations.append(f"child {child} processed but parent {parent} never ended")
            elif ended[parent] > first_rec[child]:
                v.violations.append(f"child {child} processed (line {first_rec[child]}) before {parent} ended")
    owners = two_owners(lines, key_of=key_of, parallelism=parallelism)
    v.violations += owners.violations
    v.in_flight_after_successor = owners.in_flight
    v.max_overlap_s = _max_overlap_s(recs, session_of, by_index)
    return v


@dataclass
class Owners:
    """What :func:`two_owners` found: its violations, and how many sessions journaled their batch in flight after
    the next owner's INIT (allowed: KCL's semantics of a batch already handed over)."""

    violations: list[str] = field(default_factory=list)
    in_flight: int = 0


def two_owners(
    lines: list[Line],
    *,
    pid: int | None = None,
    since: float | None = None,
    key_of: Callable[[str], str] | None = None,
    parallelism: int = 1,
) -> Owners:
    """One owner at a time, by journal order and the fence: once another process started a session on a shard (its
    INIT line), an earlier session there journals at most one batch after that line — the batch it had been handed
    before that INIT (its delivery stamp precedes the INIT's) — and nothing else until it starts a new session.

    Why this holds exactly, whatever the load: the consumer checks its fence before every delivery; the lease moves
    only once that fence ran out (the leader expires a lease or a silent worker only after the failover time of
    its own observation, later than the owner's fence); the next owner's INIT comes after it took the lease. So a
    delivery after that INIT is a fence that did not hold, and a second batch after it is one too (the batch in
    flight ends in a checkpoint that fails: the session ends). A killed process journals nothing more; a frozen
    one may journal, when woken, the batch it had been handed before its freeze — the same rule.

    With lanes (``key_of``: a record's lane key from its data; ``parallelism``: the workers') the same rule holds per
    lane (:func:`~worker_lib.processing.lanes.lane_of` of the key among the shard's
    :func:`~worker_lib.processing.lanes.lane_count` lanes): a lane delivers one delivery at a time, ``parallelism``
    lane deliveries run at once, and none starts once the lease ran out — so after that INIT, at most one delivery per
    lane and ``parallelism`` in all, each handed over (its lane delivery started) before it. (A delivery journaled
    after that INIT was in flight at it: a delivery journals before it returns.)

    The only stamp compared is the delivery's with the INIT's: both are readings of one machine clock, late on a
    starved machine but never out of order. (The delivery stamp is the consumer's ``cache_exit_time``, taken a few
    statements after its fence check: a process frozen exactly between the two, past the whole lease move, would be
    reported although its check held — a window of microseconds.)

    ``pid``: judge that process's sessions only; ``since``: only successors whose INIT is stamped at or after it
    (:func:`fenced_after_stop`)."""
    found = Owners()
    open_init: dict[tuple[int, str], Line] = {}  # (pid, shard) -> the INIT of its current session
    successor: dict[tuple[int, str], Line] = {}  # (pid, shard) -> the first INIT of another process since then
    # (session INIT, successor INIT) -> lane -> delivery stamps after it (one lane, 0, without lanes)
    batches: dict[tuple[int, int], dict[int, set[float]]] = {}
    lanes = lane_count(parallelism) if key_of is not None else 1
    for line in lines:
        key = (line.pid, line.shard)
        if line.kind == "INIT":
            open_init[key] = line
            successor.pop(key, None)
            if since is None or line.t >= since:
                for (other, shard), init in open_init.items():
                    if shard == line.shard and other != line.pid and init.index < line.index:
                        successor.setdefault((other, shard), line)
        elif line.kind == "REC" and key in successor and (pid is None or line.pid == pid):
            nxt = successor[key]
            lane = 0 if key_of is None else lane_of(key_of(line.c), lanes)
            stamps = batches.setdefault((open_init[key].index, nxt.index), {}).setdefault(lane, set())
            if line.t in stamps:
                continue  # the rest of a batch already judged
            stamps.add(line.t)
            deliveries = sum(len(each) for each in batches[(open_init[key].index, nxt.index)].values())
            where = "" if key_of is None else f" in lane {lane}"
            if line.handed_over >= nxt.t:
                found.violations.append(
                    f"{line.shard}: pid {line.pid} journaled a batch ({line.c}){where} handed over to it at "
                    f"{line.handed_over:.3f}, after pid {nxt.pid} had started its session there at {nxt.t:.3f} "
                    f"(line {nxt.index}): two owners at once"
                )
            elif len(stamps) > 1:
                found.violations.append(
                    f"{line.shard}: pid {line.pid} journaled a batch ({line.c}){where} after the one it had in flight "
                    f"when pid {nxt.pid} started its session there (line {nxt.index}): two owners at once"
                )
            elif deliveries > parallelism:
                found.violations.append(
                    f"{line.shard}: pid {line.pid} journaled a batch ({line.c}){where}, its delivery number "
                    f"{deliveries} after pid {nxt.pid} started its session there (line {nxt.index}), more than the "
                    f"{parallelism} it can have in flight: two owners at once"
                )
    found.in_flight = sum(1 for by_lane in batches.values() if by_lane)
    return found


def _max_overlap_s(recs: list[Line], session_of: dict[int, int], by_index: dict[int, Line]) -> float:
    """The figure ``max_overlap_s``: for each shard, how long (by the lines' stamps) the later of two processes'
    sessions had journaled records before the earlier one's last record. Reported, never judged (a stamp taken on
    a starved machine is late): :func:`two_owners` is the invariant."""
    per_session: dict[int, list[float]] = {}
    for rec in recs:
        per_session.setdefault(session_of[rec.index], []).append(rec.t)
    spans: dict[str, list[tuple[float, float, int]]] = {}
    for s, times in per_session.items():
        init = by_index[s]
        spans.setdefault(init.shard, []).append((min(times), max(times), init.pid))
    worst = 0.0
    for items in spans.values():
        items.sort()
        for (_, end1, pid1), (start2, _, pid2) in itertools.pairwise(items):
            if pid1 != pid2:
                worst = max(worst, round(end1 - start2, 3))
    return worst


def fenced_after_stop(
    lines: list[Line],
    stopped_pid: int,
    stopped_at: float,
    *,
    key_of: Callable[[str], str] | None = None,
    parallelism: int = 1,
) -> list[str]:
    """Violations of the fence of a process frozen (SIGSTOP) or cut off (its heartbeats failing) at
    ``stopped_at``: on a shard another process started a session on after ``stopped_at``, the stopped pid journals
    nothing until it starts a new session of its own there — but the one batch (with lanes: one per lane, at most
    ``parallelism``) it had been handed before that session started (:func:`two_owners`, for this pid)."""
    return two_owners(lines, pid=stopped_pid, since=stopped_at, key_of=key_of, parallelism=parallelism).violations


def unserved_s(lines: list[Line], *, cut_at: Mapping[int, Sequence[float]], until: float) -> dict[str, float]:
    """The longest time each shard went without a session of any process, from its first INIT until its END (or
    ``until``, when the test stopped watching).

    A session of ``pid`` on a shard runs from its INIT until its LOST, END or SHUTDOWN line, the same pid's next
    INIT there, or the first moment in ``cut_at[pid]`` after it started (the test killed or froze that process:
    it serves nothing from then on, whatever it journals on waking)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    ended: dict[str, float] = {}
    open_at: dict[tuple[int, str], float] = {}

    def close(key: tuple[int, str], at: float) -> None:
        start = open_at.pop(key, None)
        if start is None:
            return
        cuts = [c for c in cut_at.get(key[0], ()) if c >= start]
        spans.setdefault(key[1], []).append((start, min([at, *cuts])))

    for line in lines:
        key = (line.pid, line.shard)
        if line.kind == "INIT":
            close(key, line.t)
            open_at[key] = line.t
        elif line.kind in ("LOST", "END", "SHUTDOWN"):
            close(key, line.t)
            if line.kind == "END":
                ended.setdefault(line.shard, line.t)
    for key in list(open_at):
        close(key, until)
    worst: dict[str, float] = {}
    for shard, items in spans.items():
        items.sort()
        horizon = ended.get(shard, until)
        covered_to = items[0][0]
        gap = 0.0
        for start, end in items:
            if start > horizon:
                break
            gap = max(gap, start - covered_to)
            covered_to = max(covered_to, end)
        worst[shard] = round(max(gap, horizon - covered_to), 2)
    return worst


def holding(lines: list[Line], pid: int) -> set[str]:
    """Shards ``pid`` (or in-process tag) has an open session on, according to the journal."""
    held: set[str] = set()
    for line in lines:
        if line.pid == pid and line.kind == "INIT":
            held.add(line.shard)
        elif line.pid == pid and line.kind in ("LOST", "END", "SHUTDOWN"):
            held.discard(line.shard)
    return held


def failover_s(lines: list[Line], pid: int, at: float) -> float | None:
    """Seconds from ``at`` until every shard ``pid`` was processing had a new session by another process."""
    held: set[str] = set()
    for line in lines:
        if line.pid != pid or line.t > at:
            continue
        if line.kind == "INIT":
            held.add(line.shard)
        elif line.kind in ("LOST", "END", "SHUTDOWN"):
            held.discard(line.shard)
    if not held:
        return 0.0  # it had nothing to fail over (rare: its leases moved just before)
    worst = 0.0
    for shard in held:
        starts = [x.t for x in lines if x.shard == shard and x.kind == "INIT" and x.pid != pid and x.t >= at]
        if not starts:
            return None
        worst = max(worst, min(starts) - at)
    return round(worst, 2)


def worker_liveness(rows: WorkerMetricsStore, worker_ids: Iterable[str]) -> dict[str, str | None]:
    """The liveness mode each of ``worker_ids`` says its last beat ran in (``lvm``; ``None``: no beat yet)."""
    said = {row.worker_id: row.heartbeat.liveness for row in rows.list_all(consistent=True) if row.heartbeat}
    return {worker: said.get(worker) for worker in worker_ids}


@dataclass(frozen=True, kw_only=True)
class Timings:
    """The timings a fleet runs with, read from the ``SHARDLEASE_*`` variables its processes get (the product's
    default where one is unset; docs/api.md): what every liveness bound of the chaos suite is derived from, times
    :data:`~tests.support.stalls.HANG_FACTOR` (``hang_bound_s``)."""

    failover_s: float  # SHARDLEASE_FAILOVER_TIME_MS: the lease duration, and how long a silent worker is waited for
    verdict_s: float  # how long a suspended lease waits for a beat's verdict before it counts as lost (renewer.py)
    heartbeat_s: float  # the worker heartbeat in the fleet's liveness mode
    discovery_s: float  # SHARDLEASE_DISCOVERY_INTERVAL_MS; unset or 0: new leases arrive by notice, with a beat
    idle_s: float  # SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS: a consumer's pause between two reads
    lock_s: float  # SHARDLEASE_LEADER_LOCK_DURATION_MS
    lock_beat_s: float  # SHARDLEASE_LEADER_HEARTBEAT_MS
    lock_poll_s: float  # how often a contender re-reads the lock
    skew_s: float  # SHARDLEASE_MAX_CLOCK_SKEW_MS
    cycle_s: float  # SHARDLEASE_LEADER_CYCLE_INTERVAL_MS: the leader's full cycle
    tick_s: float  # SHARDLEASE_LEADER_FAST_TICK_MS: the fast path's read (0: no fast path)
    shard_sync_s: float  # SHARDLEASE_SHARD_SYNC_INTERVAL_MS
    parent_poll_s: float  # SHARDLEASE_PARENT_POLL_INTERVAL_MS: a child shard's wait for its parents
    mode_check_s: float  # SHARDLEASE_LIVENESS_MODE_CHECK_MS
    shutdown_s: float  # SHARDLEASE_SHUTDOWN_TIMEOUT_MS: a SIGTERM'd worker has ended by then, at the latest

    @classmethod
    def of(cls, env: Mapping[str, str]) -> Timings:
        lease = LeaseConfig.from_env(env)
        lock = LeaderLockConfig.from_env(env)
        leader = LeaderConfig.from_env(env)
        mode = LivenessMode.WORKER if lease.liveness_mode == LivenessMode.WORKER.value else LivenessMode.LEASE
        heartbeat_ms = lease.heartbeat_interval_for(mode)
        discovery_ms = env_int(env, "SHARDLEASE_DISCOVERY_INTERVAL_MS", 0)
        # (the verdict's wait is the lease holder's own, derived from the failover time; building one reads nothing)
        verdict_s = LeaseHolder(cast(LeaseStore, None), "timings", config=lease).verdict_timeout_s
        return cls(
            failover_s=lease.failover_s,
            verdict_s=verdict_s,
            heartbeat_s=heartbeat_ms / 1000,
            discovery_s=(discovery_ms or heartbeat_ms) / 1000,
            idle_s=env_int(env, "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS", 1_000) / 1000,
            lock_s=lock.lease_duration_ms / 1000,
            lock_beat_s=lock.heartbeat_interval_ms / 1000,
            lock_poll_s=lock.poll_interval_ms / 1000,
            skew_s=lock.max_clock_skew_ms / 1000,
            cycle_s=leader.cycle_interval_ms / 1000,
            tick_s=leader.fast_tick_ms / 1000,
            shard_sync_s=ShardSyncConfig.from_env(env).interval_ms / 1000,
            parent_poll_s=env_int(env, "SHARDLEASE_PARENT_POLL_INTERVAL_MS", 10_000) / 1000,
            mode_check_s=lease.mode_check_interval_ms / 1000,
            shutdown_s=env_int(env, "SHARDLEASE_SHUTDOWN_TIMEOUT_MS", 30_000) / 1000,
        )

    @property
    def pass_s(self) -> float:
        """How often the leader acts on a worker's silence: its fast tick, or its full cycle without one."""
        return self.tick_s or self.cycle_s

    @property
    def notice_s(self) -> float:
        """How long a worker takes to start on a lease it was given: the leader's notice comes back with its next
        beat, or its own index query finds the lease."""
        return min(self.heartbeat_s, self.discovery_s)

    @property
    def silent_worker_s(self) -> float:
        """A killed, frozen or fenced worker's shards in another worker's sessions: its beat judged silent after
        the failover time (plus the skew bound), seen at one leader pass and acted on at the next, then noticed."""
        return self.failover_s + self.skew_s + 2 * self.pass_s + self.notice_s

    @property
    def fenced_s(self) -> float:
        """A worker whose beats fail: its fence runs out (the failover time after its last beat), its leases are
        suspended, and counted as lost at the verdict of a beat's reply — at the latest when the wait for it ends."""
        return self.failover_s + self.verdict_s

    @property
    def start_s(self) -> float:
        """A fresh application's shards in sessions: a contender takes the free lock (within a poll), its first
        cycle, at once, creates and assigns the leases, and their owners notice."""
        return self.lock_poll_s + self.notice_s

    @property
    def leader_takeover_s(self) -> float:
        """A dead leader replaced: its lock runs out (plus the skew bound) and a contender's next read takes it (its
        first full cycle runs at once)."""
        return self.lock_s + self.skew_s + self.lock_poll_s

    @property
    def assignment_s(self) -> float:
        """A new lease served (a child shard's): created by a shard sync, given by the next full cycle, noticed by
        its new owner."""
        return self.shard_sync_s + self.cycle_s + self.notice_s


def record_figures(name: str, figures: dict[str, Any]) -> None:
    """Print one JSON line, and append it to ``$SHARDLEASE_CHAOS_REPORT`` if set (for docs/reliability.md)."""
    line = json.dumps({"scenario": name, **figures}, sort_keys=True)
    print(line)
    target = os.environ.get("SHARDLEASE_CHAOS_REPORT")
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(line + "\n")


# --- DynamoDB faults (botocore event hooks) ---------------------------------------------------------------------------


def lease_write_kind(body: bytes | str | None, lease_table: str) -> str:
    """Which lease-store write an UpdateItem request body is: renew, checkpoint, assign, evict, other."""
    if not body:
        return "other"
    try:
        request = json.loads(body)
    except ValueError:
        return "other"
    if request.get("TableName") != lease_table:
        return "other"
    expression = str(request.get("UpdateExpression", ""))
    if "#checkpoint = " in expression:
        return "checkpoint"
    if "#leaseOwner = " in expression and "ADD" in expression:
        return "assign"
    if "REMOVE #leaseOwner" in expression:
        return "evict"
    if expression.startswith("SET #leaseCounter = ") and "#leaseOwner" not in expression:
        return "renew"
    return "other"


def heartbeat_of(body: bytes | str | None, metrics_table: str) -> str | None:
    """The worker id whose heartbeat an UpdateItem request body is (``ADD #hbc`` on its worker-metrics item), or
    ``None`` for any other request."""
    if not body:
        return None
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if request.get("TableName") != metrics_table or "ADD #hbc" not in request.get("UpdateExpression", ""):
        return None  # not a beat (the leader's certificate names #hbc only in its condition)
    worker = request.get("Key", {}).get("wid", {}).get("S")
    return str(worker) if worker is not None else None


class RawBody:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


LEASE_WRITES = ("renew", "checkpoint", "assign")


@dataclass
class Fault:
    """One injected fault; ``active`` switches it on and off, ``hits`` counts injections."""

    kind: str  # throttle | 5xx | timeout | lost-reply | landed-timeout
    write: str  # renew | checkpoint | assign | heartbeat | any (UpdateItem only) | an operation name, e.g. "GetItem"
    active: threading.Event = field(default_factory=threading.Event)
    hits: int = 0
    limit: int | None = None
    worker: str | None = None  # write "heartbeat": only this worker's beats (None: every worker's)

    def wanted(self) -> bool:
        return self.active.is_set() and (self.limit is None or self.hits < self.limit)


@contextmanager
def dynamodb_fault(client: Any, fault: Fault, lease_table: str, *, metrics_table: str | None = None) -> Iterator[Fault]:
    """Inject ``fault`` into one DynamoDB client while ``fault.active`` is set.

    * throttle / 5xx: the request never reaches the emulator; botocore sees ProvisionedThroughputExceeded (400)
      or InternalServerError (500) and retries within its budget;
    * timeout: a ReadTimeoutError before sending (not applied), retried by botocore;
    * lost-reply: the request *is* applied, then botocore is told to retry it (the reply was dropped);
    * landed-timeout: the request *is* applied (sent from the hook on a connection of its own), then botocore sees
      a ReadTimeoutError — a write that times out but lands. Botocore retries it, and each retry lands and times
      out too while the fault is on, so the caller sees a failure although every attempt was applied.

    ``write="heartbeat"`` (needs ``metrics_table``) aims at the worker heartbeats (of ``fault.worker`` only, if
    given); ``renew`` / ``checkpoint`` / ``assign`` / ``any`` at the lease writes.
    """
    if fault.write == "heartbeat" and metrics_table is None:
        raise ValueError("a heartbeat fault needs the worker-metrics table")
    operation = "UpdateItem" if fault.write in (*LEASE_WRITES, "heartbeat", "any") else fault.write
    sender = URLLib3Session() if fault.kind == "landed-timeout" else None

    def matches(body: Any) -> bool:
        if fault.write == "heartbeat":
            worker = heartbeat_of(body, str(metrics_table))
            return worker is not None and fault.worker in (None, worker)
        if fault.write == "any":
            return lease_write_kind(body, lease_table) != "other"
        if operation != "UpdateItem":
            return True
        return lease_write_kind(body, lease_table) == fault.write

    def before_send(request: Any, **_: Any) -> AWSResponse | None:
        if fault.kind == "lost-reply" or not fault.wanted() or not matches(request.body):
            return None
        fault.hits += 1
        if fault.kind == "landed-timeout":
            assert sender is not None
            sender.send(request)  # applied by the emulator; its reply never reaches botocore
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=request.url)
        if fault.kind == "timeout":
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=request.url)
        status, code = (
            (400, "ProvisionedThroughputExceededException")
            if fault.kind == "throttle"
            else (
                500,
                "InternalServerError",
            )
        )
        body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": f"injected {code}"})
        headers = HTTPHeaders()
        headers["Content-Type"] = "application/x-amz-json-1.0"
        return AWSResponse(request.url, status, headers, RawBody(body.encode()))

    def needs_retry(response: Any, caught_exception: Any, request_dict: Any, attempts: int, **_: Any) -> float | None:
        if fault.kind != "lost-reply" or attempts > 1 or not fault.wanted() or caught_exception is not None:
            return None  # only the first reply of a request is lost: the re-sent request gets its answer
        if not response:
            return None
        if response[0].status_code != 200 or not matches(request_dict.get("body")):
            return None
        fault.hits += 1
        return 0.0

    uid = f"chaos-fault-{id(fault)}"
    client.meta.events.register_first(f"before-send.dynamodb.{operation}", before_send, unique_id=uid + "-send")
    client.meta.events.register_first(f"needs-retry.dynamodb.{operation}", needs_retry, unique_id=uid + "-retry")
    try:
        yield fault
    finally:
        client.meta.events.unregister(f"before-send.dynamodb.{operation}", unique_id=uid + "-send")
        client.meta.events.unregister(f"needs-retry.dynamodb.{operation}", unique_id=uid + "-retry")
        if sender is not None:
            sender.close()
