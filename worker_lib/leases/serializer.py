"""Lease ⇄ DynamoDB item, with KCL 3.x attribute names and types exactly (docs/kcl-compatibility.md, "Lease table").

Items use the low-level attribute-value format (``{"S": ...}``) so that types are explicit. Attributes this
version does not model are carried in ``Lease.extra`` and written back untouched, so a table written by
another KCL version round-trips unchanged.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from worker_lib.core.errors import CorruptItemError
from worker_lib.core.models import Checkpoint, Lease
from worker_lib.core.streams import split_lease_key
from worker_lib.tables.schema import LEASE_ENTITY_TYPE
from worker_lib.tables.schema import LeaseAttr as A

Item = dict[str, dict[str, Any]]

_MODELLED = frozenset(
    {
        A.LEASE_KEY,
        A.LEASE_COUNTER,
        A.LEASE_OWNER,
        A.CHECKPOINT,
        A.CHECKPOINT_SUB_SEQUENCE,
        A.PENDING_CHECKPOINT,
        A.PENDING_CHECKPOINT_SUB_SEQUENCE,
        A.OWNER_SWITCHES,
        A.PARENT_SHARD_IDS,
        A.CHILD_SHARD_IDS,
        A.STARTING_HASH_KEY,
        A.ENDING_HASH_KEY,
        A.THROUGHPUT_KBPS,
        A.CHECKPOINT_OWNER,
        A.ENTITY_TYPE,
    }
)


def number(value: int | float) -> dict[str, str]:
    """A DynamoDB number in the canonical form DynamoDB itself returns (no exponent, no trailing zeros)."""
    if isinstance(value, int):
        return {"N": str(value)}
    text = format(Decimal(repr(round(value, 6))).normalize(), "f")
    return {"N": text}


def is_foreign(item: Item) -> bool:
    """KCL 3.5 single-table mode stores other entities in the lease table; leases have no or ``LEASE`` type."""
    entity = item.get(A.ENTITY_TYPE)
    return entity is not None and entity.get("S") != LEASE_ENTITY_TYPE


def item_key(item: Item) -> str:
    value = item.get(A.LEASE_KEY, {})
    return str(value.get("S", "?")) if isinstance(value, dict) else "?"


def _s(item: Item, name: str, key: str, *, required: bool = False) -> str | None:
    value = item.get(name)
    if value is None:
        if required:
            raise CorruptItemError(key, f"missing {name}")
        return None
    if not isinstance(value, dict) or "S" not in value or not isinstance(value["S"], str):
        raise CorruptItemError(key, f"{name} is not a string")
    return value["S"]


def _n(item: Item, name: str, key: str) -> Decimal | None:
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, dict) or "N" not in value:
        raise CorruptItemError(key, f"{name} is not a number")
    try:
        parsed = Decimal(value["N"])
    except (InvalidOperation, TypeError):
        raise CorruptItemError(key, f"{name} is not a number") from None
    if not parsed.is_finite():
        raise CorruptItemError(key, f"{name} is not finite")
    return parsed


def _int(item: Item, name: str, key: str, default: int = 0) -> int:
    parsed = _n(item, name, key)
    if parsed is None:
        return default
    if parsed != parsed.to_integral_value():
        raise CorruptItemError(key, f"{name} is not a whole number")
    return int(parsed)


def _ss(item: Item, name: str, key: str) -> frozenset[str]:
    value = item.get(name)
    if value is None:
        return frozenset()
    if not isinstance(value, dict) or "SS" not in value or not isinstance(value["SS"], list):
        raise CorruptItemError(key, f"{name} is not a string set")
    return frozenset(str(v) for v in value["SS"])


def from_item(item: Item) -> Lease:
    """Parse a lease item. Raises :class:`CorruptItemError` if it cannot be a lease."""
    key = item_key(item)
    lease_key = _s(item, A.LEASE_KEY, key, required=True)
    assert lease_key is not None
    if not lease_key:
        raise CorruptItemError(key, "empty leaseKey")
    counter = _int(item, A.LEASE_COUNTER, key)
    if counter < 0:
        raise CorruptItemError(key, "negative leaseCounter")
    checkpoint_seq = _s(item, A.CHECKPOINT, key)
    pending_seq = _s(item, A.PENDING_CHECKPOINT, key)
    throughput = _n(item, A.THROUGHPUT_KBPS, key)
    return Lease(
        lease_key=lease_key,
        lease_counter=counter,
        lease_owner=_s(item, A.LEASE_OWNER, key),
        # KCL always writes a checkpoint; a lease without one has never been read: start at TRIM_HORIZON.
        checkpoint=Checkpoint(
            sequence=checkpoint_seq or "TRIM_HORIZON",
            sub_sequence=_int(item, A.CHECKPOINT_SUB_SEQUENCE, key),
        ),
        pending_checkpoint=(
            Checkpoint(sequence=pending_seq, sub_sequence=_int(item, A.PENDING_CHECKPOINT_SUB_SEQUENCE, key))
            if pending_seq
            else None
        ),
        owner_switches_since_checkpoint=_int(item, A.OWNER_SWITCHES, key),
        parent_shard_ids=_ss(item, A.PARENT_SHARD_IDS, key),
        child_shard_ids=_ss(item, A.CHILD_SHARD_IDS, key),
        starting_hash_key=_s(item, A.STARTING_HASH_KEY, key),
        ending_hash_key=_s(item, A.ENDING_HASH_KEY, key),
        throughput_kbps=float(throughput) if throughput is not None else None,
        checkpoint_owner=_s(item, A.CHECKPOINT_OWNER, key),
        entity_type=_s(item, A.ENTITY_TYPE, key),
        extra={name: value for name, value in item.items() if name not in _MODELLED},
    )


def to_item(lease: Lease) -> Item:
    """The full item for ``lease`` (used for creation and round-trips)."""
    item: Item = {
        A.LEASE_KEY: {"S": lease.lease_key},
        A.LEASE_COUNTER: number(lease.lease_counter),
        A.CHECKPOINT: {"S": lease.checkpoint.sequence},
        A.CHECKPOINT_SUB_SEQUENCE: number(lease.checkpoint.sub_sequence),
        A.OWNER_SWITCHES: number(lease.owner_switches_since_checkpoint),
    }
    if lease.lease_owner is not None:
        item[A.LEASE_OWNER] = {"S": lease.lease_owner}
    if lease.pending_checkpoint is not None:
        item[A.PENDING_CHECKPOINT] = {"S": lease.pending_checkpoint.sequence}
        item[A.PENDING_CHECKPOINT_SUB_SEQUENCE] = number(lease.pending_checkpoint.sub_sequence)
    if lease.parent_shard_ids:  # DynamoDB rejects empty sets; KCL writes the attribute only if non-empty
        item[A.PARENT_SHARD_IDS] = {"SS": sorted(lease.parent_shard_ids)}
    if lease.child_shard_ids:
        item[A.CHILD_SHARD_IDS] = {"SS": sorted(lease.child_shard_ids)}
    if lease.starting_hash_key is not None:
        item[A.STARTING_HASH_KEY] = {"S": lease.starting_hash_key}
    if lease.ending_hash_key is not None:
        item[A.ENDING_HASH_KEY] = {"S": lease.ending_hash_key}
    if lease.throughput_kbps is not None:
        item[A.THROUGHPUT_KBPS] = number(lease.throughput_kbps)
    if lease.checkpoint_owner is not None:
        item[A.CHECKPOINT_OWNER] = {"S": lease.checkpoint_owner}
    if lease.entity_type is not None:
        item[A.ENTITY_TYPE] = {"S": lease.entity_type}
    for name, value in lease.extra.items():
        item.setdefault(name, value)
    stream, shard_id = split_lease_key(lease.lease_key)
    if stream is not None:  # a multi-stream lease names its stream and shard too (DynamoDBMultiStreamLeaseSerializer)
        item.setdefault(A.STREAM_NAME, {"S": stream.serialize()})
        item.setdefault(A.SHARD_ID, {"S": shard_id})
    return item


def canonical(item: Item) -> Item:
    """An item with sets sorted and numbers normalised, for comparing items as DynamoDB would store them."""
    out: Item = {}
    for name, value in item.items():
        if "SS" in value:
            out[name] = {"SS": sorted(value["SS"])}
        elif "N" in value:
            out[name] = {"N": format(Decimal(value["N"]).normalize(), "f")}
        else:
            out[name] = value
    return out
