"""KPL de-aggregation against aggregates built by an independent encoder (aws-kinesis-agg and its protobuf
messages), including corrupt aggregates, which must be delivered as they are."""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.kpl import reference_encoder
from worker_lib.core.models import KinesisRecord
from worker_lib.retrieval.deaggregation import (
    MAGIC,
    AggregateFormatError,
    deaggregate,
    deaggregate_records,
    decode_aggregate,
    effective_hash_key,
    is_aggregate,
)

ARRIVAL = datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)


def kpl_aggregate(user_records: list[tuple[str, bytes, str | None]]) -> bytes:
    """An aggregate made by aws-kinesis-agg's RecordAggregator (the reference encoder)."""
    aggregator = reference_encoder().RecordAggregator()
    for partition_key, data, explicit_hash_key in user_records:
        assert aggregator.add_user_record(partition_key, data, explicit_hash_key) is None  # fits in one
    _pk, _ehk, payload = aggregator.clear_and_get().get_contents()
    return bytes(payload)


def framed(message: Any) -> bytes:
    """A protobuf message built with the protobuf runtime, framed as KPL does (magic + body + MD5)."""
    body: bytes = message.SerializeToString()
    return MAGIC + body + hashlib.md5(body).digest()


def kinesis_record(
    data: bytes, *, sequence: str = "49590338271490256608559692538361571095921575989136588898"
) -> KinesisRecord:
    return KinesisRecord(
        data=data, partition_key="outer-key", sequence_number=sequence, approximate_arrival_timestamp=ARRIVAL
    )


def test_aggregate_yields_user_records_with_sub_sequence_numbers() -> None:
    # GIVEN an aggregate of four user records with repeated partition keys and one explicit hash key
    users = [
        ("alpha", b"one", None),
        ("beta", b"two", "170141183460469231731687303715884105728"),
        ("alpha", b"", None),
        ("gamma", bytes(range(256)) * 70, None),  # 17 920 bytes: a three-byte length varint
    ]
    record = kinesis_record(kpl_aggregate(users))
    # WHEN it is de-aggregated
    out = deaggregate(record)
    # THEN every user record comes out in order, sharing the sequence number, indexed by sub-sequence
    assert [(r.partition_key, r.data, r.explicit_hash_key) for r in out] == users
    assert [r.sub_sequence_number for r in out] == [0, 1, 2, 3]
    assert {r.sequence_number for r in out} == {record.sequence_number}
    assert all(r.aggregated and r.approximate_arrival_timestamp == ARRIVAL for r in out)
    assert out[3].checkpoint.sub_sequence == 3


def test_plain_record_passes_through_unchanged() -> None:
    # GIVEN a record that is not an aggregate
    record = kinesis_record(b'{"not": "aggregated"}')
    # WHEN de-aggregated THEN it is the only result, untouched (sub-sequence 0, not aggregated)
    assert deaggregate(record) == [record]
    assert not record.aggregated and record.sub_sequence_number == 0


def test_short_payload_with_magic_is_not_an_aggregate() -> None:
    # GIVEN a payload that starts with the magic number but cannot hold the MD5 trailer
    payload = MAGIC + b"\x00" * 15
    # THEN it is a plain record
    assert not is_aggregate(payload)
    assert deaggregate(kinesis_record(payload)) == [kinesis_record(payload)]


@pytest.mark.parametrize(
    ("name", "corrupt"),
    [
        ("bad md5", lambda p: p[:-1] + bytes([p[-1] ^ 0xFF])),
        ("flipped body byte", lambda p: p[:6] + bytes([p[6] ^ 0x01]) + p[7:]),
        ("truncated", lambda p: p[:-7]),
    ],
)
def test_corrupt_aggregate_is_delivered_raw_with_a_warning(
    name: str, corrupt: object, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a valid aggregate damaged in transit
    payload = kpl_aggregate([("k1", b"secret-payload-1", None), ("k2", b"secret-payload-2", None)])
    assert callable(corrupt)
    damaged = corrupt(payload)
    record = kinesis_record(damaged)
    # WHEN it is de-aggregated
    with caplog.at_level(logging.WARNING, logger="worker_lib.retrieval.deaggregation"):
        out = deaggregate(record)
    # THEN it is delivered once, as is, and a warning names the record but never its payload
    assert out == [record], name
    assert record.sequence_number in caplog.text and "corrupt" in caplog.text
    assert "secret-payload" not in caplog.text


def test_tags_and_unknown_fields_are_skipped() -> None:
    # GIVEN an aggregate built with the protobuf runtime whose records carry tags
    message = reference_encoder().messages_pb2.AggregatedRecord()
    message.partition_key_table.extend(["p0", "p1"])
    message.explicit_hash_key_table.append("42")
    first = message.records.add(partition_key_index=1, data=b"first")
    first.tags.add(key="origin", value="test")
    message.records.add(partition_key_index=0, explicit_hash_key_index=0, data=b"second")
    # WHEN de-aggregated
    out = deaggregate(kinesis_record(framed(message)))
    # THEN tags are ignored and the keys are looked up in the tables
    assert [(r.partition_key, r.explicit_hash_key, r.data) for r in out] == [
        ("p1", None, b"first"),
        ("p0", "42", b"second"),
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [("partition_key_index", 2), ("explicit_hash_key_index", 1)],
)
def test_index_outside_a_key_table_is_corrupt(field: str, value: int) -> None:
    # GIVEN a well-framed aggregate whose record points past a key table
    message = reference_encoder().messages_pb2.AggregatedRecord()
    message.partition_key_table.extend(["p0", "p1"])
    message.explicit_hash_key_table.append("7")
    record_fields = {"partition_key_index": 0, "data": b"x", field: value}
    message.records.add(**record_fields)
    payload = framed(message)
    # THEN decoding fails, and de-aggregation delivers the record raw
    with pytest.raises(AggregateFormatError, match="out of range"):
        decode_aggregate(payload)
    assert deaggregate(kinesis_record(payload)) == [kinesis_record(payload)]


def test_record_without_data_is_corrupt() -> None:
    # GIVEN an aggregate whose record lacks the required data field (proto2 `required`)
    message = reference_encoder().messages_pb2.AggregatedRecord()
    message.partition_key_table.append("p0")
    message.records.add(partition_key_index=0)
    # THEN it is not decoded (the proto2 runtime would refuse it too)
    with pytest.raises(AggregateFormatError, match="required"):
        decode_aggregate(
            MAGIC + message.SerializePartialToString() + hashlib.md5(message.SerializePartialToString()).digest()
        )


def test_hash_range_filter_drops_user_records_of_other_shards() -> None:
    # GIVEN an aggregate whose user records hash into both halves of the key space
    low, high = "1", str(2**127 + 5)
    payload = kpl_aggregate([("a", b"low", low), ("b", b"high", high), ("c", b"md5", None)])
    lower_half = (0, 2**127 - 1)
    # WHEN de-aggregated for a shard owning the lower half
    out = deaggregate(kinesis_record(payload), hash_range=lower_half)
    # THEN only records routed there remain, keeping their original sub-sequence numbers
    expected = [("low", 0)]
    if effective_hash_key("c", None) <= lower_half[1]:
        expected.append(("md5", 2))
    assert [(r.data.decode(), r.sub_sequence_number) for r in out] == expected


def test_effective_hash_key_is_md5_of_the_partition_key() -> None:
    assert effective_hash_key("abc", None) == int(hashlib.md5(b"abc").hexdigest(), 16)
    assert effective_hash_key("abc", "12345") == 12345


def test_batches_keep_shard_order() -> None:
    # GIVEN a batch of a plain record, an aggregate and another plain record
    batch = [
        kinesis_record(b"plain-1", sequence="1"),
        kinesis_record(kpl_aggregate([("k", b"a0", None), ("k", b"a1", None)]), sequence="2"),
        kinesis_record(b"plain-3", sequence="3"),
    ]
    # WHEN de-aggregated THEN the order is shard order, then aggregate order
    out = deaggregate_records(batch)
    assert [(r.sequence_number, r.sub_sequence_number, r.data) for r in out] == [
        ("1", 0, b"plain-1"),
        ("2", 0, b"a0"),
        ("2", 1, b"a1"),
        ("3", 0, b"plain-3"),
    ]


def test_record_repr_never_shows_the_payload() -> None:
    assert "top-secret" not in repr(kinesis_record(b"top-secret"))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=20),
            st.binary(max_size=300),
            st.one_of(st.none(), st.integers(min_value=0, max_value=2**128 - 1).map(str)),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_roundtrip_with_the_reference_encoder(users: list[tuple[str, bytes, str | None]]) -> None:
    # GIVEN any user records aggregated by the reference encoder
    payload = kpl_aggregate(users)
    # WHEN decoded THEN exactly the same records come back
    decoded = decode_aggregate(payload)
    assert [(u.partition_key, u.data, u.explicit_hash_key) for u in decoded] == users
