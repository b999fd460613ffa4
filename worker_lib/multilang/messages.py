"""KCL's MultiLang protocol, the daemon's side, as pure functions: the lines we write and what the child's lines mean.

The protocol (KCL's ``software.amazon.kinesis.multilang``; the clients amazon-kclpy and aws-kcl speak it): one JSON
object per line on the child's stdin and stdout. For every message the daemon sends, the child answers
``{"action": "status", "responseFor": <the message's action>}``; before that answer it may ask for any number of
checkpoints, ``{"action": "checkpoint", "sequenceNumber": s|null, "subSequenceNumber": n|null}``, each of which
the daemon answers with a ``checkpoint`` message carrying ``error`` (the simple name of KCL's exception) or none.

Daemon → child, generation 2 (KCL 2.x and 3.x daemons; amazon-kclpy ≥ 2, aws-kcl ≥ 2)::

    {"action":"initialize","shardId":"shardId-000000000001","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}
    {"action":"processRecords","millisBehindLatest":0,"records":[{"action":"record","data":"<base64>",
     "partitionKey":"k","sequenceNumber":"4959…","subSequenceNumber":0,"approximateArrivalTimestamp":1700000000000}]}
    {"action":"leaseLost"}   {"action":"shardEnded"}   {"action":"shutdownRequested"}

Generation 1 (KCL 1.x daemons) ends a processor with ``{"action":"shutdown","reason":"ZOMBIE"|"TERMINATE"}``
instead of ``leaseLost`` / ``shardEnded``; old clients built for it know nothing else. Every record carries
``"action":"record"``: kclpy decodes every JSON object by its action, records included.

Child lines that are blank are skipped (kclpy and aws-kcl surround each message with newlines); a line that is not
a JSON object is output of the child's own (a ``print``), not a message — KCL logs and skips it, and so do we. A
JSON object that is not a message we expect (an unknown action, a status for another action, a checkpoint with a
malformed value) is a protocol error: the child and the daemon no longer agree, so that shard's processing ends.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from worker_lib.core.errors import ShardleaseError
from worker_lib.core.models import Checkpoint, KinesisRecord

Generation = Literal[1, 2]
GENERATIONS: tuple[Generation, ...] = (1, 2)


class ProtocolError(ShardleaseError):
    """The child wrote a message that breaks the protocol (an unknown action, a status for another action, ...)."""


# --- daemon → child --------------------------------------------------------------------------------------------


def encode(message: Mapping[str, Any]) -> str:
    """One message as the line written to the child (compact JSON, newline-terminated)."""
    return json.dumps(message, separators=(",", ":")) + "\n"


def initialize_message(shard_id: str, checkpoint: Checkpoint) -> dict[str, Any]:
    """Where the shard's processing starts: its checkpoint (a sequence number or a sentinel such as TRIM_HORIZON)."""
    return {
        "action": "initialize",
        "shardId": shard_id,
        "sequenceNumber": checkpoint.sequence,
        "subSequenceNumber": checkpoint.sub_sequence,
    }


def record_message(record: KinesisRecord) -> dict[str, Any]:
    """One (de-aggregated) record: data base64, arrival time in epoch milliseconds (as KCL's Jackson writes it)."""
    arrival = record.approximate_arrival_timestamp
    return {
        "action": "record",
        "data": base64.b64encode(record.data).decode("ascii"),
        "partitionKey": record.partition_key,
        "sequenceNumber": record.sequence_number,
        "subSequenceNumber": record.sub_sequence_number,
        "approximateArrivalTimestamp": None if arrival is None else int(arrival.timestamp() * 1000),
    }


def process_records_message(records: Sequence[KinesisRecord], millis_behind_latest: int | None) -> dict[str, Any]:
    return {
        "action": "processRecords",
        "millisBehindLatest": millis_behind_latest,
        "records": [record_message(record) for record in records],
    }


def lease_lost_message(generation: Generation) -> dict[str, Any]:
    return {"action": "leaseLost"} if generation == 2 else {"action": "shutdown", "reason": "ZOMBIE"}


def shard_ended_message(generation: Generation) -> dict[str, Any]:
    return {"action": "shardEnded"} if generation == 2 else {"action": "shutdown", "reason": "TERMINATE"}


def shutdown_requested_message() -> dict[str, Any]:
    return {"action": "shutdownRequested"}


def checkpoint_reply(sequence: str | None, sub_sequence: int | None, error: str | None) -> dict[str, Any]:
    """The answer to a checkpoint request: the value asked for, and KCL's exception name if it was not written."""
    return {"action": "checkpoint", "sequenceNumber": sequence, "subSequenceNumber": sub_sequence, "error": error}


# --- child → daemon --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Status:
    """The child finished handling the message whose action is ``response_for``."""

    response_for: str


@dataclass(frozen=True, kw_only=True)
class CheckpointRequest:
    """The child asks to checkpoint at ``sequence`` / ``sub_sequence``; ``None``: the largest permitted value."""

    sequence: str | None
    sub_sequence: int | None


@dataclass(frozen=True, kw_only=True)
class ChildOutput:
    """A line that is no message (blank, or not a JSON object): the child's own output."""

    text: str


ChildLine = Status | CheckpointRequest | ChildOutput


def decode(line: str) -> ChildLine:
    """What one line from the child's stdout is; :class:`ProtocolError` for a JSON object that is no message."""
    text = line.strip()
    try:
        value = json.loads(text) if text.startswith("{") else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        return ChildOutput(text=text)
    action = value.get("action")
    if action == "status":
        response_for = value.get("responseFor")
        if not isinstance(response_for, str):
            raise ProtocolError(f"a status message without responseFor: {_shape(value)}")
        return Status(response_for=response_for)
    if action == "checkpoint":
        return CheckpointRequest(
            sequence=_sequence(value.get("sequenceNumber")), sub_sequence=_sub_sequence(value.get("subSequenceNumber"))
        )
    raise ProtocolError(f"unknown action {action!r} from the child (expected status or checkpoint)")


def _sequence(raw: object) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise ProtocolError(f"checkpoint sequenceNumber {raw!r} is not a string")
    return str(raw)


def _sub_sequence(raw: object) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ProtocolError(f"checkpoint subSequenceNumber {raw!r} is not a whole number")
    return raw


def _shape(value: Mapping[str, Any]) -> str:
    """The keys of a message, never its values (they may hold record data)."""
    return "{" + ", ".join(sorted(map(str, value))) + "}"
