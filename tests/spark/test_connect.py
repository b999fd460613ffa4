"""The source through Spark Connect: a local Connect server started with PySpark's own
``sbin/start-connect-server.sh`` (local[2]), and the test application as a thin client
(``python -m worker_lib.testing.spark_app --remote sc://…``).

What differs from a classic session (docs/spark.md, "Spark Connect"): ``register(spark)`` runs in the client and
ships the data source to the server; the source's driver side — its leases, heartbeat and worker-metrics row — runs
in a process of the server, as does the ``foreachBatch`` sink; the client only starts and stops the query. The same
checks as with a local session: every record reaches the sink exactly once, the leases are held under the client's
worker id, and a stopped query leaves as a worker does (STOPPED, its leases given up).

Marked slow: about 40 s (the Connect server's JVM, then the query).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.support import Env
from tests.support.processes import REPO
from tests.support.recording import assign_unowned
from worker_lib.core.models import WorkerState
from worker_lib.testing.processes import ProcessFleet
from worker_lib.testing.spark_cluster import free_port, spark_home
from worker_lib.testing.waiting import wait_until
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

pytestmark = pytest.mark.slow

pytest.importorskip("grpc", reason="the spark-connect extra (grpcio) is not installed")


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def rows(out: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted(out.glob("batch-*.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines()]
    return found


def test_a_spark_connect_client_reads_every_record_once_through_the_server(env: Env, tmp_path: Path) -> None:
    # GIVEN the application's leases assigned to the client's worker id, and a Connect server on loopback
    assign_unowned(env.store, lambda lease: "connect-a")
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server_env = {
        **base,
        "SPARK_HOME": str(spark_home()),
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp_path / "spark-logs"),
        "PYSPARK_PYTHON": sys.executable,  # the server's Python workers import shardlease (installed here)
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
    }
    with ProcessFleet(tmp_path, env=server_env, cwd=tmp_path) as fleet:
        fleet.start(
            "connect-server",
            [
                str(spark_home() / "sbin" / "start-connect-server.sh"),
                "--master", "local[2]",
                "--conf", f"spark.connect.grpc.binding.port={port}",
                "--conf", "spark.ui.enabled=false",
                "--conf", "spark.sql.streaming.stopTimeout=30s",
                "--conf", "spark.sql.shuffle.partitions=2",
            ],
        )  # fmt: skip
        assert wait_until(lambda: accepts(port), timeout_s=90, step_s=0.5), fleet.log("connect-server")[-3000:]
        out = tmp_path / "out"
        client = fleet.start(
            "client",
            [
                sys.executable, "-m", "worker_lib.testing.spark_app", "--app", env.app, "--stream", env.stream,
                "--worker-id", "connect-a", "--out", str(out), "--remote", f"sc://127.0.0.1:{port}",
                "--option", f"endpoint_url={env.endpoint}",
            ],
            env={**base, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        # WHEN records come in
        env.produce(200)
        # THEN every record reaches the sink exactly once (written by the server's Python processes)
        sink = out / "connect-a"
        assert wait_until(lambda: len(rows(sink)) >= 200, timeout_s=120, step_s=0.5), client.log_path.read_text()[
            -3000:
        ]
        datas = [row["data"].encode() for row in rows(sink)]
        assert sorted(datas) == sorted(env.produced) and len(set(datas)) == len(datas)
        # AND the server's source runner holds the leases under the client's worker id, and reports as a worker does
        assert {lease.lease_owner for lease in env.store.list_leases()} == {"connect-a"}
        row = WorkerMetricsStore(env.app, client=env.ddb).get("connect-a")
        assert row is not None and row.heartbeat is not None
        # WHEN the client stops its query (SIGTERM: stop_between_batches, then the session)
        fleet.signal("client", signal.SIGTERM)
        assert fleet.wait("client", timeout_s=90) == 0, client.log_path.read_text()[-3000:]

        # THEN the source left as a worker leaves: STOPPED, and its leases given up
        def left() -> bool:
            stopped = WorkerMetricsStore(env.app, client=env.ddb).get("connect-a")
            owners = {lease.lease_owner for lease in env.store.list_leases()}
            return (
                stopped is not None
                and stopped.heartbeat is not None
                and stopped.heartbeat.state is WorkerState.STOPPED
                and owners == {None}
            )

        # (the server stops the query after the client has gone, up to its 30 s stopTimeout for a batch in flight under
        # load, and only then ends the source runner, which departs within its 10 s deadline)
        assert wait_until(left, timeout_s=60), [lease.lease_owner for lease in env.store.list_leases()]
