"""shardlease: KCL 3.x-compatible lease coordination for Amazon Kinesis consumers, in pure Python.

The public API is what this module exports (``__all__``; docs/api.md)::

    from worker_lib import FunctionProcessor, Worker, WorkerConfig

Every other module (``worker_lib.<subpackage>``) is internal and may change between releases, except
``worker_lib.cdk`` (the CDK construct, docs/deploy.md), ``worker_lib.spark`` (the Spark source, docs/spark.md) and
``worker_lib.testing`` (emulators and stream helpers for tests, docs/testing.md).

Importing this package creates no AWS clients, starts no threads and does not import boto3: each name is imported
on first use (PEP 562), so a CLI or a Lambda cold start pays only for what it touches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it. One table, read by __getattr__, __dir__ and the tests.
_EXPORTS: dict[str, str] = {
    "Worker": "worker_lib.worker.worker",
    "WorkerConfig": "worker_lib.worker.config",
    # The configuration: WorkerConfig's fields, and the leader's settings (docs/api.md).
    "AwsConfig": "worker_lib.core.config",
    "InitialPosition": "worker_lib.core.config",
    "TableLayout": "worker_lib.tables.schema",
    "LeaseConfig": "worker_lib.leases.config",
    "ConsumerConfig": "worker_lib.processing.config",
    "FailureConfig": "worker_lib.processing.config",
    "FailureAction": "worker_lib.processing.config",
    "RetrievalConfig": "worker_lib.retrieval.config",
    "RetrievalMode": "worker_lib.retrieval.config",
    "MetricsConfig": "worker_lib.telemetry.publisher",
    "WorkerMetricsConfig": "worker_lib.workermetrics.config",
    "ShardSyncConfig": "worker_lib.shardsync.config",
    "LeaderConfig": "worker_lib.leader.config",
    "LeaderLockConfig": "worker_lib.leader.config",
    "AssignmentConfig": "worker_lib.assignment.config",
    "ScalingConfig": "worker_lib.scaling.config",
    "StreamIdentifier": "worker_lib.core.streams",
    "split_lease_key": "worker_lib.core.streams",
    "FunctionProcessor": "worker_lib.processing.processor",
    "AsyncFunctionProcessor": "worker_lib.processing.processor",
    "AsyncCheckpointer": "worker_lib.processing.processor",
    "RecordProcessor": "worker_lib.processing.processor",
    "Checkpointer": "worker_lib.processing.processor",
    "KinesisRecord": "worker_lib.core.models",
    "InitializationInput": "worker_lib.processing.processor",
    "ProcessRecordsInput": "worker_lib.processing.processor",
    "LeaseLostInput": "worker_lib.processing.processor",
    "ShardEndedInput": "worker_lib.processing.processor",
    "ShutdownRequestedInput": "worker_lib.processing.processor",
    "CheckpointError": "worker_lib.processing.processor",
    "ShutdownError": "worker_lib.processing.processor",
    "InvalidCheckpointError": "worker_lib.processing.processor",
    "RecordFailedError": "worker_lib.processing.failures",
    # Exactly-once effects (docs/exactly-once.md)
    "ExactlyOnceCheckpointer": "worker_lib.processing.processor",
    "put_item": "worker_lib.processing.outputs",
    "update_item": "worker_lib.processing.outputs",
    "delete_item": "worker_lib.processing.outputs",
    "condition_check": "worker_lib.processing.outputs",
    "OutputTooLargeError": "worker_lib.processing.outputs",
    "OutputConditionError": "worker_lib.core.errors",
    "PositionSink": "worker_lib.processing.positions",
    "SqlPositions": "worker_lib.processing.positions",
    "SqlDialect": "worker_lib.processing.positions",
    "PositionFencedError": "worker_lib.processing.positions",
    "ShardleaseError": "worker_lib.core.errors",
    "ConfigError": "worker_lib.core.errors",
    "DependencyError": "worker_lib.core.errors",
    "EndpointUnreachableError": "worker_lib.core.errors",
    "CredentialsError": "worker_lib.core.errors",
    "ThrottledError": "worker_lib.core.errors",
    "TableMissingError": "worker_lib.core.errors",
    "TableSchemaError": "worker_lib.core.errors",
    "StreamMissingError": "worker_lib.core.errors",
    "MissingExtraError": "worker_lib.core.errors",
    "InvalidStateError": "worker_lib.core.errors",
    "CorruptItemError": "worker_lib.core.errors",
    "SupersededError": "worker_lib.core.errors",
}

# A literal list, so that type checkers and IDEs see the public names without running __getattr__.
__all__ = [
    "AssignmentConfig",
    "AsyncCheckpointer",
    "AsyncFunctionProcessor",
    "AwsConfig",
    "CheckpointError",
    "Checkpointer",
    "ConfigError",
    "ConsumerConfig",
    "CorruptItemError",
    "CredentialsError",
    "DependencyError",
    "EndpointUnreachableError",
    "ExactlyOnceCheckpointer",
    "FailureAction",
    "FailureConfig",
    "FunctionProcessor",
    "InitialPosition",
    "InitializationInput",
    "InvalidCheckpointError",
    "InvalidStateError",
    "KinesisRecord",
    "LeaderConfig",
    "LeaderLockConfig",
    "LeaseConfig",
    "LeaseLostInput",
    "MetricsConfig",
    "MissingExtraError",
    "OutputConditionError",
    "OutputTooLargeError",
    "PositionFencedError",
    "PositionSink",
    "ProcessRecordsInput",
    "RecordFailedError",
    "RecordProcessor",
    "RetrievalConfig",
    "RetrievalMode",
    "ScalingConfig",
    "ShardEndedInput",
    "ShardSyncConfig",
    "ShardleaseError",
    "ShutdownError",
    "ShutdownRequestedInput",
    "SqlDialect",
    "SqlPositions",
    "StreamIdentifier",
    "StreamMissingError",
    "SupersededError",
    "TableLayout",
    "TableMissingError",
    "TableSchemaError",
    "ThrottledError",
    "Worker",
    "WorkerConfig",
    "WorkerMetricsConfig",
    "__version__",
    "condition_check",
    "delete_item",
    "put_item",
    "split_lease_key",
    "update_item",
]

if TYPE_CHECKING:
    from worker_lib.assignment.config import AssignmentConfig
    from worker_lib.core.config import AwsConfig, InitialPosition
    from worker_lib.core.errors import (
        ConfigError,
        CorruptItemError,
        CredentialsError,
        DependencyError,
        EndpointUnreachableError,
        InvalidStateError,
        MissingExtraError,
        OutputConditionError,
        ShardleaseError,
        StreamMissingError,
        SupersededError,
        TableMissingError,
        TableSchemaError,
        ThrottledError,
    )
    from worker_lib.core.models import KinesisRecord
    from worker_lib.core.streams import StreamIdentifier, split_lease_key
    from worker_lib.leader.config import LeaderConfig, LeaderLockConfig
    from worker_lib.leases.config import LeaseConfig
    from worker_lib.processing.config import ConsumerConfig, FailureAction, FailureConfig
    from worker_lib.processing.failures import RecordFailedError
    from worker_lib.processing.outputs import (
        OutputTooLargeError,
        condition_check,
        delete_item,
        put_item,
        update_item,
    )
    from worker_lib.processing.positions import PositionFencedError, PositionSink, SqlDialect, SqlPositions
    from worker_lib.processing.processor import (
        AsyncCheckpointer,
        AsyncFunctionProcessor,
        Checkpointer,
        CheckpointError,
        ExactlyOnceCheckpointer,
        FunctionProcessor,
        InitializationInput,
        InvalidCheckpointError,
        LeaseLostInput,
        ProcessRecordsInput,
        RecordProcessor,
        ShardEndedInput,
        ShutdownError,
        ShutdownRequestedInput,
    )
    from worker_lib.retrieval.config import RetrievalConfig, RetrievalMode
    from worker_lib.scaling.config import ScalingConfig
    from worker_lib.shardsync.config import ShardSyncConfig
    from worker_lib.tables.schema import TableLayout
    from worker_lib.telemetry.publisher import MetricsConfig
    from worker_lib.worker.config import WorkerConfig
    from worker_lib.worker.worker import Worker
    from worker_lib.workermetrics.config import WorkerMetricsConfig


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'worker_lib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
