"""MultiLang throughput and start time: the same work in-process and as MultiLang children, side by side.

Real processes on a local moto server. Each run fills a fresh stream (``--shards`` shards, ``--records-per-shard``
100-byte records each) before anything starts, then starts one process with the leader embedded and production
timings, reading from TRIM_HORIZON:

* ``in-process``: ``shardlease worker`` with a record processor that checkpoints the last record of each batch
  (bench/multilang_support/processor.py);
* ``multilang``: ``shardlease multilang`` with one Python child per shard that does the same over the protocol
  (bench/multilang_support/child.py: decode, checkpoint request, status).

A run ends when every lease's checkpoint is its shard's last record. Figures per run: records/s from the first
record reaching a processor to the last checkpoint, CPU seconds of the process and its children per 100 000 records
over the same window (/proc), and the time from the command's start to the first record in a processor. Sides
alternate within each trial (``--trials``); the medians are compared.

    .venv/bin/python bench/multilang.py [--trials 3] [--shards 4] [--records-per-shard 10000] [--json PATH]

The last line: ``multilang records/s: in-process P, multilang M (M/P R×); start to first record S s``.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from worker_lib.core import aws  # noqa: E402
from worker_lib.core.config import AwsConfig  # noqa: E402
from worker_lib.leases.dynamodb import DynamoDBLeaseStore  # noqa: E402
from worker_lib.tables.admin import ensure_tables  # noqa: E402
from worker_lib.testing.emulators import start_moto  # noqa: E402
from worker_lib.testing.processes import ProcessFleet  # noqa: E402
from worker_lib.testing.streams import create_stream, list_all_shards  # noqa: E402

SIDES = ("in-process", "multilang")
RECORD_BYTES = 100
PUT_BATCH = 500
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    side: str
    records: int
    records_per_s: float
    cpu_s_per_100k: float
    start_to_first_record_s: float


def fill(kinesis: Any, stream: str, per_shard: int) -> dict[str, str]:
    """Put ``per_shard`` records into every shard (aimed by explicit hash key); each shard's last sequence."""
    last: dict[str, str] = {}
    for shard in list_all_shards(kinesis, stream):
        key = shard["HashKeyRange"]["StartingHashKey"]
        for start in range(0, per_shard, PUT_BATCH):
            entries = [
                {"Data": os.urandom(RECORD_BYTES), "PartitionKey": f"k{n}", "ExplicitHashKey": key}
                for n in range(start, min(per_shard, start + PUT_BATCH))
            ]
            reply = kinesis.put_records(StreamName=stream, Records=entries)
            assert reply.get("FailedRecordCount", 0) == 0, "a put failed"
            last[shard["ShardId"]] = reply["Records"][-1]["SequenceNumber"]
    return last


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its living descendants (/proc)."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def one_run(side: str, *, endpoint: str, shards: int, per_shard: int, work: Path) -> Run:
    aws_config = AwsConfig(endpoint_url=endpoint)
    kinesis, ddb = aws.client("kinesis", aws_config), aws.client("dynamodb", aws_config)
    app = f"bench-ml-{uuid.uuid4().hex[:8]}"
    stream = f"{app}-s"
    create_stream(kinesis, stream, shards)
    last = fill(kinesis, stream, per_shard)
    ensure_tables(app, ddb)
    store = DynamoDBLeaseStore(app, client=ddb)
    first_file = work / f"{app}.first"
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench'}",
        "SHARDLEASE_LEADER_MODE": "embedded",
        "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
        "BENCH_FIRST_RECORD_FILE": str(first_file),
    }
    with ProcessFleet(work / app, env=env, cwd=REPO, wall_times=True, log_level="WARNING") as fleet:
        (work / app).mkdir(exist_ok=True)
        started = time.time()
        if side == "in-process":
            process = fleet.start_shardlease(
                "p",
                "worker",
                *("--app", app, "--stream", stream, "--endpoint-url", endpoint),
                *("--processor", "multilang_support.processor:CheckpointEveryBatch"),
            )
        else:
            properties = work / app / "app.properties"
            properties.write_text(
                f"executableName = {sys.executable} {REPO / 'bench' / 'multilang_support' / 'child.py'}\n"
                f"streamName = {stream}\napplicationName = {app}\ninitialPositionInStream = TRIM_HORIZON\n"
            )
            process = fleet.start_shardlease(
                "p", "multilang", "--properties", str(properties), "--endpoint-url", endpoint
            )
        samples: list[tuple[float, float]] = []
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            samples.append((time.time(), tree_cpu_s(process.pid)))
            checkpoints = {lease.lease_key: lease.checkpoint.sequence for lease in store.list_leases()}
            if checkpoints == last:
                break
            if not process.alive():
                raise SystemExit(f"{side}: the process exited: {fleet.log('p')[-2000:]}")
            time.sleep(0.2)
        else:
            raise SystemExit(f"{side}: not done within 600 s")
        done, cpu_done = samples[-1]
        first = min(float(line) for line in first_file.read_text().split())
        cpu_first = next((cpu for at, cpu in samples if at >= first), cpu_done)
        code = fleet.stop(["p"], timeout_s=60)["p"]
        assert code == 0, f"{side}: exit code {code}"
    records = shards * per_shard
    return Run(
        side=side,
        records=records,
        records_per_s=records / max(done - first, 1e-6),
        cpu_s_per_100k=(cpu_done - cpu_first) * 100_000 / records,
        start_to_first_record_s=first - started,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--records-per-shard", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="write every run here")
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before the runs", flush=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-multilang-") as tmp:
        moto = start_moto(log_path=Path(tmp) / "moto.log")
        try:
            for trial in range(args.trials):
                order = SIDES if trial % 2 == 0 else SIDES[::-1]
                for side in order:
                    run = one_run(
                        side,
                        endpoint=moto.endpoint_url,
                        shards=args.shards,
                        per_shard=args.records_per_shard,
                        work=Path(tmp),
                    )
                    runs.append(run)
                    print(
                        f"trial {trial + 1} {side:10s} {run.records_per_s:8.0f} records/s  "
                        f"{run.cpu_s_per_100k:6.2f} CPU s/100k  first record after {run.start_to_first_record_s:.1f} s",
                        flush=True,
                    )
        finally:
            moto.stop()
    print(f"load average after the runs: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps([asdict(run) for run in runs], indent=2))

    def median(side: str, field: str) -> float:
        return float(statistics.median(getattr(run, field) for run in runs if run.side == side))

    inproc, ml = median("in-process", "records_per_s"), median("multilang", "records_per_s")
    print(
        f"CPU s per 100 000 records: in-process {median('in-process', 'cpu_s_per_100k'):.2f}, "
        f"multilang {median('multilang', 'cpu_s_per_100k'):.2f} (daemon and children); "
        f"in-process start to first record {median('in-process', 'start_to_first_record_s'):.1f} s"
    )
    print(
        f"multilang records/s: in-process {inproc:.0f}, multilang {ml:.0f} ({ml / inproc:.2f}×); "
        f"start to first record {median('multilang', 'start_to_first_record_s'):.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
