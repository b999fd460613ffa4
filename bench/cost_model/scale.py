"""Item sizes at scale: the inputs of the extrapolation that a two-worker run cannot show (lease items, GSI entries
and expiry-observation items at 100 / 1 000 / 10 000 leases, measured on moto; worker rows at their steady size).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.models import Checkpoint, Lease
from worker_lib.leases import serializer
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import (
    LEASE_OWNER_INDEX,
    CoordinatorAttr,
    LeaseAttr,
    WorkerMetricsAttr,
    coordinator_state_table_name,
)
from worker_lib.tables.state_store import CoordinatorStateStore, ExpiryObservationStore
from worker_lib.workermetrics.config import WorkerMetricsConfig

from .prices import SCALES
from .sizes import item_size, read_units, value_size

WORKER_ID_CHARS = 36  # a KCL-style UUID worker id, as the lease owners of measure_scale_inputs
COUNTER_DIGITS = 7  # hbc/evc after months of beats (2.6 million a month at one a second)


def steady_row_bytes(row: Mapping[str, Any]) -> int:
    """A worker row measured after a few minutes, at the size it keeps for good: without a notice's key list (the
    next beat removes it), every metric history full (``max_values`` window averages: the row measured holds only
    the reports of its first minutes; each missing value counted as the row's largest), a 36-character worker id,
    and 7-digit heartbeat and event counters; no hand-off requests either (the beat after one removes it)."""
    transient = (WorkerMetricsAttr.ASSIGNED_KEYS, WorkerMetricsAttr.HANDOFF_REQUESTS)  # removed by the next beat
    steady = {k: v for k, v in row.items() if k not in transient}
    steady[WorkerMetricsAttr.WORKER_ID] = {"S": "x" * WORKER_ID_CHARS}
    for name in (WorkerMetricsAttr.HEARTBEAT_COUNTER, WorkerMetricsAttr.EVENT_COUNTER):
        if name in steady:
            steady[name] = {"N": "1" * COUNTER_DIGITS}
    stats = steady.get(WorkerMetricsAttr.STATS, {}).get("M")
    if stats:
        full = WorkerMetricsConfig().max_values
        padded: dict[str, Any] = {}
        for code, history in stats.items():
            values = list(history.get("L", []))
            largest = max(values, key=value_size) if values else {"N": "99.99"}
            padded[code] = {"L": values + [largest] * max(0, full - len(values))}
        steady[WorkerMetricsAttr.STATS] = {"M": padded}
    return item_size(steady)


@dataclass
class ScaleInputs:
    """Measured on moto with realistic items (KCL-style UUID worker ids, 56-digit checkpoints, hash ranges)."""

    lease_bytes: float  # mean lease item
    gsi_entry_bytes: float  # mean GSI (KEYS_ONLY) entry returned by the discovery Query
    scan_pages_1000: int  # lease-table Scan pages at 1 000 leases
    scan_units_1000: float  # RRU of one eventually consistent lease-table Scan at 1 000 leases (as the leader's)
    gsi_units_1000_20: float  # RRU of one discovery Query at 1 000 leases / 20 workers (50 keys)
    observation_bytes: dict[int, int] = field(default_factory=dict)  # expiry-observation item at L leases


def measure_scale_inputs(endpoint: str) -> ScaleInputs:
    admin = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint))
    app = f"cost-scale-{uuid.uuid4().hex[:6]}"
    ensure_tables(app, admin)
    rng = random.Random(7)
    owners = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(20)]
    width = 2**128 // 1000
    leases = [
        Lease(
            lease_key=f"shardId-{n:012d}",
            lease_counter=rng.randint(10**5, 10**7),
            lease_owner=owners[n % len(owners)],
            checkpoint=Checkpoint(sequence=str(rng.randint(10**55, 10**56 - 1))),
            starting_hash_key=str(n * width),
            ending_hash_key=str((n + 1) * width - 1),
            throughput_kbps=round(rng.uniform(0, 1000), 6),
        )
        for n in range(1000)
    ]
    items = [serializer.to_item(lease) for lease in leases]
    for start in range(0, len(items), 25):
        batch = [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]
        admin.batch_write_item(RequestItems={app: batch})
    pages, scan_units, scanned = 0, 0.0, 0
    kwargs: dict[str, Any] = {"TableName": app}  # eventually consistent, as DynamoDBLeaseStore's scans
    while True:
        response = admin.scan(**kwargs)
        nbytes = sum(item_size(item) for item in response["Items"])
        pages += 1
        scanned += nbytes
        scan_units += read_units(nbytes, consistent=False)
        if "LastEvaluatedKey" not in response:
            break
        kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
    response = admin.query(
        TableName=app,
        IndexName=LEASE_OWNER_INDEX.name,
        KeyConditionExpression="#o = :o",
        ExpressionAttributeNames={"#o": LeaseAttr.LEASE_OWNER},
        ExpressionAttributeValues={":o": {"S": owners[0]}},
    )
    entries = response["Items"]
    gsi_bytes = sum(item_size(item) for item in entries)
    observations = ExpiryObservationStore(CoordinatorStateStore(app, client=admin), max_clock_skew_ms=1000)
    sizes: dict[int, int] = {}
    now = time.time()
    for total in sorted({n for n, _ in SCALES}):
        observed = [(f"shardId-{n:012d}", rng.randint(10**5, 10**7), now - rng.uniform(0, 20)) for n in range(total)]
        observations.save(observed)
        item = admin.get_item(
            TableName=coordinator_state_table_name(app),
            Key={CoordinatorAttr.KEY: {"S": ExpiryObservationStore.KEY}},
            ConsistentRead=True,
        )["Item"]
        sizes[total] = item_size(item)
    return ScaleInputs(
        lease_bytes=scanned / len(items),
        gsi_entry_bytes=gsi_bytes / max(1, len(entries)),
        scan_pages_1000=pages,
        scan_units_1000=scan_units,
        gsi_units_1000_20=read_units(gsi_bytes, consistent=False),
        observation_bytes=sizes,
    )
