"""The README's "Use it" snippet, run verbatim in its own process with nothing but environment variables set.

It proves what a pip user relies on: the snippet honours ``AWS_REGION`` (eu-west-1 here, where the tables are;
us-east-1 has none), the ``SHARDLEASE_*_ENDPOINT_URL`` variables (the demo's emulators: moto for DynamoDB,
kinesalite for Kinesis) and ``SHARDLEASE_LEADER_MODE=embedded`` (so the snippet alone creates and takes the leases),
processes the records it is given and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import FAST_ENV, GRACEFUL_STOP_S, REPO, first_read_s
from tests.support.stalls import eventually, hang_bound_s, stall_note
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import all_specs
from worker_lib.testing.streams import create_stream

pytestmark = [pytest.mark.slow, pytest.mark.busy]  # one worker process with its embedded leader

REGION = "eu-west-1"
APP, STREAM = "orders", "orders-stream"  # the names the snippet uses
# Liveness bounds (tests/support/stalls.py) from the timings of snippet_env (tests/support/processes.py's): the
# snippet starts, its embedded leader makes and assigns the leases, it reads; on SIGTERM it stops gracefully
READ_BOUND_S = hang_bound_s(first_read_s(1))
STOP_BOUND_S = hang_bound_s(GRACEFUL_STOP_S)


def readme_snippet() -> str:
    """The first python block of the README's "Use it" section, exactly as written."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Use it\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README 'Use it' has no python block"
    return match.group(1)


def snippet_env(moto_endpoint: str, kinesalite_endpoint: str) -> dict[str, str]:
    """Only variables: a region that is not us-east-1, dummy credentials, the emulators, an embedded leader and
    test timings. Nothing from the test process leaks in (its AWS_REGION is us-east-1)."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",  # the snippet prints; see its lines as they come
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "SHARDLEASE_DYNAMODB_ENDPOINT_URL": moto_endpoint,
        "SHARDLEASE_KINESIS_ENDPOINT_URL": kinesalite_endpoint,
        "SHARDLEASE_LEADER_MODE": "embedded",
        "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
        "SHARDLEASE_LEADER_LOCK_DURATION_MS": "3000",
        "SHARDLEASE_LEADER_HEARTBEAT_MS": "1000",
        "SHARDLEASE_MAX_CLOCK_SKEW_MS": "500",
        "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "500",
        "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "1000",
        "SHARDLEASE_CPU_METRIC": "process",
        **FAST_ENV,
    }


def printed(text: str) -> set[str]:
    """The "<partition key> <size>" pairs the snippet printed. Its handler runs on one thread per shard and ``print``
    writes key, separator, size and newline separately, so two threads' lines can interleave
    ("readme-001readme-000 10" then " 11", or "readme-00614" where a size follows a key directly): a pair is taken as
    whole lines where they are intact, and otherwise as the keys and the sizes printed (the numbers left once the keys
    are taken out), which must then match one to one."""
    lines = set(text.splitlines())
    keys = re.findall(r"readme-\d{3}", text)
    sizes = sorted(int(size) for size in re.findall(r"(?<!\d)(\d{2})(?!\d)", re.sub(r"readme-\d{3}", " ", text)))
    if sorted(int(key[-3:]) + 10 for key in keys) == sizes:  # every key printed once, with its own size somewhere
        lines |= {f"{key} {int(key[-3:]) + 10}" for key in keys}
    return lines


@pytest.fixture
def orders(moto_endpoint: str, kinesalite_endpoint: str) -> Iterator[tuple[Any, Any]]:
    """The tables of app "orders" in eu-west-1 on moto and stream "orders-stream" on kinesalite, removed after."""
    ddb = aws.client("dynamodb", AwsConfig(region=REGION, endpoint_url=moto_endpoint))
    kinesis = aws.client("kinesis", AwsConfig(region=REGION, endpoint_url=kinesalite_endpoint))
    ensure_tables(APP, ddb)
    create_stream(kinesis, STREAM, 2)
    try:
        yield ddb, kinesis
    finally:
        for spec in all_specs():
            with contextlib.suppress(Exception):
                ddb.delete_table(TableName=spec.table_name(APP))
        with contextlib.suppress(Exception):
            kinesis.delete_stream(StreamName=STREAM, EnforceConsumerDeletion=True)


def test_the_readme_snippet_runs_as_written_with_only_environment_variables(
    orders: tuple[Any, Any], moto_endpoint: str, kinesalite_endpoint: str, tmp_path: Path
) -> None:
    ddb, kinesis = orders
    # GIVEN the tables and the stream in eu-west-1 only (the snippet's default region would find nothing)
    us_east = aws.client("dynamodb", AwsConfig(region="us-east-1", endpoint_url=moto_endpoint))
    assert APP not in us_east.list_tables()["TableNames"]
    # AND 20 records with known partition keys and sizes
    expected = {f"readme-{n:03d} {10 + n}" for n in range(20)}
    kinesis.put_records(
        StreamName=STREAM,
        Records=[{"Data": b"x" * (10 + n), "PartitionKey": f"readme-{n:03d}"} for n in range(20)],
    )
    # WHEN the README's snippet runs, verbatim, in its own process with only those variables
    output = tmp_path / "snippet.log"
    with output.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", readme_snippet()],
            cwd=tmp_path,
            env=snippet_env(moto_endpoint, kinesalite_endpoint),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # THEN it prints one line per record, as its handler says ("<partition key> <size>")
        seen: set[str] = set()

        def all_printed_or_ended() -> bool:
            seen.clear()
            seen.update(printed(output.read_text(encoding="utf-8", errors="replace")))
            return expected <= seen or process.poll() is not None

        eventually(all_printed_or_ended, bound_s=READ_BOUND_S, what="the snippet printed every record", step_s=0.2)
        text = output.read_text(encoding="utf-8", errors="replace")
        assert expected <= seen, f"missing {sorted(expected - seen)[:5]}; output:\n{text[-3000:]}"
        # AND the snippet's embedded leader made the two leases in eu-west-1's lease table
        leases = ddb.scan(TableName=APP)["Items"]
        assert len(leases) == 2
        # WHEN it is sent SIGTERM (as docker stop, ECS or Kubernetes would)
        process.send_signal(signal.SIGTERM)
        # THEN it shuts down gracefully and exits 0 (within a liveness bound)
        sent = time.monotonic()
        try:
            code = process.wait(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {STOP_BOUND_S:.0f} s after SIGTERM; {stall_note(sent)}") from None
        assert code == 0, text[-3000:]
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
