"""De-aggregation of KPL aggregated records, with no protobuf runtime.

The KPL aggregation format (public, in the amazon-kinesis-producer repository, ``aggregation-format.md``)::

    +---------------------+------------------------------+-----------------------------+
    | magic F3 89 9A C2   | protobuf AggregatedRecord    | MD5 of the protobuf (16 B)  |
    +---------------------+------------------------------+-----------------------------+

    message AggregatedRecord { repeated string partition_key_table = 1;
                               repeated string explicit_hash_key_table = 2;
                               repeated Record records = 3; }
    message Record { required uint64 partition_key_index = 1; optional uint64 explicit_hash_key_index = 2;
                     required bytes data = 3; repeated Tag tags = 4; }
    message Tag { required string key = 1; optional string value = 2; }

The schema is small and stable, so a ~80-line wire-format reader (varints and length-delimited fields, unknown
fields skipped) replaces the ``protobuf`` runtime and the ``aws-kinesis-agg`` package. That package (1.2.3, last
released 2022) needs the protobuf runtime, puts its own directory and site-packages at the front of ``sys.path``
when imported (a process-wide side effect a library must not have), and its de-aggregator works on Lambda-event
dictionaries rather than GetRecords records. The tests use its *aggregator* as an independent encoder.

Every user record inside an aggregate gets the aggregate's sequence number and its index in the aggregate as
sub-sequence number, as KCL does. A record that starts with the magic number but does not decode (bad MD5,
truncated, malformed protobuf, index out of a key table) is delivered unchanged as one plain record, with a
warning naming its sequence number — never dropped. Payloads are never logged.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace

from worker_lib.core.models import KinesisRecord

log = logging.getLogger(__name__)

MAGIC = b"\xf3\x89\x9a\xc2"
DIGEST_SIZE = 16  # MD5
MAX_HASH_KEY = 2**128 - 1

# protobuf wire types
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5


class AggregateFormatError(ValueError):
    """The bytes start like a KPL aggregate but are not a valid one."""


@dataclass(frozen=True, slots=True)
class UserRecord:
    """One user record decoded from an aggregate."""

    partition_key: str
    explicit_hash_key: str | None
    data: bytes


# --- wire format ---------------------------------------------------------------------------------------------


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise AggregateFormatError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise AggregateFormatError("varint longer than 10 bytes")


def _fields(buf: memoryview) -> Iterable[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) for each field of a message; varints as int, LEN as a view."""
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = _read_varint(buf, pos)
        number, wire_type = key >> 3, key & 0x7
        if number == 0:
            raise AggregateFormatError("field number 0")
        if wire_type == _VARINT:
            value, pos = _read_varint(buf, pos)
            yield number, wire_type, value
        elif wire_type == _LEN:
            length, pos = _read_varint(buf, pos)
            if pos + length > end:
                raise AggregateFormatError("truncated length-delimited field")
            yield number, wire_type, buf[pos : pos + length]
            pos += length
        elif wire_type in (_I64, _I32):  # not in the schema; skip as an unknown field
            pos += 8 if wire_type == _I64 else 4
            if pos > end:
                raise AggregateFormatError("truncated fixed-width field")
        else:  # groups are deprecated and not in the schema
            raise AggregateFormatError(f"unsupported wire type {wire_type}")


def _text(value: int | memoryview, what: str) -> str:
    if not isinstance(value, memoryview):
        raise AggregateFormatError(f"{what} is not a string")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise AggregateFormatError(f"{what} is not UTF-8") from None


def _index(value: int | memoryview, what: str) -> int:
    if isinstance(value, memoryview):
        raise AggregateFormatError(f"{what} is not a varint")
    return value


def decode_aggregate(payload: bytes) -> list[UserRecord]:
    """The user records of a KPL aggregate (magic + protobuf + MD5). Raises :class:`AggregateFormatError`."""
    if not is_aggregate(payload):
        raise AggregateFormatError("no KPL magic number or too short")
    body = memoryview(payload)[len(MAGIC) : len(payload) - DIGEST_SIZE]
    if hashlib.md5(body, usedforsecurity=False).digest() != payload[-DIGEST_SIZE:]:
        raise AggregateFormatError("MD5 checksum mismatch")
    partition_keys: list[str] = []
    hash_keys: list[str] = []
    raw_records: list[memoryview] = []
    for number, _wire, value in _fields(body):
        if number == 1:
            partition_keys.append(_text(value, "partition key"))
        elif number == 2:
            hash_keys.append(_text(value, "explicit hash key"))
        elif number == 3:
            if not isinstance(value, memoryview):
                raise AggregateFormatError("record is not a message")
            raw_records.append(value)
    records: list[UserRecord] = []
    for i, raw in enumerate(raw_records):
        pk_index: int | None = None
        ehk_index: int | None = None
        data: bytes | None = None
        for number, _wire, value in _fields(raw):
            if number == 1:
                pk_index = _index(value, "partition_key_index")
            elif number == 2:
                ehk_index = _index(value, "explicit_hash_key_index")
            elif number == 3:
                if not isinstance(value, memoryview):
                    raise AggregateFormatError("data is not bytes")
                data = bytes(value)
            # 4 (tags) and unknown fields are ignored
        if pk_index is None or data is None:
            raise AggregateFormatError(f"record {i} lacks a required field")
        if pk_index >= len(partition_keys):
            raise AggregateFormatError(f"record {i}: partition key index {pk_index} out of range")
        if ehk_index is not None and ehk_index >= len(hash_keys):
            raise AggregateFormatError(f"record {i}: explicit hash key index {ehk_index} out of range")
        records.append(
            UserRecord(
                partition_key=partition_keys[pk_index],
                explicit_hash_key=hash_keys[ehk_index] if ehk_index is not None else None,
                data=data,
            )
        )
    return records


def is_aggregate(payload: bytes) -> bool:
    """Whether ``payload`` starts with the KPL magic number and is long enough to hold the MD5 trailer."""
    return len(payload) >= len(MAGIC) + DIGEST_SIZE and payload[: len(MAGIC)] == MAGIC


# --- records -------------------------------------------------------------------------------------------------


def effective_hash_key(partition_key: str, explicit_hash_key: str | None) -> int:
    """The 128-bit hash key Kinesis routes by: the explicit hash key, else MD5(partition key) as an integer."""
    if explicit_hash_key is not None:
        return int(explicit_hash_key)
    return int.from_bytes(hashlib.md5(partition_key.encode("utf-8"), usedforsecurity=False).digest(), "big")


def deaggregate(record: KinesisRecord, *, hash_range: tuple[int, int] | None = None) -> list[KinesisRecord]:
    """The user records of ``record``: itself when it is not an aggregate (or a corrupt one), else its parts.

    hash_range: the shard's (starting, ending) hash keys; user records of an aggregate that fall outside are
      dropped, as KCL does. Off by default in this package: the aggregate is stored only in this shard, so a
      dropped user record (a KPL aggregate built with a stale shard map) is read by no one — a loss.
      A non-aggregated record is never filtered.
    """
    if not is_aggregate(record.data):
        return [record]
    try:
        parts = decode_aggregate(record.data)
    except (AggregateFormatError, ValueError) as exc:
        log.warning(
            "record %s looks like a KPL aggregate but is corrupt (%s): delivered as is",
            record.sequence_number,
            exc,
        )
        return [record]
    out: list[KinesisRecord] = []
    for index, part in enumerate(parts):
        if hash_range is not None:
            try:
                key: int | None = effective_hash_key(part.partition_key, part.explicit_hash_key)
            except ValueError:
                key = None  # not a number: cannot tell where it belongs, so keep it (never lose a record)
            if key is not None and not hash_range[0] <= key <= hash_range[1]:
                log.debug("record %s/%d is outside the shard's hash key range: skipped", record.sequence_number, index)
                continue
        out.append(
            replace(
                record,
                data=part.data,
                partition_key=part.partition_key,
                explicit_hash_key=part.explicit_hash_key,
                sub_sequence_number=index,
                aggregated=True,
            )
        )
    return out


def deaggregate_records(
    records: Iterable[KinesisRecord], *, hash_range: tuple[int, int] | None = None
) -> list[KinesisRecord]:
    """:func:`deaggregate` over a batch, keeping shard order."""
    out: list[KinesisRecord] = []
    for record in records:
        out.extend(deaggregate(record, hash_range=hash_range))
    return out
