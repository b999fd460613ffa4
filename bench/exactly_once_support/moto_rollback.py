"""A moto server whose TransactWriteItems keeps a rollback copy of the items it touches, not of whole tables.

moto (5.2.5) backs a transaction up by ``copy.deepcopy`` of each table it names, once *per action*: a transaction
of 99 puts into a table of n items deep-copies it 99 times, so its cost grows with the table (1.9 s at 1 000 items
and 15 s at 8 000 on the idle 2-core machine, against 15 ms for the same items by BatchWriteItem). DynamoDB has no
such cost. This launcher runs the same server (``worker_lib.testing._moto_server``) with that one step replaced:
the backup of a table is taken once per transaction, as a new table object sharing the untouched items, with deep
copies of the items the transaction names. A transaction that fails is rolled back to it as before, so outputs and
checkpoint still land together or not at all; what a failed transaction appended to a table's stream is not undone.

:func:`start_moto` starts it (a child process running :func:`install`, then the stock server's ``main``) as
:func:`worker_lib.testing.emulators.start_moto` starts the stock one.
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from worker_lib.testing import emulators

_local = threading.local()  # the transaction running on this thread (moto's server serves requests on threads)
_deepcopy = copy.deepcopy


class _CopyModule:
    """Stands for ``copy`` inside ``moto.dynamodb.models``: a table deep-copied by a transaction on this thread gets
    :func:`_backup` (once per table); everything else the real ``copy.deepcopy``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        from moto.dynamodb.models.table import Table

        backup: Callable[[Any], Any] | None = getattr(_local, "backup", None)
        if backup is None or not isinstance(value, Table):
            return _deepcopy(value, memo)
        return backup(value)


def _keys(table: Any, actions: Sequence[Mapping[str, Any]]) -> Iterator[tuple[Any, Any]]:
    """(hash, range) of every item of ``table`` that ``actions`` name (range None for a hash-only table)."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    for action in actions:
        ((kind, body),) = action.items()
        if body.get("TableName") != table.name:
            continue
        attrs = body["Item"] if kind == "Put" else body["Key"]
        if table.hash_key_attr not in attrs:
            continue  # moto raises its own validation error for it
        range_attr = table.range_key_attr
        yield (
            DynamoType(attrs[table.hash_key_attr]),
            DynamoType(attrs[range_attr]) if range_attr and range_attr in attrs else None,
        )


def _table_backup(table: Any, actions: Sequence[Mapping[str, Any]]) -> Any:
    """A table object to restore on rollback: the same items, the touched ones deep-copied (an Update changes its
    item in place; a Put or a Delete replaces the entry, which the copied dicts keep)."""
    clone = copy.copy(table)
    items = copy.copy(table.items)  # a defaultdict: hash key -> item, or -> {range key: item}
    for hash_key, range_key in _keys(table, actions):
        if hash_key not in items:
            continue
        if range_key is None:
            items[hash_key] = _deepcopy(items[hash_key])
        else:  # a Put or a Delete changes the hash key's own dict: a copy of it, the touched item deep-copied
            bucket = items[hash_key] = dict(items[hash_key])
            if range_key in bucket:
                bucket[range_key] = _deepcopy(bucket[range_key])
    clone.items = items
    return clone


def install() -> None:
    """Patch moto's DynamoDB backend in this process (idempotent)."""
    from moto.dynamodb import models

    namespace = vars(models)  # its global ``copy``: the module the backup step calls
    if isinstance(namespace["copy"], _CopyModule):
        return
    namespace["copy"] = _CopyModule()
    shipped = models.DynamoDBBackend.transact_write_items

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        taken: dict[int, Any] = {}

        def backup(table: Any) -> Any:
            if id(table) not in taken:
                taken[id(table)] = _table_backup(table, transact_items)
            return taken[id(table)]

        _local.backup = backup
        try:
            shipped(self, transact_items)
        finally:
            _local.backup = None

    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def start_moto(*, timeout_s: float = 30.0, log_path: Path | None = None) -> emulators.Emulator:
    """This launcher as a child process on a free loopback port (stopped by PID, like the stock one)."""
    bench = Path(__file__).resolve().parents[1]
    launch = (
        f"import sys; sys.path[:0] = [{str(bench.parent)!r}, {str(bench)!r}]; "
        "from exactly_once_support.moto_rollback import install; install(); "
        "from worker_lib.testing._moto_server import main; raise SystemExit(main())"
    )
    argv = [sys.executable, "-c", launch, "{port_file}"]
    # worker_lib.testing.start_moto's own spawner: the port through a file, a session of its own, a bounded wait
    from importlib.metadata import version

    source = f"moto {version('moto')}, TransactWriteItems rolling back the items it touches"
    return emulators._spawn("moto", argv, timeout_s, log_path, source=source)
