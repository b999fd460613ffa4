"""Multi-stream identity (worker_lib/core/streams.py): KCL's serialized form, lease keys, and what is not one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import kcl_fixture
from worker_lib.core.streams import StreamIdentifier, split_lease_key

ORDERS = StreamIdentifier(account_id="123456789012", stream_name="orders", creation_epoch=1_700_000_000)


def test_the_identifier_serializes_as_kcl_writes_it_into_keys_and_stream_name() -> None:
    # GIVEN the multi-stream lease of the KCL fixture (DynamoDBMultiStreamLeaseSerializer, v3.0.0)
    item = next(i for i in kcl_fixture.load()["items"] if "streamName" in i)
    # WHEN its key is split THEN the stream and shard are the item's own streamName and shardId
    stream, shard = split_lease_key(item["leaseKey"]["S"])
    assert stream is not None
    assert stream.serialize() == item["streamName"]["S"]
    assert shard == item["shardId"]["S"]
    assert stream.lease_key(shard) == item["leaseKey"]["S"]


@pytest.mark.parametrize(
    "key", ["shardId-000000000001", "a:b", "x:orders:1700000000:shardId-1", "123:orders:not-a-number:shardId-1"]
)
def test_single_stream_and_unrecognised_keys_have_no_stream_and_are_kept_whole(key: str) -> None:
    assert split_lease_key(key) == (None, key)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("orders", "not a serialized stream identifier"),
        ("123:orders", "not a serialized stream identifier"),
        ("abc:orders:1", "not a serialized stream identifier"),
        ("123::1", "not a serialized stream identifier"),
        ("123:orders:1:extra", "not a serialized stream identifier"),
    ],
)
def test_a_malformed_identifier_is_one_clear_error(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        StreamIdentifier.parse(text)


def test_an_identifier_cannot_be_built_from_parts_kcl_could_not_read_back() -> None:
    with pytest.raises(ValueError, match="account id"):
        StreamIdentifier(account_id="12a", stream_name="s", creation_epoch=1)
    with pytest.raises(ValueError, match="stream name"):
        StreamIdentifier(account_id="1", stream_name="a:b", creation_epoch=1)
    with pytest.raises(ValueError, match="shard id"):
        ORDERS.lease_key("shard:1")


@given(
    account=st.from_regex(r"[0-9]{1,12}", fullmatch=True),
    name=st.from_regex(r"[a-zA-Z0-9_.-]{1,128}", fullmatch=True),
    epoch=st.integers(min_value=0, max_value=2**40),
    shard=st.from_regex(r"shardId-[0-9]{12}", fullmatch=True),
)
def test_every_identifier_and_key_round_trips(account: str, name: str, epoch: int, shard: str) -> None:
    stream = StreamIdentifier(account_id=account, stream_name=name, creation_epoch=epoch)
    assert StreamIdentifier.parse(stream.serialize()) == stream
    assert split_lease_key(stream.lease_key(shard)) == (stream, shard)
