"""Chaos-test support: a timestamped journal processor, journal invariants, DynamoDB faults.

Journal lines (one ``write`` each, O_APPEND, so the file order is the global order of writes)::

    <monotonic s> <pid> <shard> REC <sequence> <sub-sequence> <data>
    <monotonic s> <pid> <shard> INIT <checkpoint sequence> <checkpoint sub-sequence> -
    <monotonic s> <pid> <shard> LOST|END|SHUTDOWN - - -

(``<pid>`` is the worker's tag for in-process workers: several share one process.)

``time.monotonic()`` is CLOCK_MONOTONIC on Linux: one clock for every process on the machine, so the test
process can compare its own readings (when it sent SIGKILL) with the workers' lines.

``shardlease worker --processor tests.support.chaos:ChaosProcessor`` with ``SHARDLEASE_CHAOS_JOURNAL=/path``.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.exceptions
from botocore.awsrequest import AWSResponse, HTTPHeaders
from botocore.httpsession import URLLib3Session

from worker_lib.processing.processor import (
    InitializationInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

DEFAULT_SEED = 20240607
PROCESSOR = "tests.support.chaos:ChaosProcessor"


def chaos_seed() -> int:
    raw = os.environ.get("SHARDLEASE_CHAOS_SEED", "")
    return int(raw) if raw.strip() else DEFAULT_SEED


def chaos_rounds() -> int:
    raw = os.environ.get("SHARDLEASE_CHAOS_ROUNDS", "")
    return max(1, int(raw)) if raw.strip() else 1


# --- the processor (runs inside `shardlease worker`) --------------------------------------------------------------


class ChaosProcessor:
    """Journals every record *before* checkpointing (so a checkpointed record is always in the journal).

    In a ``shardlease worker`` process it takes the journal from ``$SHARDLEASE_CHAOS_JOURNAL`` and tags its lines
    with the process id; in-process workers (several in one process) give a journal and a tag of their own."""

    def __init__(self, path: str | None = None, *, tag: int | None = None) -> None:
        self.path = path if path is not None else os.environ["SHARDLEASE_CHAOS_JOURNAL"]
        self.tag = tag

    def _append(self, lines: list[str]) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, "".join(lines).encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _line(self, shard: str, kind: str, a: str = "-", b: str = "-", c: str = "-") -> str:
        tag = os.getpid() if self.tag is None else self.tag
        return f"{time.monotonic():.6f} {tag} {shard} {kind} {a} {b} {c}\n"

    def initialize(self, input: InitializationInput) -> None:
        cp = input.checkpoint
        self._append([self._line(input.shard_id, "INIT", cp.sequence, str(cp.sub_sequence))])

    def process_records(self, input: ProcessRecordsInput) -> None:
        self._append(
            [
                self._line(input.shard_id, "REC", r.sequence_number, str(r.sub_sequence_number), r.data.decode())
                for r in input.records
            ]
        )
        input.checkpointer.checkpoint()

    def lease_lost(self, input: LeaseLostInput) -> None:
        self._append([self._line(input.shard_id, "LOST")])

    def shard_ended(self, input: ShardEndedInput) -> None:
        self._append([self._line(input.shard_id, "END")])
        input.checkpointer.checkpoint()

    def shutdown_requested(self, input: ShutdownRequestedInput) -> None:
        self._append([self._line(input.shard_id, "SHUTDOWN")])
        input.checkpointer.checkpoint()


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


def read_lines(path: Path) -> list[Line]:
    out: list[Line] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        parts = raw.split()
        if len(parts) == 7:
            out.append(Line(len(out), float(parts[0]), int(parts[1]), parts[2], parts[3], parts[4], parts[5], parts[6]))
    return out


# --- invariants ------------------------------------------------------------------------------------------------------


def _seq_key(sequence: str, sub: str) -> tuple[int, int]:
    return int(sequence), int(sub)


def _checkpoint_covers(init: Line, rec: Line) -> bool:
    """Whether the checkpoint a session started from already includes ``rec`` (then re-processing it is a bug)."""
    if not init.a.isdigit():
        return init.a == "SHARD_END"  # TRIM_HORIZON / LATEST / AT_TIMESTAMP cover nothing
    return _seq_key(init.a, init.b) >= _seq_key(rec.a, rec.b)


@dataclass
class Verdict:
    """What the journal shows. ``violations`` is empty when every invariant holds."""

    produced: int = 0
    processed: int = 0
    unique: int = 0
    duplicated: int = 0
    lost: int = 0
    sessions: int = 0
    max_overlap_s: float = 0.0
    violations: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "violations"}


def check_journal(
    lines: list[Line],
    produced: list[str],
    *,
    abnormal_pids: set[int],
    parents: dict[str, list[str]] | None = None,
    lease_bound_s: float = 3.0,
) -> Verdict:
    """Every invariant of the chaos suite, from one journal.

    * no record lost: every produced record has a REC line;
    * duplicates only after an ownership change, only for records the new session's start checkpoint did not
      cover, and only when the first processing session ended abnormally (its process killed or stopped, or
      its lease lost);
    * per-shard order within one ownership session (INIT to the next INIT of that pid and shard);
    * nothing processed in a session after its LOST line (the lease was lost: processing stops there);
    * a child shard's first record comes after every parent's END line;
    * two sessions of different processes on one shard overlap (first record of the later one before the last
      record of the earlier one) by no more than ``lease_bound_s``.
    """
    v = Verdict(produced=len(produced))
    session_of: dict[int, int] = {}  # REC line index -> INIT line index
    open_session: dict[tuple[int, str], Line] = {}
    lost_sessions: set[int] = set()
    last_seq: dict[int, tuple[int, int]] = {}
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
            if seq <= last_seq.get(init.index, (-1, -1)):
                v.violations.append(f"order broken in session {init.index}: {line}")
            last_seq[init.index] = seq
            first_rec.setdefault(line.shard, line.index)
            recs.append(line)
        elif line.kind == "LOST" and key in open_session:
            lost_sessions.add(open_session[key].index)
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
    for rec in recs:
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
        if earlier.pid not in abnormal_pids and s1 not in lost_sessions:
            v.violations.append(f"{rec.c} duplicated but its first session {s1} (pid {earlier.pid}) ended normally")
    for child, ps in (parents or {}).items():
        if child not in first_rec:
            continue
        for parent in ps:
            if parent not in ended:
                v.violations.append(f"child {child} processed but parent {parent} never ended")
            elif ended[parent] > first_rec[child]:
                v.violations.append(f"child {child} processed (line {first_rec[child]}) before {parent} ended")
    spans: dict[str, list[tuple[float, float, int]]] = {}
    per_session: dict[int, list[float]] = {}
    for rec in recs:
        per_session.setdefault(session_of[rec.index], []).append(rec.t)
    for s, times in per_session.items():
        init = by_index[s]
        spans.setdefault(init.shard, []).append((min(times), max(times), init.pid))
    for shard, items in spans.items():
        items.sort()
        for (_, end1, pid1), (start2, _, pid2) in itertools.pairwise(items):
            if pid1 != pid2:
                overlap = end1 - start2
                v.max_overlap_s = max(v.max_overlap_s, round(overlap, 3))
                if overlap > lease_bound_s:
                    v.violations.append(f"{shard}: pids {pid1} and {pid2} overlapped for {overlap:.2f} s")
    return v


def fenced_after_stop(lines: list[Line], stopped_pid: int, stopped_at: float) -> list[str]:
    """Violations of the SIGSTOP fence: a record journaled by ``stopped_pid`` on a shard after another process
    started a session on it (after ``stopped_at``), before ``stopped_pid`` started a new session of its own."""
    violations: list[str] = []
    taken: set[str] = set()
    for line in lines:
        if line.t < stopped_at and line.pid != stopped_pid:
            continue
        if line.kind == "INIT" and line.pid != stopped_pid and line.t >= stopped_at:
            taken.add(line.shard)
        elif line.kind == "INIT" and line.pid == stopped_pid:
            taken.discard(line.shard)  # re-acquired: a new session of its own
        elif line.kind == "REC" and line.pid == stopped_pid and line.shard in taken:
            violations.append(f"stopped pid {stopped_pid} journaled {line.c} on {line.shard} after it was taken")
    return violations


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
    if request.get("TableName") != metrics_table or "#hbc" not in request.get("ExpressionAttributeNames", {}):
        return None
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
