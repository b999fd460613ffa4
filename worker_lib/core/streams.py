"""Stream identity in KCL 3.x multi-stream applications, as pure functions (no AWS calls).

One application, one lease table, several streams (KCL's ``MultiStreamTracker``): each lease's key is the stream's
serialized identifier and the shard id, ``account:stream:creationEpoch:shardId`` (KCL v3.5.1
``MultiStreamLease.getLeaseKey``), and the item also carries ``streamName`` (the serialized identifier) and
``shardId`` (``DynamoDBMultiStreamLeaseSerializer``). A single-stream application's key is the bare shard id.

KCL's pattern for a serialized identifier (``StreamIdentifier.STREAM_IDENTIFIER_PATTERN``) is
``[0-9]+:[^:]+:[0-9]+``: digits, a stream name without colons, digits. Kinesis stream names are
``[a-zA-Z0-9_.-]{1,128}``, so a shard id (``shardId-…``) can never be mistaken for one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_IDENTIFIER = re.compile(r"(?P<account>[0-9]+):(?P<stream>[^:]+):(?P<epoch>[0-9]+)")
_DELIMITER = ":"


@dataclass(frozen=True, kw_only=True, order=True)
class StreamIdentifier:
    """A stream of a multi-stream application: its account, name and creation time (epoch seconds), which together
    tell a stream from a deleted one of the same name."""

    account_id: str
    stream_name: str
    creation_epoch: int

    def __post_init__(self) -> None:
        if not self.account_id.isdigit():
            raise ValueError(f"stream identifier: account id {self.account_id!r} is not all digits")
        if not self.stream_name or _DELIMITER in self.stream_name:
            raise ValueError(f"stream identifier: stream name {self.stream_name!r} is empty or contains ':'")
        if self.creation_epoch < 0:
            raise ValueError(f"stream identifier: creation epoch {self.creation_epoch} is negative")

    def serialize(self) -> str:
        """``account:stream:creationEpoch``, as KCL writes it into lease keys and ``streamName``."""
        return _DELIMITER.join((self.account_id, self.stream_name, str(self.creation_epoch)))

    @classmethod
    def parse(cls, text: str) -> StreamIdentifier:
        """The identifier ``text`` serializes; ValueError (one line) when it is not one."""
        match = _IDENTIFIER.fullmatch(text)
        if match is None:
            raise ValueError(f"not a serialized stream identifier (account:stream:creationEpoch): {text!r}")
        return cls(account_id=match["account"], stream_name=match["stream"], creation_epoch=int(match["epoch"]))

    def lease_key(self, shard_id: str) -> str:
        """The lease key of ``shard_id`` of this stream."""
        if not shard_id or _DELIMITER in shard_id:
            raise ValueError(f"shard id {shard_id!r} is empty or contains ':'")
        return f"{self.serialize()}{_DELIMITER}{shard_id}"


def split_lease_key(lease_key: str) -> tuple[StreamIdentifier | None, str]:
    """``(stream, shard id)`` of a lease key: the stream is None for a single-stream key (the bare shard id), or
    for any key whose prefix is not a serialized identifier (such a key is kept whole as the shard id)."""
    prefix, delimiter, shard_id = lease_key.rpartition(_DELIMITER)
    if not delimiter:
        return None, lease_key
    try:
        return StreamIdentifier.parse(prefix), shard_id
    except ValueError:
        return None, lease_key
