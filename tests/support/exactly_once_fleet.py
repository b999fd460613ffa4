"""The test side of the exactly-once chaos (tests/chaos/test_exactly_once_chaos.py): a sink's tables and what they
hold (:class:`SinkSpec`), and the chaos fleet with the gates of the deterministic zombie, the leader's identity and
what the workers' logs say (:class:`ExactlyOnceFleet`)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.chaos_fleet import ChaosFleet
from tests.support.exactly_once_processor import (
    APP_ENV,
    DSN_ENV,
    GATE_ENV,
    POSITIONS,
    PROCESSOR,
    SINK_ENV,
    SQLITE_ENV,
    TABLE_ENV,
    dynamodb_tables,
    outputs_schema,
    sql_connect,
    sql_positions,
)
from worker_lib.leader.lock import DynamoDBLeaderLock

REFUSED = "transaction refused on "  # the WARNING of a zombie's refused transaction (DynamoDB and SqlPositions)
HANDOFF = re.compile(r"graceful handoff completed lease=\S+ from=\S+ ok=True")
RESUMED = re.compile(r"lease (\S+) starts after the sink's position")
LEADER_SUFFIX = ":leader"  # an embedded leader's lock owner is "<worker id>:leader"


@dataclass(frozen=True)
class Effects:
    """What a sink holds: how many times each Kinesis record's effect landed (key: ``<lease>/<seq>/<sub>``), and
    the record's data (its producer id)."""

    counts: Counter[str] = field(default_factory=Counter)
    data: dict[str, str] = field(default_factory=dict)

    def ids(self) -> set[str]:
        return set(self.data.values())

    def duplicates(self) -> dict[str, int]:
        """Records whose effect landed more than once: key -> times."""
        return {key: n for key, n in sorted(self.counts.items()) if n > 1}

    def lost(self, produced: list[str]) -> list[str]:
        """Produced ids with no effect in the sink."""
        return sorted(set(produced) - self.ids())

    def doubly_put(self) -> dict[str, list[str]]:
        """Ids held by two Kinesis records (the producer's put landed twice: not a processing duplicate)."""
        keys: dict[str, list[str]] = {}
        for key, data in self.data.items():
            keys.setdefault(data, []).append(key)
        return {data: sorted(ks) for data, ks in sorted(keys.items()) if len(ks) > 1}


@dataclass(frozen=True)
class SinkSpec:
    """One sink of the exactly-once processor: its kind, its outputs table, and where it lives."""

    kind: str  # dynamodb | sqlite3 | postgresql
    app: str
    table: str
    sqlite_path: str | None = None
    dsn: str | None = None

    def env(self) -> dict[str, str]:
        """What every worker gets to write into this sink (the SQL sinks: also the position sink)."""
        env = {SINK_ENV: self.kind, TABLE_ENV: self.table, APP_ENV: self.app}
        if self.sqlite_path:
            env[SQLITE_ENV] = self.sqlite_path
        if self.dsn:
            env[DSN_ENV] = self.dsn
        if self.kind != "dynamodb":
            env["SHARDLEASE_POSITION_SINK"] = POSITIONS
        return env

    def create(self, ddb: Any) -> None:
        """Create the outputs table (and for the SQL sinks the positions table; sqlite3 in WAL mode, so that the
        test's reads never wait for a writer)."""
        if self.kind == "dynamodb":
            for table in dynamodb_tables(self.table):
                ddb.create_table(
                    TableName=table,
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                    AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                    BillingMode="PAY_PER_REQUEST",
                )
            return
        sql_positions(self.kind, app=self.app, sqlite_path=self.sqlite_path, dsn=self.dsn).create_table()
        connection = sql_connect(self.kind, sqlite_path=self.sqlite_path, dsn=self.dsn)()
        try:
            cursor = connection.cursor()
            if self.kind == "sqlite3":
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(outputs_schema(self.table))
            connection.commit()
        finally:
            connection.close()

    def effects(self, ddb: Any) -> Effects:
        """What the sink holds now."""
        found = Effects()
        if self.kind == "dynamodb":
            for table in dynamodb_tables(self.table):
                for page in ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
                    for item in page["Items"]:
                        key = item["pk"]["S"]
                        found.counts[key] += int(item["n"]["N"])
                        found.data[key] = item["data"]["S"]
            return found
        connection = sql_connect(self.kind, sqlite_path=self.sqlite_path, dsn=self.dsn)()
        try:
            cursor = connection.cursor()
            cursor.execute(
                f"SELECT lease_key, seq, sub, data, COUNT(*) FROM {self.table} GROUP BY lease_key, seq, sub, data"
            )
            for lease_key, seq, sub, data, n in cursor.fetchall():
                key = f"{lease_key}/{seq}/{sub}"
                found.counts[key] += int(n)
                found.data[key] = str(data)
            connection.rollback()
        finally:
            connection.close()
        return found

    def writers(self, keys: list[str]) -> dict[str, list[tuple[int, int]]]:
        """The SQL sinks: for each of ``keys`` (``<lease>/<seq>/<sub>``), the (fencing token, pid) of every row that
        holds it (who wrote a duplicate). The DynamoDB sink keeps no writer: empty."""
        if self.kind == "dynamodb" or not keys:
            return {}
        connection = sql_connect(self.kind, sqlite_path=self.sqlite_path, dsn=self.dsn)()
        found: dict[str, list[tuple[int, int]]] = {}
        try:
            cursor = connection.cursor()
            cursor.execute(f"SELECT lease_key, seq, sub, token, pid FROM {self.table}")
            wanted = set(keys)
            for lease_key, seq, sub, token, pid in cursor.fetchall():
                key = f"{lease_key}/{seq}/{sub}"
                if key in wanted:
                    found.setdefault(key, []).append((int(token), int(pid)))
            connection.rollback()
        finally:
            connection.close()
        return found


class ExactlyOnceFleet(ChaosFleet):
    """:class:`~tests.support.chaos_fleet.ChaosFleet` running the exactly-once processor, with the gates of the
    deterministic zombie (``gate_dir``), the leader lock read by an observer, and counts from the workers' logs."""

    def __init__(
        self,
        log_dir: Path,
        *,
        args: list[str],
        env: Mapping[str, str],
        journal: Path,
        gate_dir: Path,
        lock: DynamoDBLeaderLock,
        labels: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(log_dir, args=args, env={**env, GATE_ENV: str(gate_dir)}, journal=journal, labels=labels)
        self.processor = PROCESSOR
        self.gate_dir = gate_dir
        self.lock = lock

    # --- the gates ------------------------------------------------------------------------------------------------

    def close_gate(self, pid: int, point: str) -> None:
        """From now on the deliveries of ``pid`` stop at ``point`` (exactly_once_processor: BEFORE, AFTER)."""
        for marker in self.gate_dir.glob(f"{pid}.{point}.held.*"):
            marker.unlink()  # (an earlier closing's: held() tells this one's)
        (self.gate_dir / f"{pid}.{point}").touch()

    def open_gate(self, pid: int, point: str) -> None:
        (self.gate_dir / f"{pid}.{point}").unlink(missing_ok=True)

    def held(self, pid: int, point: str) -> list[str]:
        """Leases on which a delivery of ``pid`` waits (or waited) at ``point`` since the gate was last closed."""
        return sorted(p.name.split(".held.", 1)[1] for p in self.gate_dir.glob(f"{pid}.{point}.held.*"))

    # --- the leader ----------------------------------------------------------------------------------------------

    def leader(self) -> str | None:
        """The worker id whose embedded leader holds the lock (one read), or None."""
        owner = self.lock.current_leader()
        if owner is None or not owner.endswith(LEADER_SUFFIX):
            return None
        return owner[: -len(LEADER_SUFFIX)]

    # --- what the logs say ----------------------------------------------------------------------------------------

    def refused(self, name: str | None = None) -> int:
        """Refused (fenced) transactions logged by process ``name``, or by every process."""
        names = [name] if name is not None else list(self.processes)
        return sum(self.log(n).count(REFUSED) for n in names)

    def refused_lines(self, name: str) -> list[str]:
        return [line for line in self.log(name).splitlines() if REFUSED in line]

    def resumed_after_sink(self) -> Counter[str]:
        """Lease -> how many times a worker started it after the sink's position, ahead of the lease's checkpoint
        (the consumer's INFO line), in every log."""
        found: Counter[str] = Counter()
        for n in self.processes:
            found.update(RESUMED.findall(self.log(n)))
        return found

    def handoffs(self) -> int:
        """Graceful hand-offs completed (a rebalancing move: the old owner checkpointed and let go), in every log."""
        return sum(len(HANDOFF.findall(self.log(n))) for n in self.processes)
