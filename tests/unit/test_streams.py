"""Multi-stream identity (worker_lib/core/streams.py): KCL's serialized form, lease keys, and what is not one."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import kcl_fixture
from worker_lib.core.errors import ConfigError
from worker_lib.core.streams import (
    StreamIdentifier,
    StreamSelection,
    parse_stream_entry,
    related_lease_key,
    split_lease_key,
    stream_name_of,
)

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


@settings(deadline=None)  # correctness, whatever the machine's speed: no per-example time limit
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


# --- related keys, the stream of a lease ---------------------------------------------------------------------------


def test_a_parent_or_child_of_a_multi_stream_lease_is_looked_up_under_the_same_stream() -> None:
    key = ORDERS.lease_key("shardId-000000000004")
    assert related_lease_key(key, "shardId-000000000001") == ORDERS.lease_key("shardId-000000000001")
    assert stream_name_of(key, default="other") == "orders"


def test_a_single_stream_lease_keeps_bare_keys_and_the_configured_stream() -> None:
    assert related_lease_key("shardId-000000000004", "shardId-000000000001") == "shardId-000000000001"
    assert stream_name_of("shardId-000000000004", default="orders") == "orders"


def test_a_configured_entry_is_a_name_or_a_serialized_identifier() -> None:
    assert parse_stream_entry("orders") == ("orders", None)
    assert parse_stream_entry(ORDERS.serialize()) == ("orders", ORDERS)


# --- the selection of streams --------------------------------------------------------------------------------------


def test_one_name_is_a_single_stream_application_unless_told_otherwise() -> None:
    assert StreamSelection.of("orders").multi_stream is False
    assert StreamSelection.of("orders").single == "orders"
    assert StreamSelection(names=("orders",), multi_stream=True).single == ""


def test_several_names_or_a_tracker_make_a_multi_stream_application() -> None:
    assert StreamSelection.of("orders, clicks").names == ("orders", "clicks")
    assert StreamSelection.of(["orders", "clicks"]).multi_stream is True
    assert StreamSelection(tracker=lambda: ["orders"]).multi_stream is True


@pytest.mark.parametrize(
    ("names", "fragment"), [((), "no stream given"), (("a", "a"), "named twice"), (("a", " "), "empty")]
)
def test_a_wrong_selection_is_one_clear_error(names: tuple[str, ...], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        StreamSelection(names=names)


def test_the_tracker_decides_the_current_streams_in_its_order_without_duplicates() -> None:
    selection = StreamSelection(names=("ignored",), tracker=lambda: ["b", "a", "b "])
    assert selection.current() == ("b", "a")


@pytest.mark.parametrize(
    ("tracker", "fragment"),
    [(lambda: 1 / 0, "the stream tracker raised ZeroDivisionError"), (lambda: ["a", 3], "not a list of stream names")],
)
def test_a_tracker_that_fails_is_one_clear_error(tracker: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        StreamSelection(tracker=tracker).current()


def current_streams() -> list[str]:
    return ["orders", "clicks"]


class TrackerObject:
    def stream_names(self) -> list[str]:
        return ["orders"]


TRACKER_OBJECT = TrackerObject()


def test_the_environment_names_the_streams_comma_separated_or_a_tracker() -> None:
    env = {"SHARDLEASE_STREAM": "orders,clicks"}
    assert StreamSelection.from_env(env).names == ("orders", "clicks")
    tracked = StreamSelection.from_env({"SHARDLEASE_STREAM_TRACKER": "tests.unit.test_streams:current_streams"})
    assert tracked.current() == ("orders", "clicks")
    method = StreamSelection.from_env({"SHARDLEASE_STREAM_TRACKER": "tests.unit.test_streams:TRACKER_OBJECT"})
    assert method.current() == ("orders",)
    forced = StreamSelection.from_env({"SHARDLEASE_STREAM": "orders", "SHARDLEASE_MULTI_STREAM": "true"})
    assert forced.multi_stream is True


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({}, "SHARDLEASE_STREAM"),
        ({"SHARDLEASE_STREAM_TRACKER": "nope"}, "expected MODULE:ATTR"),
        ({"SHARDLEASE_STREAM_TRACKER": "tests.unit.test_streams:ORDERS"}, "is not callable"),
        ({"SHARDLEASE_STREAM_TRACKER": "no_such_module_x:f"}, "no module named"),
    ],
)
def test_a_wrong_environment_is_one_config_error(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        StreamSelection.from_env(env)
