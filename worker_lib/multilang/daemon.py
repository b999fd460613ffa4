"""``shardlease multilang``: KCL's MultiLangDaemon, without Java — a shardlease worker whose processors are children.

What it does at start, in order:

1. reads the properties file (:mod:`worker_lib.multilang.properties`) and logs one warning per key it does not use;
2. lays the file's settings over the environment (each value it replaces named in a warning), then the command
   line's flags over both, and builds every configuration of the worker, of its embedded leader and of the children's
   environment from that one mapping — this process's environment itself is never written;
3. creates the tables if they are missing, as KCL's daemon does on its first start;
4. runs a :class:`~worker_lib.worker.worker.Worker` with the leader embedded (KCL 3.x workers elect a leader among
   themselves; ``SHARDLEASE_LEADER_MODE=none`` leaves leading to the Lambda), whose record processors are
   :class:`~worker_lib.multilang.processor.MultiLangProcessor` — one child per held lease.

SIGTERM and SIGINT end it as they end ``shardlease worker``: each child gets ``shutdownRequested`` (and checkpoints),
then ``leaseLost``, and the leases are handed over at once.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from worker_lib.core.env import env_int
from worker_lib.core.errors import ConfigError
from worker_lib.multilang.messages import GENERATIONS, Generation
from worker_lib.multilang.processor import ChildRegistry, ChildSpec, MultiLangProcessor
from worker_lib.multilang.properties import MultiLangProperties, read_properties

log = logging.getLogger(__name__)

SERVICE_ENDPOINT_VARIABLES = (
    "SHARDLEASE_KINESIS_ENDPOINT_URL",
    "SHARDLEASE_DYNAMODB_ENDPOINT_URL",
    "SHARDLEASE_CLOUDWATCH_ENDPOINT_URL",
)


@dataclass(frozen=True, kw_only=True)
class MultiLangOverrides:
    """The command line's flags: each one that is given wins over the properties file."""

    app: str | None = None
    stream: str | None = None
    worker_id: str | None = None
    endpoint_url: str | None = None
    region: str | None = None
    initial_position: str | None = None
    timestamp: str | None = None  # with AT_TIMESTAMP (ISO-8601)


def load_properties(path: Path) -> MultiLangProperties:
    """Read and interpret the file; one :class:`ConfigError` line if it cannot be read or makes no sense."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read properties file {str(path)!r}: {exc.strerror or exc}") from None
    return read_properties(path.resolve(), text)


def effective_settings(
    props: MultiLangProperties, overrides: MultiLangOverrides, environment: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The variables the file and the flags set, to be laid over ``environment``, and a line for each value of
    the environment they replace. A multilang daemon leads by default (``SHARDLEASE_LEADER_MODE=embedded``) unless
    the environment says otherwise."""
    source = dict.fromkeys(props.settings, props.path.name)
    settings = dict(props.settings)
    flags = {
        "AWS_REGION": overrides.region,
        "SHARDLEASE_ENDPOINT_URL": overrides.endpoint_url,
        "SHARDLEASE_INITIAL_POSITION": overrides.initial_position,
        "SHARDLEASE_INITIAL_TIMESTAMP": overrides.timestamp,
    }
    if overrides.endpoint_url:  # one endpoint for every service: it replaces per-service ones, file's or not
        flags.update(dict.fromkeys(SERVICE_ENDPOINT_VARIABLES, overrides.endpoint_url))
    for name, value in flags.items():
        if value:
            settings[name], source[name] = value, "the command line"
    if not environment.get("SHARDLEASE_LEADER_MODE", "").strip():
        settings["SHARDLEASE_LEADER_MODE"] = "embedded"
    replaced = [
        f"{name}={value} from {source[name]} replaces the environment's {environment[name].strip()}"
        for name, value in settings.items()
        if name in source and environment.get(name, "").strip() and environment[name].strip() != value
    ]
    return settings, replaced


def child_spec(props: MultiLangProperties, environment: Mapping[str, str]) -> ChildSpec:
    """How each child starts: ``executableName`` run in the properties file's directory (a program found there is
    taken from there, else from ``PATH`` as KCL's daemon does), with ``environment`` as its environment (the
    daemon's, the file's settings and the flags over it: what a child of KCL's daemon would see)."""
    program, *arguments = props.executable
    local = props.directory / program
    if "/" not in program and local.is_file() and os.access(local, os.X_OK):
        program = str(local)
    elif "/" not in program and shutil.which(program, path=environment.get("PATH")) is None:
        raise ConfigError(
            f"{props.path.name}: executableName {props.executable[0]!r} is neither an executable file in "
            f"{str(props.directory)!r} nor on PATH"
        )
    elif "/" in program and not os.access(props.directory / program, os.X_OK):
        raise ConfigError(f"{props.path.name}: executableName {program!r} is not an executable file")
    generation = env_int(environment, "SHARDLEASE_MULTILANG_PROTOCOL", 2)
    if generation not in GENERATIONS:
        raise ConfigError(f"SHARDLEASE_MULTILANG_PROTOCOL={generation}: expected 1 (KCL 1.x) or 2 (KCL 2.x and 3.x)")
    return ChildSpec(
        command=(program, *arguments),
        cwd=props.directory,
        env=dict(environment),
        response_timeout_s=props.response_timeout_s,
        generation=_generation(generation),
    )


def _generation(value: int) -> Generation:
    return 1 if value == 1 else 2


def run_multilang(
    properties_path: Path, overrides: MultiLangOverrides, *, environment: Mapping[str, str] | None = None
) -> None:
    """Run the daemon until SIGTERM/SIGINT (see the module's docstring). ``environment`` (default: this process's)
    is read, never written."""
    from worker_lib.core import aws
    from worker_lib.tables.admin import ensure_tables
    from worker_lib.worker.config import WorkerConfig
    from worker_lib.worker.worker import Worker

    props = load_properties(properties_path)
    for line in props.warnings:
        log.warning("%s", line)
    base = dict(os.environ if environment is None else environment)
    settings, replaced = effective_settings(props, overrides, base)
    for line in replaced:
        log.warning("%s", line)
    env = {**base, **settings}  # the one configuration of the worker, its embedded leader and the children
    spec = child_spec(props, env)
    config = WorkerConfig.from_env(
        env,
        app=overrides.app or props.app,
        streams=(overrides.stream or props.stream,),
        worker_id=overrides.worker_id or props.worker_id,
    )
    if config.consumer.parallelism > 1:  # a child is its shard's one processor: records cannot be dealt to lanes
        raise ConfigError(
            f"SHARDLEASE_PARALLELISM={config.consumer.parallelism}: parallelism applies to Python processors; "
            "MultiLang runs one child process per shard, as KCL's protocol defines"
        )
    created = ensure_tables(config.app, aws.client("dynamodb", config.aws), layout=config.table_layout)
    for table in (name for name, new in created.items() if new):
        log.info("created table %s (KCL's daemon creates its tables too)", table)
    registry = ChildRegistry()
    log.info(
        "multilang daemon app=%s stream=%s worker=%s child=%s",
        config.app,
        ",".join(config.streams),
        config.worker_id,
        " ".join(spec.command),
    )
    try:
        Worker(config, lambda: MultiLangProcessor(spec, registry=registry)).run()
    finally:
        registry.close_all(spec.close_grace_s)
