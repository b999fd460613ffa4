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
    "WorkerConfig": "worker_lib.worker.worker",
    "AwsConfig": "worker_lib.core.config",
    "InitialPosition": "worker_lib.core.config",
    "StreamIdentifier": "worker_lib.core.streams",
    "TableLayout": "worker_lib.tables.schema",
    "split_lease_key": "worker_lib.core.streams",
    "FunctionProcessor": "worker_lib.processing.processor",
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
    "AwsConfig",
    "CheckpointError",
    "Checkpointer",
    "ConfigError",
    "CorruptItemError",
    "CredentialsError",
    "DependencyError",
    "EndpointUnreachableError",
    "FunctionProcessor",
    "InitialPosition",
    "InitializationInput",
    "InvalidCheckpointError",
    "InvalidStateError",
    "KinesisRecord",
    "LeaseLostInput",
    "MissingExtraError",
    "ProcessRecordsInput",
    "RecordProcessor",
    "ShardEndedInput",
    "ShardleaseError",
    "ShutdownError",
    "ShutdownRequestedInput",
    "StreamIdentifier",
    "StreamMissingError",
    "SupersededError",
    "TableLayout",
    "TableMissingError",
    "TableSchemaError",
    "ThrottledError",
    "Worker",
    "WorkerConfig",
    "__version__",
    "split_lease_key",
]

if TYPE_CHECKING:
    from worker_lib.core.config import AwsConfig, InitialPosition
    from worker_lib.core.errors import (
        ConfigError,
        CorruptItemError,
        CredentialsError,
        DependencyError,
        EndpointUnreachableError,
        InvalidStateError,
        MissingExtraError,
        ShardleaseError,
        StreamMissingError,
        SupersededError,
        TableMissingError,
        TableSchemaError,
        ThrottledError,
    )
    from worker_lib.core.models import KinesisRecord
    from worker_lib.core.streams import StreamIdentifier, split_lease_key
    from worker_lib.processing.processor import (
        Checkpointer,
        CheckpointError,
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
    from worker_lib.tables.schema import TableLayout
    from worker_lib.worker.worker import Worker, WorkerConfig


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'worker_lib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
