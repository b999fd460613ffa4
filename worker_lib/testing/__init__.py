"""Helpers for integration tests against local emulators, ours and users' (in the spirit of ``kazoo.testing``).

The public surface, imported lazily (nothing here starts or imports moto until used)::

    from worker_lib.testing import LocalEmulators, create_stream, put_records, split_shard, merge_shards

* :class:`LocalEmulators`: moto (DynamoDB, CloudWatch) and kinesalite (Kinesis) on loopback, as a context
  manager, with ``env()`` for ``from_env`` components and ``client(service)`` for the test's own calls.
* :func:`start_moto`, :func:`start_kinesalite`, :func:`start_dynalite`: one emulator each, as a context manager.
* :data:`FAST_TIMINGS`: the ``SHARDLEASE_*`` settings that run the protocol about five times faster than KCL's.
* Stream helpers: :func:`create_stream`, :func:`put_records`, :func:`list_all_shards`, :func:`split_shard`,
  :func:`merge_shards`, :func:`wait_active`.
* :class:`Producer`: uniquely numbered records from a thread at a steady pace (:func:`shard_hash_keys` to give
  every shard the same share); :class:`Put` says where each went.
* :class:`ProcessFleet`: ``shardlease worker`` / ``leader`` processes by name, each in its own session, logging
  to a file, signalled and killed by PID (:class:`FleetProcess`).
* :func:`wait_until`: poll a condition, bounded in time.

moto comes with ``pip install 'shardlease[demo]'``; kinesalite needs Node.js and is installed into a per-user
cache with npm on first use (:mod:`worker_lib.testing.node`). docs/testing.md has a whole example.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker_lib.testing.emulators import Emulator, EmulatorError, start_dynalite, start_kinesalite, start_moto
    from worker_lib.testing.local import LocalEmulators
    from worker_lib.testing.processes import FleetProcess, ProcessFleet
    from worker_lib.testing.producers import Producer, Put, shard_hash_keys
    from worker_lib.testing.streams import (
        create_stream,
        list_all_shards,
        merge_shards,
        put_records,
        split_shard,
        wait_active,
    )
    from worker_lib.testing.timings import FAST_TIMINGS
    from worker_lib.testing.waiting import wait_until

_EXPORTS = {
    "Emulator": "worker_lib.testing.emulators",
    "EmulatorError": "worker_lib.testing.emulators",
    "start_moto": "worker_lib.testing.emulators",
    "start_kinesalite": "worker_lib.testing.emulators",
    "start_dynalite": "worker_lib.testing.emulators",
    "LocalEmulators": "worker_lib.testing.local",
    "FAST_TIMINGS": "worker_lib.testing.timings",
    "FleetProcess": "worker_lib.testing.processes",
    "ProcessFleet": "worker_lib.testing.processes",
    "Producer": "worker_lib.testing.producers",
    "Put": "worker_lib.testing.producers",
    "shard_hash_keys": "worker_lib.testing.producers",
    "wait_until": "worker_lib.testing.waiting",
    "create_stream": "worker_lib.testing.streams",
    "list_all_shards": "worker_lib.testing.streams",
    "merge_shards": "worker_lib.testing.streams",
    "put_records": "worker_lib.testing.streams",
    "split_shard": "worker_lib.testing.streams",
    "wait_active": "worker_lib.testing.streams",
}

__all__ = [
    "FAST_TIMINGS",
    "Emulator",
    "EmulatorError",
    "FleetProcess",
    "LocalEmulators",
    "ProcessFleet",
    "Producer",
    "Put",
    "create_stream",
    "list_all_shards",
    "merge_shards",
    "put_records",
    "shard_hash_keys",
    "split_shard",
    "start_dynalite",
    "start_kinesalite",
    "start_moto",
    "wait_active",
    "wait_until",
]


def __getattr__(name: str) -> Any:  # PEP 562: import on first use
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'worker_lib.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
