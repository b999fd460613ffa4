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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from worker_lib.core.env import env_bool, env_str, environ
from worker_lib.core.errors import ConfigError
from worker_lib.core.imports import import_attr

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


def related_lease_key(lease_key: str, shard_id: str) -> str:
    """The lease key of ``shard_id`` (a parent, child or merge partner) in the stream of ``lease_key``.

    Leases store their parents and children as bare shard ids in both modes (KCL v3.5.1
    ``HierarchicalShardSyncer.newKCLMultiStreamLeaseForChildShard``), so a multi-stream worker puts the stream's
    prefix back before it reads their leases."""
    stream, _ = split_lease_key(lease_key)
    return shard_id if stream is None else stream.lease_key(shard_id)


def stream_name_of(lease_key: str, default: str) -> str:
    """The Kinesis stream a lease reads: the one its multi-stream key names, else ``default``."""
    stream, _ = split_lease_key(lease_key)
    return default if stream is None else stream.stream_name


StreamTracker = Callable[[], Iterable[str]]
"""What a multi-stream application reads its current streams from (KCL's ``MultiStreamTracker``): called by the
leader at every shard sync; each entry is a stream name or a serialized identifier (``account:stream:epoch``)."""


@dataclass(frozen=True, kw_only=True)
class StreamSelection:
    """The streams an application consumes.

    names: fixed stream names (or serialized identifiers); ``SHARDLEASE_STREAM`` takes them comma-separated
      (Kinesis stream names cannot contain commas).
    tracker: a :data:`StreamTracker` asked at every shard sync, for streams added and removed while running;
      ``SHARDLEASE_STREAM_TRACKER=module:attr``. When given, ``names`` are only what preflight checks.
    multi_stream: lease keys in KCL's multi-stream form (``account:stream:epoch:shardId``). Implied by more than one
      name or by a tracker; set it (``SHARDLEASE_MULTI_STREAM=true``, ``--multi-stream``) for a multi-stream
      application that consumes one stream today. A single-stream application's keys are bare shard ids.
    """

    names: tuple[str, ...] = ()
    tracker: StreamTracker | None = None
    multi_stream: bool = False

    def __post_init__(self) -> None:
        names = tuple(name.strip() for name in self.names)
        if any(not name for name in names):
            raise ValueError("a stream name is empty")
        if len(set(names)) != len(names):
            raise ValueError(f"a stream is named twice: {', '.join(names)}")
        object.__setattr__(self, "names", names)
        if not names and self.tracker is None:
            raise ValueError("no stream given: name one or more streams, or a stream tracker")
        if self.tracker is not None or len(names) > 1:
            object.__setattr__(self, "multi_stream", True)

    @classmethod
    def of(cls, value: str | Sequence[str] | StreamSelection) -> StreamSelection:
        """A selection from a comma-separated string, a sequence of names, or a selection (returned as is)."""
        if isinstance(value, StreamSelection):
            return value
        names = value.split(",") if isinstance(value, str) else list(value)
        return cls(names=tuple(names))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StreamSelection:
        """``SHARDLEASE_STREAM`` (comma-separated names), ``SHARDLEASE_STREAM_TRACKER`` (``module:attr``) and
        ``SHARDLEASE_MULTI_STREAM``; ConfigError (one line) when no stream is given or a value is wrong."""
        e = environ(env)
        names = tuple(n for n in env_str(e, "SHARDLEASE_STREAM").split(",") if n.strip())
        tracker = load_stream_tracker(env_str(e, "SHARDLEASE_STREAM_TRACKER"))
        if not names and tracker is None:
            raise ConfigError("SHARDLEASE_STREAM (or SHARDLEASE_STREAM_TRACKER) must be set")
        try:
            return cls(names=names, tracker=tracker, multi_stream=env_bool(e, "SHARDLEASE_MULTI_STREAM", False))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def describe(self) -> str:
        """For logs: the names, and whether a tracker decides."""
        return ",".join(self.names) + (" + tracker" if self.tracker is not None else "")

    @property
    def single(self) -> str:
        """The one stream of a single-stream application ("" in multi-stream mode)."""
        return "" if self.multi_stream else self.names[0]

    def current(self) -> tuple[str, ...]:
        """The streams to consume now: the tracker's answer (its order kept, duplicates dropped), else the names.
        A tracker that raises or answers something that is not a list of strings is a ValueError (one line)."""
        if self.tracker is None:
            return self.names
        try:
            answer = list(self.tracker())
        except Exception as exc:
            raise ValueError(f"the stream tracker raised {type(exc).__name__}: {exc}") from exc
        if not all(isinstance(name, str) and name.strip() for name in answer):
            raise ValueError(f"the stream tracker answered something that is not a list of stream names: {answer!r}")
        return tuple(dict.fromkeys(name.strip() for name in answer))


def parse_stream_entry(entry: str) -> tuple[str, StreamIdentifier | None]:
    """``(stream name, identifier)`` of a configured or tracked stream: a serialized identifier gives both, a plain
    name gives the name only (its account and creation time are asked of Kinesis)."""
    try:
        identifier = StreamIdentifier.parse(entry)
    except ValueError:
        return entry, None
    return identifier.stream_name, identifier


def load_stream_tracker(spec: str) -> StreamTracker | None:
    """The tracker ``"module:attr"`` names (``SHARDLEASE_STREAM_TRACKER``): a callable answering the current streams,
    or an object with a ``stream_names()`` method; None for an empty ``spec``; ConfigError (one line) otherwise."""
    if not spec.strip():
        return None
    target = import_attr(spec, what="stream tracker", example="mypkg.streams:current_streams")
    method = getattr(target, "stream_names", None)
    if callable(method):
        return method  # type: ignore[no-any-return]
    if not callable(target):
        raise ConfigError(f"invalid stream tracker {spec!r}: {target!r} is not callable")
    return target  # type: ignore[no-any-return]
