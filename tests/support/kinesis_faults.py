"""Kinesis fault injection and call recording through botocore event hooks (no emulator changes).

* ``fail_calls(client, "GetRecords", "ExpiredIteratorException", times=1)``: the next ``times`` calls fail with
  that error code *without reaching the emulator* (a ``before-call`` hook answers instead), the way the service
  answers an expired iterator or a throttled shard.
* ``record_calls(client, "GetRecords", clock)``: the time (on ``clock``) and parameters of every call.
* ``add_child_shards(client, ["shardId-…"])``: adds ``ChildShards`` to the shard-end GetRecords reply, for
  emulators that omit the field.
* ``one_attempt_kinesis(endpoint)``, ``new_stream(kinesis, prefix)``: a client that does not retry faults away, and
  a fresh one-shard stream to read.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from botocore.awsrequest import AWSResponse, HTTPHeaders

from worker_lib.core import aws
from worker_lib.core.clock import Clock
from worker_lib.core.config import AwsConfig
from worker_lib.testing.streams import create_stream


def _event(client: Any, kind: str, operation: str) -> str:
    return f"{kind}.{client.meta.service_model.service_id.hyphenize()}.{operation}"


@contextmanager
def _hooked(client: Any, event: str, handler: Any, unique_id: str, *, first: bool = True) -> Iterator[None]:
    """``handler`` on ``event`` of ``client`` (before the other handlers if ``first``) while the block runs."""
    if first:
        client.meta.events.register_first(event, handler, unique_id=unique_id)
    else:
        client.meta.events.register(event, handler, unique_id=unique_id)
    try:
        yield
    finally:
        client.meta.events.unregister(event, unique_id=unique_id)


def one_attempt_kinesis(endpoint: str) -> Any:
    """A Kinesis client on ``endpoint`` that tries each call once, so that an injected failure reaches the code
    under test (botocore does not retry it away)."""
    return aws.client("kinesis", AwsConfig(endpoint_url=endpoint, max_attempts=1, connect_timeout_s=2))


def new_stream(kinesis: Any, prefix: str) -> str:
    """A new one-shard stream ``<prefix>-<random>``, ACTIVE."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    create_stream(kinesis, name, 1)
    return name


@dataclass
class Injected:
    """What a :func:`fail_calls` hook did: how many calls it failed."""

    failed: int = 0


@contextmanager
def fail_calls(
    client: Any, operation: str, code: str, *, times: int = 1, skip: int = 0, status: int = 400
) -> Iterator[Injected]:
    """Fail calls ``skip + 1`` … ``skip + times`` of ``operation`` with error ``code`` (HTTP ``status``)."""
    injected = Injected()
    seen = [0]
    event = _event(client, "before-call", operation)
    unique_id = f"fail-calls-{id(injected)}"

    def handler(model: Any, params: Any, **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        seen[0] += 1
        if seen[0] <= skip or injected.failed >= times:
            return None
        injected.failed += 1
        response = AWSResponse(url="http://injected", status_code=status, headers=HTTPHeaders(), raw=None)
        parsed = {
            "Error": {"Code": code, "Message": f"injected {code}"},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}, "RetryAttempts": 0},
        }
        return response, parsed

    with _hooked(client, event, handler, unique_id):
        yield injected


@dataclass
class CallLog:
    """Calls seen by :func:`record_calls`: clock readings and parameters, in order."""

    times: list[float] = field(default_factory=list)
    params: list[dict[str, Any]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.times)

    def gaps(self) -> list[float]:
        return [round(b - a, 6) for a, b in zip(self.times, self.times[1:], strict=False)]


@contextmanager
def record_calls(client: Any, operation: str, clock: Clock) -> Iterator[CallLog]:
    """Record every ``operation`` call, including the ones a :func:`fail_calls` hook answers."""
    log = CallLog()
    event = _event(client, "before-parameter-build", operation)
    unique_id = f"record-calls-{id(log)}"

    def handler(params: Any, **_: Any) -> None:
        log.times.append(clock.monotonic())
        log.params.append(dict(params))

    with _hooked(client, event, handler, unique_id):
        yield log


@contextmanager
def add_child_shards(client: Any, child_ids: list[str]) -> Iterator[None]:
    """Make the GetRecords reply that ends a shard carry ``ChildShards`` (as the real service does)."""
    event = _event(client, "after-call", "GetRecords")
    unique_id = f"add-child-shards-{id(child_ids)}"

    def handler(parsed: dict[str, Any], **_: Any) -> None:
        if "Error" not in parsed and not parsed.get("NextShardIterator"):
            parsed["ChildShards"] = [
                {"ShardId": child, "ParentShards": [], "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"}}
                for child in child_ids
            ]

    with _hooked(client, event, handler, unique_id, first=False):
        yield
