"""The ``shardlease`` command line (the README's "Command line" section is the contract: tests and users rely on it).

Every failure the user can cause or meet — a bad flag, a missing table, an unreachable endpoint, missing
credentials — ends with exactly one line on stderr and a non-zero exit code, never a traceback.
Exit codes: 0 success, 1 an operational error, 2 bad arguments, 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from worker_lib import __version__
from worker_lib.cli import flags
from worker_lib.core.errors import ConfigError, ShardleaseError
from worker_lib.core.streams import StreamSelection
from worker_lib.tools import demo as demo_bounds

log = logging.getLogger(__name__)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

_Command = Callable[[argparse.Namespace], int]  # what a subcommand runs: its exit code


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (plus a pointer to --help), not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_aws(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint-url", metavar="URL", help="point every AWS client at this endpoint (emulators)")
    parser.add_argument("--region", metavar="R", help="AWS region (default: AWS_REGION or us-east-1)")


def _app_command(sub: Any, name: str, func: _Command, *, help: str, stream: bool = False) -> argparse.ArgumentParser:
    """A command on one application's tables: ``--app`` (``--stream`` too if ``stream``), the AWS flags, and
    ``func`` that runs it; the caller adds the command's own flags."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help)
    _add_app(parser, stream=stream)
    _add_aws(parser)
    parser.set_defaults(func=func)
    return parser


def _add_app(parser: argparse.ArgumentParser, *, stream: bool) -> None:
    parser.add_argument("--app", required=True, metavar="APP", help="application name (= lease table name)")
    if stream:
        parser.add_argument(
            "--stream",
            required=True,
            action="append",
            metavar="STREAM",
            help="Kinesis stream name; repeat it for a multi-stream application (docs/multi-stream.md)",
        )
        parser.add_argument(
            "--multi-stream",
            action="store_true",
            help="KCL multi-stream lease keys (account:stream:epoch:shardId) even with one --stream",
        )


def _add_position(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--initial-position",
        default=None,
        metavar="LATEST|TRIM_HORIZON|AT_TIMESTAMP",
        help="where leases of newly discovered shards start (default: SHARDLEASE_INITIAL_POSITION, else LATEST)",
    )
    parser.add_argument("--timestamp", metavar="ISO", help="with AT_TIMESTAMP: ISO-8601 time to start from")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


SIMULATE_MAX_WORKERS, SIMULATE_MAX_SHARDS, SIMULATE_MAX_CYCLES = 2_000, 20_000, 200


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _positive_int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range {low}..{high}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):  # nan passes every comparison below, inf never ends a wait
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="shardlease", description="KCL 3.x-compatible lease coordination for Kinesis consumers.")
    parser.add_argument("--version", action="version", version=f"shardlease {__version__}")
    parser.add_argument(
        "--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default WARNING"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    demo = sub.add_parser("demo", help="run the system on local emulators (no AWS account needed)")
    for flag, low, high, default, what in (
        ("--workers", demo_bounds.WORKERS_MIN, demo_bounds.WORKERS_MAX, 3, "worker processes"),
        ("--shards", demo_bounds.SHARDS_MIN, demo_bounds.SHARDS_MAX, 8, "stream shards"),
    ):
        demo.add_argument(
            flag,
            type=_bounded_int(low, high),
            default=default,
            metavar="N",
            help=f"{what}, {low}-{high} (default {default})",
        )
    demo.add_argument(
        "--duration",
        type=_positive_float,
        default=90.0,
        metavar="S",
        help=f"seconds, at least {demo_bounds.DURATION_MIN_DEFAULT_S:g} for the default scenario (default 90)",
    )
    demo.add_argument(
        "--scenario",
        default="default",
        metavar="NAME",
        help="default (the whole fleet) or shard-sync (lease lifecycle)",
    )
    demo.set_defaults(func=_cmd_demo)

    create = _app_command(
        sub, "create-tables", _cmd_create_tables, help="create the lease, worker-metrics and coordinator tables"
    )
    create.add_argument("--billing-mode", default="PAY_PER_REQUEST", choices=["PAY_PER_REQUEST", "PROVISIONED"])
    create.add_argument("--timeout", type=_positive_float, default=300.0, metavar="S", help="wait for ACTIVE")
    create.add_argument(
        "--table-layout",
        choices=["three-tables", "single-table"],
        default=None,
        help="three tables (KCL 3.0-3.4, the default) or the lease table alone (KCL 3.5 single-table mode); "
        "default: SHARDLEASE_TABLE_LAYOUT",
    )

    leader = _app_command(
        sub, "leader", _cmd_leader, help="run the leader (shard sync and lease assignment)", stream=True
    )
    _add_position(leader)
    leader.add_argument("--once", action="store_true", help="run one full cycle and exit")
    leader.add_argument("--worker-id", metavar="ID", help="name this leader uses for the lock (default host:pid)")
    leader.add_argument("--json", action="store_true", help="print the cycle summary as JSON")

    worker = _app_command(
        sub, "worker", _cmd_worker, help="run a worker: hold leases, process records, checkpoint", stream=True
    )
    worker.add_argument(
        "--processor", required=True, metavar="MODULE:ATTR", help="record processor class, factory or function"
    )
    worker.add_argument("--worker-id", metavar="ID", help="this worker's lease-owner name (default host:pid)")
    worker.add_argument(
        "--retrieval",
        choices=["polling", "fanout"],
        help="GetRecords, or enhanced fan-out (SubscribeToShard; docs/fanout.md); default: SHARDLEASE_RETRIEVAL, "
        "else polling",
    )
    _add_position(worker)
    flags.add_failures(worker)
    flags.add_lanes(worker)
    flags.add_position_sink(worker)

    multilang = sub.add_parser(
        "multilang", help="run a KCL MultiLang application (kclpy, aws-kcl, ...) from its properties file"
    )
    multilang.add_argument(
        "--properties", "-p", required=True, metavar="FILE", help="the MultiLangDaemon properties file"
    )
    multilang.add_argument("--app", metavar="APP", help="application name (default: applicationName)")
    multilang.add_argument("--stream", metavar="STREAM", help="stream name (default: streamArn or streamName)")
    multilang.add_argument("--worker-id", metavar="ID", help="this worker's lease-owner name (default: workerId)")
    _add_position(multilang)
    flags.add_failures(multilang)
    _add_aws(multilang)
    multilang.set_defaults(func=_cmd_multilang)

    resume = _app_command(
        sub,
        "resume-shard",
        _cmd_resume_shard,
        help="let a shard stopped by the stop-shard failure policy be processed again",
    )
    resume.add_argument("--shard", required=True, metavar="LEASE_KEY", help="the shard's lease key (shardlease status)")

    status = _app_command(
        sub, "status", _cmd_status, help="leases per worker and cluster, CPU, throughput, leader, problems"
    )
    status.add_argument("--watch", action="store_true", help="refresh every few seconds (and detect expiry)")
    status.add_argument("--interval", type=_positive_float, default=5.0, metavar="S", help="refresh period")
    status.add_argument("--json", action="store_true", help="print JSON")

    liveness = _app_command(
        sub, "liveness", _cmd_liveness, help="show the liveness mode (lease or worker), or ask the leader to switch it"
    )
    liveness.add_argument(
        "--set", dest="target", choices=["lease", "worker"], help="ask for this mode (the leader completes the switch)"
    )
    liveness.add_argument("--json", action="store_true", help="print JSON")

    sim = sub.add_parser("simulate", help="offline fleet running the real deciders cycle by cycle")
    # Bounds keep a run within minutes on a laptop (the 10 000-lease fleet of docs/benchmarks.md: ~0.3 s a cycle).
    sim.add_argument("--workers", type=_bounded_int(1, SIMULATE_MAX_WORKERS), default=8, metavar="N")
    sim.add_argument("--shards", type=_bounded_int(1, SIMULATE_MAX_SHARDS), default=64, metavar="N")
    sim.add_argument("--skew", default="zipf:1.2", metavar="uniform|zipf[:S]|hot[:K[:F]]")
    # The simulator's STRATEGIES, spelled out: importing the simulator here would slow every command's start.
    sim.add_argument(
        "--strategy", default="variance", choices=["variance", "variance-kcl", "count", "count-kcl", "kcl2"]
    )
    sim.add_argument("--cycles", type=_bounded_int(1, SIMULATE_MAX_CYCLES), default=12, metavar="N")
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument("--plot", metavar="FILE.png", help="draw per-worker load over cycles")
    sim.add_argument("--join", action="append", default=[], metavar="CYCLE[:N]", help="N workers join")
    sim.add_argument("--kill", action="append", default=[], metavar="CYCLE[:N]", help="N most loaded workers die")
    sim.add_argument("--split", action="append", default=[], metavar="CYCLE[:N]", help="split the N hottest shards")
    sim.add_argument("--noise", type=float, default=None, metavar="PCT", help="CPU noise (1; 10 with --autoscale)")
    sim.add_argument("--base-cpu", type=float, default=5.0, metavar="PCT")
    sim.add_argument("--target-cpu", type=float, default=40.0, metavar="PCT")
    sim.add_argument("--cost-factors", metavar="F1,F2,...", help="per-worker CPU cost factors (cycled)")
    sim.add_argument(
        "--autoscale", action="store_true", help="drive the fleet with DesiredWorkers over time (docs/autoscaling.md)"
    )
    sim.add_argument("--load-curve", metavar="FILE|diurnal|spike", help="with --autoscale: the load over time")
    sim.add_argument("--peak-workers", type=_bounded_int(1, SIMULATE_MAX_WORKERS), default=12, metavar="N")
    sim.add_argument("--start-delay", type=float, default=180.0, metavar="SECONDS", help="a new worker's start")
    sim.set_defaults(func=_cmd_simulate)
    return parser


# --- commands ----------------------------------------------------------------------------------------------------


def _aws_config(args: argparse.Namespace) -> Any:
    from worker_lib.core.config import AwsConfig

    return AwsConfig.from_env(endpoint_url=args.endpoint_url, region=args.region)


def _cmd_create_tables(args: argparse.Namespace) -> int:
    from worker_lib.core import aws
    from worker_lib.tables.admin import ensure_tables
    from worker_lib.tables.schema import BillingMode, TableLayout

    aws_config = _aws_config(args)
    layout = TableLayout.parse(args.table_layout) if args.table_layout else TableLayout.from_env()
    ddb = aws.client("dynamodb", aws_config)
    results = ensure_tables(
        args.app, ddb, billing=BillingMode(args.billing_mode), timeout_s=args.timeout, layout=layout
    )
    for table, created in results.items():
        print(f"{table}: {'created' if created else 'exists'} (ACTIVE)")
    return EXIT_OK


def _shard_sync_config(args: argparse.Namespace) -> Any:
    """The environment's shard-sync settings (docs/api.md), with the position flags in their place when given."""
    from dataclasses import replace

    from worker_lib.core.config import InitialPosition, parse_timestamp
    from worker_lib.shardsync.config import ShardSyncConfig

    config = ShardSyncConfig.from_env()
    if args.initial_position is None and args.timestamp is None:
        return config
    position = InitialPosition.parse(args.initial_position) if args.initial_position else config.initial_position
    timestamp = parse_timestamp(args.timestamp) if args.timestamp else None
    return replace(config, initial_position=position, initial_timestamp=timestamp)


def _streams(args: argparse.Namespace) -> StreamSelection:
    try:
        return StreamSelection(names=tuple(args.stream), multi_stream=args.multi_stream)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _cmd_leader(args: argparse.Namespace) -> int:
    aws_config, shard_sync = _aws_config(args), _shard_sync_config(args)  # validate before any I/O
    from worker_lib.cli.leader import run_leader_cli

    return run_leader_cli(
        app=args.app,
        stream=_streams(args),
        aws_config=aws_config,
        shard_sync=shard_sync,
        once=args.once,
        owner=args.worker_id,
        as_json=args.json,
    )


def _cmd_worker(args: argparse.Namespace) -> int:
    from worker_lib.worker.signals import hold_shutdown_signals

    hold_shutdown_signals()  # a SIGTERM while the worker starts stops it cleanly (Worker.run delivers it)
    from worker_lib.processing.positions import load_position_sink
    from worker_lib.processing.processor import load_processor
    from worker_lib.worker.worker import Worker, WorkerConfig

    aws_config, shard_sync = _aws_config(args), _shard_sync_config(args)  # validate before any I/O
    factory = load_processor(args.processor)
    env = flags.environment(args)
    sink_spec = env.get(flags.POSITION_SINK, "").strip()
    position_sink = load_position_sink(sink_spec) if sink_spec else None
    config = WorkerConfig.from_env(
        env,
        app=args.app,
        streams=_streams(args).names,
        multi_stream=args.multi_stream or None,
        worker_id=args.worker_id,
        initial_position=shard_sync.initial_position,
        initial_timestamp=shard_sync.initial_timestamp,
        retrieval=args.retrieval,
    )
    # run() checks tables and stream first (one line if not)
    Worker(config, factory, aws_config=aws_config, position_sink=position_sink).run()
    return EXIT_OK


def _cmd_multilang(args: argparse.Namespace) -> int:
    from worker_lib.worker.signals import hold_shutdown_signals

    hold_shutdown_signals()  # as for `shardlease worker`
    from dataclasses import fields
    from pathlib import Path

    from worker_lib.multilang.daemon import MultiLangOverrides, run_multilang

    # Each field of MultiLangOverrides is the flag of the same name.
    overrides = MultiLangOverrides(**{flag.name: getattr(args, flag.name) for flag in fields(MultiLangOverrides)})
    run_multilang(Path(args.properties), overrides, environment=flags.environment(args))
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    from worker_lib.cli.status import run_status_cli

    return run_status_cli(
        app=args.app, aws_config=_aws_config(args), watch=args.watch, as_json=args.json, interval_s=args.interval
    )


def _cmd_resume_shard(args: argparse.Namespace) -> int:
    aws_config = _aws_config(args)
    from worker_lib.cli.status import resume_shard

    return resume_shard(app=args.app, lease_key=args.shard, aws_config=aws_config)


def _cmd_liveness(args: argparse.Namespace) -> int:
    aws_config = _aws_config(args)
    from worker_lib.cli.liveness import run_liveness_cli

    return run_liveness_cli(app=args.app, aws_config=aws_config, target=args.target, as_json=args.json)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from worker_lib.cli.simulate import run_autoscale_cli, run_simulate_cli

    if args.autoscale:
        return run_autoscale_cli(
            curve=args.load_curve or "diurnal",
            shards=args.shards,
            skew=args.skew if args.skew != "zipf:1.2" else "zipf:0.5",
            peak_workers=args.peak_workers,
            start_delay_s=args.start_delay,
            noise=args.noise if args.noise is not None else 10.0,
            seed=args.seed,
            plot=args.plot,
        )
    if args.load_curve:
        raise ConfigError("--load-curve needs --autoscale")
    return run_simulate_cli(
        workers=args.workers,
        shards=args.shards,
        skew=args.skew,
        strategy=args.strategy,
        cycles=args.cycles,
        seed=args.seed,
        plot=args.plot,
        join=tuple(args.join),
        kill=tuple(args.kill),
        split=tuple(args.split),
        noise=args.noise if args.noise is not None else 1.0,
        base_cpu=args.base_cpu,
        target_cpu=args.target_cpu,
        cost_factors=args.cost_factors,
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    from worker_lib.cli.demo import run_demo_cli

    return run_demo_cli(workers=args.workers, shards=args.shards, duration_s=args.duration, scenario=args.scenario)


# --- entry point ---------------------------------------------------------------------------------------------------


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # botocore's own chatter would drown ours (and may echo request details); keep it at WARNING.
    for noisy in ("botocore", "boto3", "urllib3", "werkzeug"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, getattr(logging, level)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.log_level)
    func: _Command = args.func
    try:
        code = func(args)
        sys.stdout.flush()  # a reader that went away (`| head`) shows up here, not at interpreter exit
        return code
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_ERROR
    except ConfigError as exc:
        print(f"shardlease {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ShardleaseError as exc:
        print(f"shardlease {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"shardlease {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: still one line for the user, the traceback for whoever debugs it
        log.debug("unexpected error", exc_info=True)
        print(
            f"shardlease {args.command}: unexpected error: {type(exc).__name__}: {exc} "
            "(rerun with --log-level DEBUG for the traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR


def _drop_stdout() -> None:
    """The reader of stdout is gone: point stdout at /dev/null so the interpreter's final flush cannot fail too
    (the recipe of Python's documentation for SIGPIPE). The exit code says it; no line on stderr, as ``cat``."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
