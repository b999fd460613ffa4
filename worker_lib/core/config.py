"""Settings shared by every area: how to reach AWS, the application name, where new leases start.

Frozen keyword-only dataclasses; the environment is read only in ``from_env()`` (through
:mod:`worker_lib.core.env`). Every class validates itself on construction and raises
:class:`~worker_lib.core.errors.ConfigError` with one clear line. docs/api.md lists every setting.
"""

from __future__ import annotations

import enum
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from worker_lib.core.env import env_str, environ, read_settings, setting
from worker_lib.core.errors import ConfigError

_APP_NAME = re.compile(r"^[A-Za-z0-9_.-]{3,200}$")
# What botocore accepts as a region name (it raises InvalidRegionError, a traceback to a user, for anything else).
_REGION = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?$")


class InitialPosition(enum.Enum):
    """Where a lease for a newly discovered shard starts reading."""

    LATEST = "LATEST"
    TRIM_HORIZON = "TRIM_HORIZON"
    AT_TIMESTAMP = "AT_TIMESTAMP"

    @classmethod
    def parse(cls, value: str) -> InitialPosition:
        try:
            return cls(value.strip().upper())
        except ValueError:
            raise ConfigError(
                f"invalid initial position {value!r}: expected LATEST, TRIM_HORIZON or AT_TIMESTAMP"
            ) from None


def validate_app_name(app: str) -> str:
    """Application names become DynamoDB table names (3–255 chars of [A-Za-z0-9_.-]); suffixes need room."""
    if not _APP_NAME.match(app):
        raise ConfigError(
            f"invalid application name {app!r}: use 3-200 characters of letters, digits, '_', '-' and '.'"
        )
    return app


def default_owner() -> str:
    """``host:pid``: this process's name in lease and lock items when none is configured (unique, readable)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def parse_timestamp(value: str) -> datetime:
    """An ISO-8601 timestamp (``Z`` accepted); naive values are taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"invalid timestamp {value!r}: expected ISO-8601, e.g. 2026-01-31T12:00:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


_SERVICES = ("kinesis", "dynamodb", "cloudwatch")  # each has its SHARDLEASE_<SERVICE>_ENDPOINT_URL


def _region(env: Mapping[str, str], name: str, default: str) -> str:
    return env_str(env, name) or env_str(env, "AWS_DEFAULT_REGION", default)  # as boto3


@dataclass(frozen=True, kw_only=True)
class AwsConfig:
    """How to reach AWS (or an emulator).

    region: AWS region; ``AWS_REGION`` / ``AWS_DEFAULT_REGION``; default ``us-east-1``.
    endpoint_url: one endpoint for every service (local emulators); ``SHARDLEASE_ENDPOINT_URL``.
    service_endpoints: per-service overrides, e.g. ``{"kinesis": "http://127.0.0.1:4567"}`` when Kinesis runs on
      kinesalite and DynamoDB on moto; ``SHARDLEASE_KINESIS_ENDPOINT_URL``, ``SHARDLEASE_DYNAMODB_ENDPOINT_URL``,
      ``SHARDLEASE_CLOUDWATCH_ENDPOINT_URL``.
    connect_timeout_s / read_timeout_s: botocore timeouts (5 s / 10 s) — short, so that a dead endpoint is
      reported within seconds rather than a minute.
    max_attempts: botocore attempts including the first (standard retry mode, 5).
    """

    region: str = setting("us-east-1", "AWS_REGION", _region)
    endpoint_url: str | None = setting(None, "SHARDLEASE_ENDPOINT_URL", env_str)
    service_endpoints: Mapping[str, str] = field(default_factory=dict)
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    max_attempts: int = setting(5, "SHARDLEASE_AWS_MAX_ATTEMPTS")
    retry_mode: str = "standard"
    max_pool_connections: int = 32

    def __post_init__(self) -> None:
        if not _REGION.match(self.region):
            raise ConfigError(
                f"invalid region {self.region!r}: expected a name such as eu-west-1 (AWS_REGION, --region)"
            )
        for url in (self.endpoint_url, *self.service_endpoints.values()):
            if url is not None and not re.match(r"^https?://[^\s/]+", url):
                raise ConfigError(f"invalid endpoint URL {url!r}: expected http(s)://host:port")
        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("timeouts must be positive")
        if self.retry_mode not in ("standard", "adaptive", "legacy"):
            raise ConfigError(f"invalid retry mode {self.retry_mode!r}")

    def endpoint_for(self, service: str) -> str | None:
        """The endpoint for one service: its override, else the common endpoint, else AWS's."""
        return self.service_endpoints.get(service) or self.endpoint_url

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> AwsConfig:
        """The environment's settings; ``overrides`` that are not ``None`` win (the CLI's flags)."""
        e = environ(env)
        given = {name: value for name, value in overrides.items() if value is not None}
        given.setdefault(
            "service_endpoints",
            {s: url for s in _SERVICES if (url := e.get(f"SHARDLEASE_{s.upper()}_ENDPOINT_URL"))},
        )
        return read_settings(cls, e, **given)
