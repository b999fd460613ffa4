"""The command line's flags that stand for ``SHARDLEASE_*`` variables: the failure policy (docs/failures.md) and the
lanes (docs/worker.md, "Parallelism: key-ordered lanes").

Each flag given is laid over its variable in a copy of the environment (:func:`environment`), and the command's
configuration is built from that copy: the configuration classes validate a flag's value exactly as they validate
the variable's (one :class:`~worker_lib.core.errors.ConfigError` line), and ``os.environ`` is never written.
"""

from __future__ import annotations

import argparse
import os

FAILURE_FLAGS = {  # flag dest -> the variable it stands for in FailureConfig.from_env (a flag wins over it)
    "failure_policy": "SHARDLEASE_FAILURE_POLICY",
    "max_attempts": "SHARDLEASE_MAX_ATTEMPTS",
    "bisect": "SHARDLEASE_BISECT",
    "max_record_age": "SHARDLEASE_MAX_RECORD_AGE_S",
    "failure_destination": "SHARDLEASE_FAILURE_DESTINATION",
}

LANE_FLAGS = {  # flag dest -> the variable it stands for in ConsumerConfig.from_env
    "parallelism": "SHARDLEASE_PARALLELISM",
    "lane_key": "SHARDLEASE_LANE_KEY",
}

POSITION_SINK = "SHARDLEASE_POSITION_SINK"  # --position-sink: a PositionSink, module:attr (docs/exactly-once.md)


def add_failures(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("failure policy (docs/failures.md; default: the SHARDLEASE_* variables)")
    group.add_argument(
        "--failure-policy",
        choices=["retry", "skip-and-record", "stop-shard", "skip"],
        help="once a failing batch has used its attempts (default retry: read it again, KCL's behaviour)",
    )
    group.add_argument("--max-attempts", metavar="N", help="deliveries of a failing batch in all (3)")
    group.add_argument(
        "--bisect",
        action=argparse.BooleanOptionalAction,
        help="split a failing batch down to the failing record (default: on with skip-and-record and stop-shard)",
    )
    group.add_argument("--max-record-age", metavar="S", help="send records older than S seconds to the destination")
    group.add_argument(
        "--failure-destination", metavar="ARN|S3URL", help="SQS queue ARN, SNS topic ARN or s3://bucket/prefix"
    )


def add_lanes(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("lanes (docs/worker.md; default: the SHARDLEASE_* variables)")
    group.add_argument(
        "--parallelism",
        type=_whole_number,
        metavar="N",
        help="lanes per shard, 1-256: records of one key in order, lanes concurrently (default 1: KCL's behaviour)",
    )
    group.add_argument(
        "--lane-key",
        metavar="partition-key|explicit-hash-key|MODULE:ATTR",
        help="what keeps records in one lane (default partition-key)",
    )


def add_position_sink(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--position-sink",
        metavar="MODULE:ATTR",
        help="a PositionSink (or a function making one) whose positions the shards resume after "
        f"(docs/exactly-once.md; default ${POSITION_SINK})",
    )


def _whole_number(text: str) -> int:
    # Only the syntax here: the range is ConsumerConfig's, the same for the flag and the variable.
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def environment(args: argparse.Namespace) -> dict[str, str]:
    """This process's environment with the flags given laid over their variables: the mapping the command's
    configuration is built from (``os.environ`` itself is never written)."""
    env = dict(os.environ)
    for dest, variable in {**FAILURE_FLAGS, **LANE_FLAGS, "position_sink": POSITION_SINK}.items():
        value = getattr(args, dest, None)
        if value is not None:
            env[variable] = str(value).lower() if isinstance(value, bool) else str(value)
    return env
