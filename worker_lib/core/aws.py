"""Creating boto3 clients and translating botocore errors into :mod:`worker_lib.core.errors`.

Nothing here runs at import time. Every component takes either a ready client or a ``boto3_session`` and an
:class:`AwsConfig`, and calls :func:`client` when it is constructed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn

import botocore.config
import botocore.exceptions

from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import (
    CredentialsError,
    DependencyError,
    EndpointUnreachableError,
    StreamMissingError,
    TableMissingError,
    ThrottledError,
)

if TYPE_CHECKING:
    import boto3

THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "LimitExceededException",
        "TooManyRequestsException",
    }
)
CREDENTIAL_CODES = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
        "AccessDeniedException",
        "MissingAuthenticationTokenException",
        "IncompleteSignature",
    }
)


def parse_timestamp(value: Any) -> datetime:
    """botocore's timestamp parser, with epoch numbers (Kinesis' ``ApproximateArrivalTimestamp``, one per record)
    read straight into UTC: botocore's own path builds a ``dateutil`` local-time zone per value, which costs more
    than the rest of a record's parsing, and every later use of the value (``utcoffset``, Arrow conversion) calls
    back into it."""
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, timezone.utc)
    import botocore.parsers

    parsed: datetime = botocore.parsers.DEFAULT_TIMESTAMP_PARSER(value)
    return parsed


def client(service: str, aws: AwsConfig, boto3_session: boto3.Session | None = None) -> Any:
    """A low-level client for ``service`` honouring ``aws`` (region, endpoint, timeouts, retries)."""
    import boto3 as _boto3  # imported lazily so that importing worker_lib stays cheap

    session = boto3_session
    if session is None:
        # A session of our own (a caller's session is left as it is): timestamps are parsed into UTC.
        session = _boto3.session.Session()
        session._session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
    cfg = botocore.config.Config(
        region_name=aws.region,
        connect_timeout=aws.connect_timeout_s,
        read_timeout=aws.read_timeout_s,
        # Per request. On the checkpoint path LeaseCheckpointer retries what gets past these while the lease is valid.
        retries={"mode": aws.retry_mode, "total_max_attempts": aws.max_attempts},  # type: ignore[arg-type]
        max_pool_connections=aws.max_pool_connections,
    )
    kwargs: dict[str, Any] = {"config": cfg}
    endpoint = aws.endpoint_for(service)
    if endpoint:
        kwargs["endpoint_url"] = endpoint
        # Emulators accept any credentials; supply dummies only if the environment has none, so that a
        # local run needs no AWS account while a real profile is still honoured.
        if session.get_credentials() is None:
            kwargs["aws_access_key_id"] = "local"
            kwargs["aws_secret_access_key"] = "local"
    return session.client(service, **kwargs)  # type: ignore[call-overload]


def client_or_new(
    service: str, injected: Any, aws_config: AwsConfig | None, boto3_session: boto3.Session | None = None
) -> Any:
    """The ``injected`` client if given, else a new one for ``service`` (what every store's constructor does)."""
    # No settings given: the environment's, as a boto3 client would use (AWS_REGION, endpoint variables, ...).
    return injected if injected is not None else client(service, aws_config or AwsConfig.from_env(), boto3_session)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ``ClientError`` ("" for anything else)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def is_conditional_check_failed(exc: BaseException) -> bool:
    return error_code(exc) == "ConditionalCheckFailedException"


def translate(exc: BaseException, *, operation: str, resource: str = "") -> DependencyError:
    """Map a botocore/boto3 exception to our hierarchy with a one-line message."""
    what = f"{operation} on {resource}" if resource else operation
    if isinstance(exc, botocore.exceptions.EndpointConnectionError | botocore.exceptions.ConnectionClosedError):
        endpoint = getattr(exc, "kwargs", {}).get("endpoint_url", "")
        return EndpointUnreachableError(f"{what}: cannot reach endpoint {endpoint}".rstrip())
    if isinstance(exc, botocore.exceptions.ConnectTimeoutError | botocore.exceptions.ReadTimeoutError):
        return EndpointUnreachableError(f"{what}: endpoint timed out")
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return CredentialsError(f"{what}: no AWS credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID)")
    if isinstance(exc, botocore.exceptions.NoRegionError):
        return CredentialsError(f"{what}: no AWS region configured (pass --region or set AWS_REGION)")
    code = error_code(exc)
    if code in THROTTLING_CODES:
        return ThrottledError(f"{what}: throttled ({code}) after retries")
    if code in CREDENTIAL_CODES:
        return CredentialsError(f"{what}: credentials rejected ({code})")
    if code == "ResourceNotFoundException":
        message = str(getattr(exc, "response", {}).get("Error", {}).get("Message", ""))
        if "stream" in message.lower() or operation.startswith("kinesis"):
            return StreamMissingError(f"{what}: stream not found")
        return TableMissingError(f"{what}: table not found (run `shardlease create-tables`)")
    if isinstance(exc, botocore.exceptions.ClientError):
        lines = str(exc.response.get("Error", {}).get("Message", "")).splitlines()
        return DependencyError(f"{what}: {code or 'error'}: {lines[0] if lines else ''}".rstrip(": "))
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        return DependencyError(f"{what}: {exc}")
    return DependencyError(f"{what}: {type(exc).__name__}: {exc}")


def raise_translated(exc: BaseException, *, operation: str, resource: str = "") -> NoReturn:
    raise translate(exc, operation=operation, resource=resource) from exc


@contextlib.contextmanager
def translated(operation: str, resource: str = "") -> Iterator[None]:
    """Context manager: any botocore error inside becomes our typed error (chained)."""
    try:
        yield
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise translate(exc, operation=operation, resource=resource) from exc
