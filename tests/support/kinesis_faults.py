"""Kinesis fault injection and call recording through botocore event hooks (no emulator changes).

* ``fail_calls(client, "GetRecords", "ExpiredIteratorException", times=1)``: the next ``times`` calls fail with
  that error code *without reaching the emulator* (a ``before-call`` hook answers instead), the way the service
  answers an expired iterator or a throttled shard.
* ``record_calls(client, "GetRecords", clock)``: the time (on ``clock``) and parameters of every call.
* ``add_child_shards(client, ["shardId-…"])``: adds ``ChildShards`` to the shard-end GetRecords reply, for
  emulators that omit the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from botocore.awsrequest import AWSResponse, HTTPHeaders

from worker_lib.core.clock import Clock


def _event(client: Any, kind: str, operation: str) -> str:
    return f"{kind}.{client.meta.service_model.service_id.hyphenize()}.{operation}"


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

    client.meta.events.register_first(event, handler, unique_id=unique_id)
    try:
        yield injected
    finally:
        client.meta.events.unregister(event, unique_id=unique_id)


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

    client.meta.events.register_first(event, handler, unique_id=unique_id)
    try:
        yield log
    finally:
        client.meta.events.unregister(event, unique_id=unique_id)


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

    client.meta.events.register(event, handler, unique_id=unique_id)
    try:
        yield
    finally:
        client.meta.events.unregister(event, unique_id=unique_id)
