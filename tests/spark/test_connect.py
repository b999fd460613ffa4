"""The source through Spark Connect: a local Connect server started with PySpark's own
``sbin/start-connect-server.sh`` (local[2]), and the test application as a thin client
(``python -m worker_lib.testing.spark_app --remote sc://…``).

What differs from a classic session (docs/spark.md, "Spark Connect"): ``register(spark)`` runs in the client and
ships the data source to the server; the source's driver side — its leases, heartbeat and worker-metrics row — runs
in a process of the server, as does the ``foreachBatch`` sink; the client only starts and stops the query. The same
checks as with a local session: every record reaches the sink exactly once, the leases are held under the client's
worker id, and a stopped query leaves as a worker does (STOPPED, its leases given up).

Marked slow: about 40 s (the Connect server's JVM, then the query); heavy: a JVM server and a client process.
Every wait is a liveness bound (tests/support/stalls.py) on what the configured timings give; what is asserted —
every record once, who holds the leases, the STOPPED departure — is exact.
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

from tests.spark.support import Env, exit_code
from tests.support.processes import REPO, eventually_showing
from tests.support.recording import assign_unowned
from tests.support.stalls import hang_bound_s
from worker_lib.core.models import WorkerState
from worker_lib.spark.source import DEPARTURE_TIMEOUT_S
from worker_lib.testing.processes import ProcessFleet
from worker_lib.testing.spark_cluster import free_port, spark_home
from worker_lib.workermetrics.stats_store import WorkerMetricsStore

pytest.importorskip("grpc", reason="the spark-connect extra (grpcio) is not installed")

TRIGGER_S = 1.0
"""worker_lib.testing.spark_app's processing-time trigger (``--trigger-ms``, default 1000)."""
SERVER_STOP_TIMEOUT_S = 30.0
"""The server's ``spark.sql.streaming.stopTimeout``: the longest a stop waits for a batch in flight."""
SERVER_START_S = 20.0
"""Not a setting: the Connect server's JVM starts and listens (14 s at a load average of 7, 2026-11-27)."""
FIRST_QUERY_S = 20.0
"""Not a setting: the client starts (PySpark's Connect client), ships the source, and the server's first query of a
Python data source starts: a Python daemon per kind of work, each importing PySpark, and the source runner (the
shared session's warm-up, tests/spark/conftest.py WARM_UP_S); 18 s to the 200 records at a load average of 7."""
CLIENT_STOP_S = 2 * TRIGGER_S
"""The client on SIGTERM: the batch in flight ends (stop_between_batches), the query stops, the client exits."""
CLIENT_STOP_BOUND_S = SERVER_STOP_TIMEOUT_S + hang_bound_s(CLIENT_STOP_S)
"""The client's stop waits for the server's, which a batch in flight holds up to its stop timeout."""

READ_BOUND_S = hang_bound_s(FIRST_QUERY_S + 2 * TRIGGER_S)
SERVER_START_BOUND_S = hang_bound_s(SERVER_START_S)
LEFT_BOUND_S = SERVER_STOP_TIMEOUT_S + hang_bound_s(DEPARTURE_TIMEOUT_S)
"""The query's stop on the server, at most its stop timeout (a cap, not a duration to scale), then the runner's
departure, which ends the runner by its deadline whatever happens."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.heavy,
    # the whole test: its liveness bounds one after another, and the fleet's own start and stop around them
    pytest.mark.timeout(int(SERVER_START_BOUND_S + READ_BOUND_S + CLIENT_STOP_BOUND_S + LEFT_BOUND_S + 60)),
]


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
                "--conf", f"spark.sql.streaming.stopTimeout={SERVER_STOP_TIMEOUT_S:.0f}s",
                "--conf", "spark.sql.shuffle.partitions=2",
            ],
        )  # fmt: skip
        server_s = eventually_showing(
            lambda: accepts(port),
            bound_s=SERVER_START_BOUND_S,
            what="the Connect server listening",
            detail=lambda: fleet.log("connect-server")[-3000:],
        )
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
        read_s = eventually_showing(
            lambda: len(rows(sink)) >= 200,
            bound_s=READ_BOUND_S,
            what="every record reaching the sink",
            detail=lambda: f"{len(rows(sink))} rows\n{client.log_path.read_text()[-3000:]}",
        )
        print(f"the server listened after {server_s:.1f} s, the records were in the sink {read_s:.1f} s later")
        datas = [row["data"].encode() for row in rows(sink)]
        assert sorted(datas) == sorted(env.produced) and len(set(datas)) == len(datas)
        # AND the server's source runner holds the leases under the client's worker id, and reports as a worker does
        assert {lease.lease_owner for lease in env.store.list_leases()} == {"connect-a"}
        row = WorkerMetricsStore(env.app, client=env.ddb).get("connect-a")
        assert row is not None and row.heartbeat is not None
        # WHEN the client stops its query (SIGTERM: stop_between_batches, then the session)
        fleet.signal("client", signal.SIGTERM)
        code = exit_code(fleet, "client", bound_s=CLIENT_STOP_BOUND_S, what="the client's stop")
        assert code == 0, client.log_path.read_text()[-3000:]

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
        eventually_showing(
            left,
            bound_s=LEFT_BOUND_S,
            what="the source's departure: STOPPED, every lease given up",
            detail=lambda: [lease.lease_owner for lease in env.store.list_leases()],
        )
