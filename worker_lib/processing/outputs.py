"""DynamoDB outputs committed with the checkpoint (docs/exactly-once.md): what a processor stages, and how staged
outputs are cut into transactions (pure logic: :func:`plan_commits` takes the staged outputs and returns the
transactions; the lease store sends them).

A processor hands the checkpointer ``TransactWriteItems`` actions with the record they cover
(``checkpointer.stage(record, put_item("orders", {...}))``); the next checkpoint at or past that record commits them
together with the lease's checkpoint, conditioned exactly as the checkpoint is, so a zombie's outputs never land.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker_lib.core.errors import ShardleaseError
from worker_lib.core.models import Checkpoint

__all__ = [
    "MAX_TRANSACTION_ACTIONS",
    "MAX_TRANSACTION_BYTES",
    "OutputTooLargeError",
    "PlannedCommit",
    "StagedOutputs",
    "condition_check",
    "delete_item",
    "plan_commits",
    "put_item",
    "update_item",
]

MAX_TRANSACTION_ACTIONS = 100  # DynamoDB's limit per TransactWriteItems; one of them is the lease's checkpoint
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024  # DynamoDB's limit on a transaction's aggregate item size
_LEASE_ACTION_BYTES = 2048  # room kept for the lease's own update
_ACTIONS = ("Put", "Update", "Delete", "ConditionCheck")

Write = Mapping[str, Any]
"""One ``TransactWriteItems`` action as boto3's client takes it: ``{"Put": {...}}``, ``{"Update": {...}}``,
``{"Delete": {...}}`` or ``{"ConditionCheck": {...}}``, attribute values typed (``{"S": "x"}``)."""


class OutputTooLargeError(ShardleaseError, ValueError):
    """One record's outputs do not fit one transaction (99 actions beside the checkpoint, 4 MB): they could not be
    committed together, so they are refused when staged."""


# --- building actions from Python values -----------------------------------------------------------------------


def _typed(values: Mapping[str, Any]) -> dict[str, Any]:
    from boto3.dynamodb.types import TypeSerializer  # lazily: importing worker_lib stays cheap

    serializer = TypeSerializer()
    return {name: serializer.serialize(value) for name, value in values.items()}


def _with_condition(
    body: dict[str, Any], condition: str | None, names: Mapping[str, str] | None, values: Mapping[str, Any] | None
) -> dict[str, Any]:
    if condition is not None:
        body["ConditionExpression"] = condition
    if names:
        body["ExpressionAttributeNames"] = dict(names)
    if values:
        body["ExpressionAttributeValues"] = _typed(values)
    return body


def put_item(
    table: str,
    item: Mapping[str, Any],
    *,
    condition: str | None = None,
    names: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> Write:
    """A ``Put`` of ``item`` (plain Python values) into ``table``."""
    return {"Put": _with_condition({"TableName": table, "Item": _typed(item)}, condition, names, values)}


def update_item(
    table: str,
    key: Mapping[str, Any],
    expression: str,
    *,
    condition: str | None = None,
    names: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> Write:
    """An ``Update`` of the item at ``key`` in ``table`` with ``expression`` (``SET #n = :v``...)."""
    body = {"TableName": table, "Key": _typed(key), "UpdateExpression": expression}
    return {"Update": _with_condition(body, condition, names, values)}


def delete_item(
    table: str,
    key: Mapping[str, Any],
    *,
    condition: str | None = None,
    names: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> Write:
    """A ``Delete`` of the item at ``key`` in ``table``."""
    return {"Delete": _with_condition({"TableName": table, "Key": _typed(key)}, condition, names, values)}


def condition_check(
    table: str,
    key: Mapping[str, Any],
    condition: str,
    *,
    names: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> Write:
    """A ``ConditionCheck`` on the item at ``key``: the whole transaction is refused unless ``condition`` holds."""
    return {"ConditionCheck": _with_condition({"TableName": table, "Key": _typed(key)}, condition, names, values)}


def validate_write(write: Write) -> tuple[str, Mapping[str, Any]]:
    """The action's kind and body; ValueError for anything that is not one ``TransactWriteItems`` action."""
    if not isinstance(write, Mapping) or len(write) != 1:
        raise ValueError(f"an output is one TransactWriteItems action ({', '.join(_ACTIONS)}), not {write!r:.80}")
    ((kind, body),) = write.items()
    if kind not in _ACTIONS or not isinstance(body, Mapping) or not body.get("TableName"):
        raise ValueError(f"an output is one of {', '.join(_ACTIONS)} with a TableName, not {kind!r}")
    if kind == "Put" and not isinstance(body.get("Item"), Mapping):
        raise ValueError("a Put output needs an Item")
    if kind != "Put" and not isinstance(body.get("Key"), Mapping):
        raise ValueError(f"a {kind} output needs a Key")
    return kind, body


def _size(write: Write) -> int:
    # JSON of the typed values over-counts DynamoDB's item size (quotes, type tags, base64), never under-counts
    return len(json.dumps(write, default=str, separators=(",", ":")))


# --- staging -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StagedRecord:
    position: Checkpoint
    writes: tuple[Write, ...]
    size: int


class StagedOutputs:
    """The outputs staged on one lease, by the record they cover; thread-safe (lanes stage from several threads).

    Outputs of a record at or before the last checkpoint are already committed: staging them again (a batch
    delivered again after a failure) is a no-op, so a record's effects land once."""

    def __init__(self, committed: Callable[[], Checkpoint | None]) -> None:
        self._committed = committed
        self._lock = threading.Lock()
        self._by_position: dict[Checkpoint, StagedRecord] = {}

    def stage(self, position: Checkpoint, writes: Iterable[Write]) -> None:
        actions = tuple(writes)
        for write in actions:
            validate_write(write)
        size = sum(_size(write) for write in actions)
        if len(actions) > MAX_TRANSACTION_ACTIONS - 1 or size > MAX_TRANSACTION_BYTES - _LEASE_ACTION_BYTES:
            raise OutputTooLargeError(
                f"record {position}: {len(actions)} outputs of about {size} bytes do not fit one transaction "
                f"({MAX_TRANSACTION_ACTIONS - 1} actions beside the checkpoint, 4 MB)"
            )
        committed = self._committed()
        if committed is not None and not committed.is_sentinel and not position.is_after(committed):
            return  # committed already, with the checkpoint that covers it
        with self._lock:
            earlier = self._by_position.get(position)
            merged = actions if earlier is None else earlier.writes + actions
            if earlier is not None and len(merged) > MAX_TRANSACTION_ACTIONS - 1:
                raise OutputTooLargeError(f"record {position}: more than {MAX_TRANSACTION_ACTIONS - 1} outputs")
            self._by_position[position] = StagedRecord(position, merged, size + (earlier.size if earlier else 0))

    def discard(self, positions: Iterable[Checkpoint]) -> int:
        """Forget the outputs staged for ``positions`` (a delivery that failed on those records); how many."""
        with self._lock:
            return sum(len(self._by_position.pop(p).writes) for p in positions if p in self._by_position)

    def up_to(self, position: Checkpoint) -> list[StagedRecord]:
        """The staged outputs of records at or before ``position`` (a checkpoint there commits them), in order."""
        with self._lock:
            found = [s for p, s in self._by_position.items() if not p.is_after(position) or position.is_shard_end]
        return sorted(found, key=lambda staged: _order(staged.position))

    def committed(self, staged: Iterable[StagedRecord]) -> None:
        with self._lock:
            for entry in staged:
                self._by_position.pop(entry.position, None)

    def clear(self) -> None:
        with self._lock:
            self._by_position.clear()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(entry.writes) for entry in self._by_position.values())


def _order(position: Checkpoint) -> tuple[int, int]:
    return (int(position.sequence), position.sub_sequence)


# --- cutting into transactions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedCommit:
    """One transaction: these outputs, and the checkpoint written with them."""

    checkpoint: Checkpoint
    writes: tuple[Write, ...]
    covers: tuple[StagedRecord, ...]


ItemIdentity = tuple[str, str]


def item_identity(write: Write, key_names: Callable[[str], Sequence[str]]) -> ItemIdentity:
    """Which item an action touches (validated when staged): (table, its key as JSON). A Put's key is read from its
    item."""
    ((kind, body),) = write.items()
    table = str(body["TableName"])
    key = {name: body["Item"].get(name) for name in key_names(table)} if kind == "Put" else dict(body["Key"])
    return table, json.dumps(key, sort_keys=True, default=str)


def plan_commits(
    staged: Sequence[StagedRecord], checkpoint: Checkpoint, *, key_names: Callable[[str], Sequence[str]]
) -> list[PlannedCommit]:
    """The transactions that commit ``staged`` (in record order) and end at ``checkpoint``.

    A record's outputs stay in one transaction; a transaction holds at most 99 outputs beside the checkpoint, fits
    4 MB, and touches an item once (DynamoDB refuses two actions on one item); each transaction but the last
    checkpoints at the last record it covers, the last one at ``checkpoint``."""
    plans: list[PlannedCommit] = []
    writes: list[Write] = []
    covers: list[StagedRecord] = []
    items: set[ItemIdentity] = set()
    size = 0
    budget = MAX_TRANSACTION_BYTES - _LEASE_ACTION_BYTES
    for entry in staged:
        identities = [item_identity(write, key_names) for write in entry.writes]
        if len(set(identities)) != len(identities):
            raise OutputTooLargeError(f"record {entry.position}: two outputs on one item cannot share a transaction")
        fits = (
            len(writes) + len(entry.writes) <= MAX_TRANSACTION_ACTIONS - 1
            and size + entry.size <= budget
            and items.isdisjoint(identities)
        )
        if covers and not fits:
            plans.append(PlannedCommit(covers[-1].position, tuple(writes), tuple(covers)))
            writes, covers, items, size = [], [], set(), 0
        writes.extend(entry.writes)
        covers.append(entry)
        items.update(identities)
        size += entry.size
    plans.append(PlannedCommit(checkpoint, tuple(writes), tuple(covers)))
    return plans
