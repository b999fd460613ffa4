"""Measure the DynamoDB calls the implementation really makes, for the cost model in docs/deploy.md §5.

Runs, on a moto server with production timings (lease 10 s, renewal 3.308 s, discovery 9.975 s, metrics every
30 s, assignment every 20 s, lock heartbeat 10 s, shard sync 60 s): W in-process workers holding L leases of a
stream, and the leader through the real Lambda handler with a 60 s budget. A botocore ``before-call`` hook counts
every call per (role, operation). Also measures lease and worker-metrics item sizes and leader Scan pages at
L = 100 and 1 000 leases. Prints a table of per-minute rates.

    .venv/bin/python bench/cost_model.py [--workers 2] [--shards 8] [--minutes 2]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections import Counter
from typing import Any

from worker_lib import aws
from worker_lib.config import AwsConfig, LeaseConfig
from worker_lib.leases.dynamodb import DynamoDBLeaseStore
from worker_lib.local.emulators import start_moto
from worker_lib.local.streams import create_stream
from worker_lib.models import Lease
from worker_lib.processing.processor import FunctionProcessor
from worker_lib.tables.admin import ensure_tables
from worker_lib.worker import Worker, WorkerConfig


def counted_client(service: str, endpoint: str, counts: Counter[str], role: str) -> Any:
    client = aws.client(service, AwsConfig(endpoint_url=endpoint))

    def before_call(model: Any, **_: Any) -> None:
        counts[f"{role} {service}:{model.name}"] += 1

    client.meta.events.register("before-call", before_call)
    return client


def item_size(item: dict[str, Any]) -> int:
    """DynamoDB's item size: attribute names + values (numbers ≈ their digits / 2 + 1, strings UTF-8 length)."""
    size = 0
    for name, value in item.items():
        size += len(name.encode())
        ((kind, raw),) = value.items()
        if kind == "S":
            size += len(str(raw).encode())
        elif kind == "N":
            size += len(str(raw)) // 2 + 1
        elif kind in ("SS", "NS"):
            size += sum(len(str(x).encode()) for x in raw)
        elif kind == "BOOL":
            size += 1
        else:
            size += len(json.dumps(raw))
    return size


def handler_invocation(app: str, stream: str, endpoint: str, counts: Counter[str], budget_s: float) -> float:
    """One leader Lambda invocation with a ``budget_s`` deadline; returns its duration (the billed seconds)."""
    import importlib.util
    import sys
    from pathlib import Path

    os.environ.update(
        {
            "SHARDLEASE_APP": app,
            "SHARDLEASE_STREAM": stream,
            "SHARDLEASE_ENDPOINT_URL": endpoint,
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_DISABLED": "true",
            "POWERTOOLS_METRICS_NAMESPACE": "bench",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
            "SHARDLEASE_PER_WORKER_METRICS": "false",
        }
    )
    path = Path(__file__).resolve().parents[1] / "functions" / "leader" / "handler.py"
    spec = importlib.util.spec_from_file_location("bench_leader_handler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module._get_clients = lambda cfg: module._Clients(  # type: ignore[attr-defined]  # count the leader's calls
        aws_config=cfg,
        dynamodb=counted_client("dynamodb", endpoint, counts, "leader"),
        kinesis=counted_client("kinesis", endpoint, counts, "leader"),
    )

    class Context:
        function_name = "bench-leader"
        memory_limit_in_mb = 256
        invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:bench-leader"
        aws_request_id = "bench"

        def __init__(self) -> None:
            self.deadline = time.monotonic() + budget_s

        def get_remaining_time_in_millis(self) -> int:
            return max(0, int((self.deadline - time.monotonic()) * 1000))

    started = time.monotonic()
    module.handler({"source": "aws.events"}, Context())
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=2.0)
    args = parser.parse_args()
    moto = start_moto()
    try:
        endpoint = moto.endpoint_url
        counts: Counter[str] = Counter()
        app = f"cost-{uuid.uuid4().hex[:6]}"
        stream = f"{app}-s"
        admin = aws.client("dynamodb", AwsConfig(endpoint_url=endpoint))
        ensure_tables(app, admin)
        create_stream(aws.client("kinesis", AwsConfig(endpoint_url=endpoint)), stream, args.shards)
        os.environ["SHARDLEASE_INITIAL_POSITION"] = "TRIM_HORIZON"

        workers = []
        for n in range(args.workers):
            config = WorkerConfig(app=app, stream=stream, worker_id=f"cost-w{n}", lease=LeaseConfig())
            worker = Worker(
                config,
                lambda: FunctionProcessor(lambda records, checkpointer: None),
                dynamodb=counted_client("dynamodb", endpoint, counts, "worker"),
                kinesis=counted_client("kinesis", endpoint, counts, "worker"),
            )
            worker.start()
            workers.append(worker)

        # The leader runs back-to-back invocations as EventBridge would (each leads until its deadline).
        durations: list[float] = []
        stop = threading.Event()

        def leader_loop() -> None:
            while not stop.is_set():
                durations.append(handler_invocation(app, stream, endpoint, counts, 60.0))

        leader = threading.Thread(target=leader_loop, daemon=True)
        leader.start()
        warmup_s = 40.0  # leases created and assigned, workers discovered them
        time.sleep(warmup_s)
        counts.clear()
        measured_s = args.minutes * 60
        time.sleep(measured_s)
        snapshot = Counter(counts)
        stop.set()
        for worker in workers:
            worker.shutdown(timeout_s=10)
        leader.join(timeout=90)

        minutes = measured_s / 60
        leases = DynamoDBLeaseStore(app, client=admin).list_leases()
        owned = sum(1 for lease in leases if lease.lease_owner)
        lease_sizes = [item_size(i) for i in admin.scan(TableName=app)["Items"]]
        metric_sizes = [item_size(i) for i in admin.scan(TableName=f"{app}-WorkerMetricStats")["Items"]]

        print(f"moto, {args.workers} workers, {args.shards} shards ({owned} leases held), {minutes:.1f} min measured")
        print(f"{'role / call':<45} {'per minute':>10} {'per lease/min':>14} {'per worker/min':>15}")
        for key, n in sorted(snapshot.items()):
            per_min = n / minutes
            print(f"{key:<45} {per_min:>10.1f} {per_min / max(1, owned):>14.2f} {per_min / args.workers:>15.2f}")
        print(f"lease item size: {min(lease_sizes)}–{max(lease_sizes)} B; worker-metrics item: {max(metric_sizes)} B")
        print(f"leader invocation durations (s): {', '.join(f'{d:.1f}' for d in durations)}")

        # Scan pages at 100 and 1 000 leases (realistic items: owner, checkpoint, hash range, throughput)
        for total in (100, 1000):
            big = f"scan-{total}-{uuid.uuid4().hex[:4]}"
            ensure_tables(big, admin)
            store = DynamoDBLeaseStore(big, client=admin)
            for n in range(total):
                store.create_lease_if_absent(
                    Lease(
                        lease_key=f"shardId-{n:012d}",
                        lease_owner=f"worker-{n % 50}",
                        lease_counter=1234,
                        checkpoint=leases[0].checkpoint,
                        starting_hash_key=str(n * 2**118),
                        ending_hash_key=str((n + 1) * 2**118 - 1),
                        throughput_kbps=12.345678,
                    )
                )
            pages = 0
            kwargs: dict[str, Any] = {"TableName": big}
            while True:
                response = admin.scan(**kwargs)
                pages += 1
                if "LastEvaluatedKey" not in response:
                    break
                kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
            print(f"leader lease Scan at L={total}: {pages} page(s) per scan")
    finally:
        moto.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
