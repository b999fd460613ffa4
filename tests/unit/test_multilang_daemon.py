"""`shardlease multilang`'s start: one configuration from the file, the environment and the flags, built without
writing the process environment (the worker and the children are stand-ins that record what they are given)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from worker_lib.core.errors import ConfigError
from worker_lib.multilang import daemon
from worker_lib.multilang.daemon import MultiLangOverrides, run_multilang
from worker_lib.multilang.processor import ChildSpec


def test_the_daemon_configures_worker_and_children_without_writing_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a file that sets the lease duration and the region, an environment with another lease duration,
    # and a worker and a processor that only record what they get
    path = tmp_path / "app.properties"
    path.write_text(
        "executableName = python3 app.py\napplicationName = orders-app\nstreamName = orders\n"
        "regionName = eu-west-1\nfailoverTimeMillis = 20000\ndisableWorkerMetrics = true\n"
    )
    monkeypatch.setenv("SHARDLEASE_FAILOVER_TIME_MS", "12000")
    monkeypatch.delenv("SHARDLEASE_LEADER_MODE", raising=False)
    configs: list[Any] = []
    specs: list[ChildSpec] = []

    class RecordingWorker:
        def __init__(self, config: Any, factory: Any) -> None:
            configs.append(config)
            factory()

        def run(self) -> None:
            pass

    monkeypatch.setattr("worker_lib.worker.worker.Worker", RecordingWorker)
    monkeypatch.setattr("worker_lib.tables.admin.ensure_tables", lambda *args, **kwargs: {})
    monkeypatch.setattr(daemon, "MultiLangProcessor", lambda spec, registry: specs.append(spec))
    before = dict(os.environ)
    # WHEN the daemon starts with a worker id on the command line
    run_multilang(path, MultiLangOverrides(worker_id="worker-7"))
    # THEN the worker has the file's settings over the environment's, the flag, and the leader embedded
    (config,) = configs
    assert (config.app, config.streams, config.worker_id) == ("orders-app", ("orders",), "worker-7")
    assert (config.lease.failover_time_ms, config.aws.region, config.leader_mode) == (20_000, "eu-west-1", "embedded")
    assert config.cpu_metric == "none"  # disableWorkerMetrics: the worker reports no CPU
    # AND each child is given that configuration as its environment, the rest of the daemon's with it
    (spec,) = specs
    assert spec.env is not None
    assert spec.env["SHARDLEASE_FAILOVER_TIME_MS"] == "20000" and spec.env["PATH"] == os.environ["PATH"]
    # AND the process environment is as it was
    assert dict(os.environ) == before


def test_the_daemon_refuses_lanes_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a MultiLang application whose environment asks for 4 lanes per shard
    path = tmp_path / "app.properties"
    path.write_text("executableName = python3 app.py\napplicationName = orders-app\nstreamName = orders\n")
    started: list[str] = []
    monkeypatch.setattr("worker_lib.worker.worker.Worker", lambda *args: started.append("worker"))
    monkeypatch.setattr("worker_lib.tables.admin.ensure_tables", lambda *args, **kwargs: started.append("tables"))
    environment = {**os.environ, "SHARDLEASE_PARALLELISM": "4"}
    # WHEN the daemon starts
    with pytest.raises(ConfigError) as err:
        run_multilang(path, MultiLangOverrides(), environment=environment)
    # THEN one line says why (a child is its shard's one processor, as in KCL), before any table or worker
    assert str(err.value) == (
        "SHARDLEASE_PARALLELISM=4: parallelism applies to Python processors; MultiLang runs one child process per "
        "shard, as KCL's protocol defines"
    )
    assert started == []
