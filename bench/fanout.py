"""Enhanced fan-out against polling: added latency, CPU per record, memory under backpressure.

Real `shardlease worker` processes; Kinesis is kinesis-local (the one emulator serving SubscribeToShard) behind
``worker_lib.testing.FanOutProxy``, leases on moto. One stream of ``--shards`` shards is filled before anything
starts (``--records-per-shard`` 100-byte records each); then, one after the other, each on that backlog from
TRIM_HORIZON, with the leader embedded and production timings:

1. **CPU** — a polling application and a fan-out application (each its own lease table; the fan-out one its own
   consumer), each with a processor that checkpoints every batch, ``--rounds`` times each, alternating: user +
   system CPU seconds (/proc) of the threads that read and deliver the records — each shard's consumer thread and,
   with fan-out, its subscription reader thread — from their start until every checkpoint is at its shard's last
   record, per 100 000 records; the medians. The threads that are the same in both modes (heartbeat, renewals,
   the embedded leader) are left out: over a short window their idle cost drowned the difference (a first version
   subtracted the process's idle rate, which charged polling's idle GetRecords calls to a window without them).
2. **Added latency** — the fan-out worker, caught up, while a producer writes 20 records/s for ``--latency-s``: for
   every batch, the time from the event's arrival in the worker (its reader thread) to the processor's call
   (``cache_exit_time - cache_entry_time``). kinesis-local pushes once a second, so the end-to-end latency says
   more about the emulator than about us: what is measured is what the worker adds.
3. **Memory under backpressure** — a fan-out worker whose processor takes 2 s per batch on the backlog: the
   process's peak resident memory above its resident memory before it took its leases, per shard.

    .venv/bin/python bench/fanout.py [--shards 8] [--records-per-shard 5000] [--latency-s 20] [--rounds 3]

The last line: ``fanout: added latency p50/p99 ms A/B (event received → processor), CPU s per 100k records polling
P, fanout F; memory per shard under backpressure M MB``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from worker_lib.core import aws  # noqa: E402
from worker_lib.core.config import AwsConfig  # noqa: E402
from worker_lib.leases.dynamodb import DynamoDBLeaseStore  # noqa: E402
from worker_lib.tables.admin import ensure_tables  # noqa: E402
from worker_lib.testing.emulators import start_kinesis_local, start_moto  # noqa: E402
from worker_lib.testing.fanout_proxy import FanOutProxy  # noqa: E402
from worker_lib.testing.processes import ProcessFleet  # noqa: E402
from worker_lib.testing.producers import Producer  # noqa: E402
from worker_lib.testing.streams import create_stream, list_all_shards  # noqa: E402

PROCESSOR = "fanout_support.processor:Measuring"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def fill(kinesis: Any, stream: str, per_shard: int) -> dict[str, str]:
    """``per_shard`` records into each shard; each shard's last sequence number."""
    last: dict[str, str] = {}
    for shard in list_all_shards(kinesis, stream):
        key = shard["HashKeyRange"]["StartingHashKey"]
        for start in range(0, per_shard, 500):
            entries = [
                {"Data": os.urandom(100), "PartitionKey": f"k{n}", "ExplicitHashKey": key}
                for n in range(start, min(per_shard, start + 500))
            ]
            reply = kinesis.put_records(StreamName=stream, Records=entries)
            assert reply.get("FailedRecordCount", 0) == 0
            last[shard["ShardId"]] = reply["Records"][-1]["SequenceNumber"]
    return last


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu_s(pid: int, tids: set[int]) -> float:
    """User + system CPU seconds of the given threads of ``pid`` since each started."""
    total = 0.0
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            raise SystemExit(f"thread {tid} ended before it was measured") from None
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 1e6


class Bench:
    def __init__(self, work: Path, moto: str, kinesis_url: str) -> None:
        self.work, self.moto, self.kinesis_url = work, moto, kinesis_url
        self.ddb = aws.client("dynamodb", AwsConfig(endpoint_url=moto))

    def worker(self, fleet: ProcessFleet, app: str, stream: str, retrieval: str, **env: str) -> Any:
        ensure_tables(app, self.ddb)
        out = self.work / f"{app}.jsonl"
        environment = {
            "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench'}",
            "SHARDLEASE_LEADER_MODE": "embedded",
            "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
            "SHARDLEASE_KINESIS_ENDPOINT_URL": self.kinesis_url,
            "BENCH_OUT": str(out),
            **env,
        }
        argv = ["--app", app, "--stream", stream, "--endpoint-url", self.moto, "--retrieval", retrieval]
        return fleet.start_shardlease(app, "worker", *argv, "--processor", PROCESSOR, env=environment), out

    def until_checkpointed(
        self, app: str, last: dict[str, str], process: Any, timeout_s: float
    ) -> list[tuple[float, float]]:
        """Poll until every lease's checkpoint is its shard's last record; (wall time, process CPU s) meanwhile."""
        store = DynamoDBLeaseStore(app, client=self.ddb)
        samples = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            samples.append((time.time(), cpu_s(process.pid)))
            if {lease.lease_key: lease.checkpoint.sequence for lease in store.list_leases()} == last:
                return samples
            time.sleep(0.2)
        raise SystemExit(f"{app}: not caught up within {timeout_s:.0f} s")


def records_out(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--records-per-shard", type=int, default=5_000)
    parser.add_argument("--latency-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3, help="CPU runs per mode, alternating; medians reported")
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before the runs", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        work = Path(tmp)
        with (
            start_moto(log_path=work / "moto.log") as moto,
            start_kinesis_local(log_path=work / "kinesis-local.log") as emulator,
            FanOutProxy(emulator.endpoint_url) as proxy,
        ):
            kinesis = aws.client("kinesis", AwsConfig(endpoint_url=proxy.endpoint_url, read_timeout_s=60))
            stream = f"bench-fo-{uuid.uuid4().hex[:6]}"
            create_stream(kinesis, stream, args.shards)
            started = time.monotonic()
            last = fill(kinesis, stream, args.records_per_shard)
            total = args.shards * args.records_per_shard
            print(f"filled {total} records in {time.monotonic() - started:.0f} s", flush=True)
            bench = Bench(work, moto.endpoint_url, proxy.endpoint_url)
            cpu: dict[str, list[float]] = {}
            with ProcessFleet(work, env=dict(os.environ), cwd=REPO, log_level="WARNING") as fleet:
                # 1. CPU per record, each mode on the whole backlog, alternating, ``--rounds`` times each
                for round_no in range(args.rounds):
                    for retrieval in ("polling", "fanout"):
                        app = f"{stream}-{retrieval}-{round_no}"
                        process, out = bench.worker(fleet, app, stream, retrieval)
                        samples = bench.until_checkpointed(app, last, process, timeout_s=600)
                        batches = records_out(out)
                        tids = {tid for batch in batches for tid in batch["tids"]}
                        reading = thread_cpu_s(process.pid, tids)
                        start_t, start_cpu = next(((t, c) for t, c in samples if t >= batches[0]["at"]), samples[-1])
                        done_t, done_cpu = samples[-1]
                        cpu.setdefault(retrieval, []).append(reading * 100_000 / total)
                        print(
                            f"{retrieval:8s} {total} records in {sum(1 for b in batches if b['records'])} batches, "
                            f"{done_t - start_t:.1f} s: reading threads ({len(tids)}) {reading:.2f} CPU s; the whole "
                            f"process {done_cpu - start_cpu:.2f} CPU s from the first record",
                            flush=True,
                        )
                        fleet.stop([app], timeout_s=60)
                # 2. added latency: a fan-out worker caught up on the backlog, under a steady producer
                app = f"{stream}-latency"
                process, out = bench.worker(fleet, app, stream, "fanout")
                bench.until_checkpointed(app, last, process, timeout_s=600)
                mark = len(records_out(out))
                with Producer(kinesis, stream, per_tick=2, tick_s=0.1, name="latency-producer"):
                    time.sleep(args.latency_s)  # steady-state traffic: real time is what is measured
                time.sleep(2.0)
                latencies = [r["added_ms"] for r in records_out(out)[mark:] if r["records"]]
                fleet.stop([app], timeout_s=60)
                # 3. memory under backpressure: a slow processor on the backlog
                app = f"{stream}-slow"
                process, out = bench.worker(fleet, app, stream, "fanout", BENCH_SLOW_S="2")
                time.sleep(3.0)
                idle = rss_mb(process.pid)
                peak = idle
                deadline = time.monotonic() + 40
                while time.monotonic() < deadline:
                    peak = max(peak, rss_mb(process.pid))
                    time.sleep(0.2)
                fleet.stop([app], timeout_s=60)
    per_shard_mb = (peak - idle) / args.shards
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(f"latency samples {len(latencies)} batches; RSS idle {idle:.0f} MB, peak {peak:.0f} MB")
    print(f"load average after the runs: {os.getloadavg()[0]:.2f}")
    polling, fanout = statistics.median(cpu["polling"]), statistics.median(cpu["fanout"])
    print(f"CPU s per 100k records, each run: polling {cpu['polling']}, fanout {cpu['fanout']}")
    print(
        f"fanout: added latency p50/p99 ms {p50:.1f}/{p99:.1f} (event received → processor), CPU s per 100k "
        f"records polling {polling:.2f}, fanout {fanout:.2f}; memory per shard under backpressure "
        f"{per_shard_mb:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
