"""One error hierarchy for the whole package.

Rules (docs/design.md):

* Losing a conditional write is a normal outcome and is returned as ``False`` / ``None``, never raised.
* Infrastructure failures (unreachable endpoint, throttling that outlived retries, a missing table, bad
  credentials) raise a subclass of :class:`ShardleaseError`, always chained (``raise ... from exc``) to the
  botocore error that caused them.
* Every error's ``str()`` is one line fit to print on a terminal: the CLI prints it as is.
"""

from __future__ import annotations


class ShardleaseError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(ShardleaseError, ValueError):
    """A configuration value or command-line argument is invalid."""


class DependencyError(ShardleaseError):
    """An AWS dependency (DynamoDB, Kinesis, CloudWatch) failed in a way retries did not hide."""


class EndpointUnreachableError(DependencyError):
    """The endpoint could not be connected to (wrong URL, emulator not running, no network)."""


class CredentialsError(DependencyError):
    """No usable AWS credentials were found, or they were rejected."""


class ThrottledError(DependencyError):
    """The service throttled the call and the retry budget ran out."""


class TableMissingError(DependencyError):
    """A table this package needs does not exist (run ``shardlease create-tables``)."""


class TableSchemaError(DependencyError):
    """A table exists but its keys or indexes do not match what shardlease expects."""


class StreamMissingError(DependencyError):
    """The Kinesis stream does not exist."""


class MissingExtraError(ShardleaseError, ImportError):
    """An optional feature's packages are not installed; the message names the extra that installs them."""

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(f"{what} needs the {extra!r} extra: pip install 'shardlease[{extra}]'")
        self.what = what
        self.extra = extra


class InvalidStateError(ShardleaseError):
    """An item or a request is not in a state that allows the operation (a bug or a foreign writer)."""


class CorruptItemError(ShardleaseError):
    """A table item cannot be read as the entity it claims to be. Readers log and skip such items."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"item {key!r} is not a valid record: {reason}")
        self.key = key
        self.reason = reason


class SupersededError(ShardleaseError):
    """A newer process runs under this worker id (docs/failover.md, "Two processes under one worker id"): this one
    holds nothing and has stopped."""


class OutputConditionError(ShardleaseError):
    """A condition of a processor's own outputs failed: their transaction, checkpoint included, was not applied
    (docs/exactly-once.md). Raised from the checkpoint call, so the failure policy sees the processor fail."""

    def __init__(self, message: str, *, reasons: list[dict[str, object]] | None = None) -> None:
        super().__init__(message)
        self.reasons = reasons or []
