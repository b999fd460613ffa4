"""``LocalEmulators``: moto and kinesalite on loopback for one test session, and the settings that point at them.

A user's integration test::

    with LocalEmulators() as local:
        os.environ.update(local.env())          # every shardlease component reads its endpoints from here
        kinesis = local.client("kinesis")
        create_stream(kinesis, "orders", 2)

docs/testing.md walks through a whole test of a processor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.testing.emulators import Emulator, start_kinesalite, start_moto

# Emulators accept any credentials; fixed dummies keep a test from ever signing requests for a real account.
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


class LocalEmulators:
    """moto for DynamoDB and CloudWatch; Kinesis on kinesalite (``kinesalite=True``, the default) or on moto.

    kinesalite is what resharding needs (moto keeps routing writes to closed parents); moto alone needs no
    Node.js. Both emulators are child processes in their own sessions, stopped (process group) on exit.
    """

    def __init__(self, *, kinesalite: bool = True, region: str = "us-east-1", log_dir: Path | None = None) -> None:
        self.use_kinesalite = kinesalite
        self.region = region
        self.log_dir = log_dir
        self.moto: Emulator | None = None
        self.kinesalite: Emulator | None = None

    def _log(self, name: str) -> Path | None:
        return self.log_dir / f"{name}.log" if self.log_dir is not None else None

    def start(self) -> LocalEmulators:
        self.moto = start_moto(log_path=self._log("moto"))
        if self.use_kinesalite:
            try:
                self.kinesalite = start_kinesalite(log_path=self._log("kinesalite"))
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        for emulator in (self.kinesalite, self.moto):
            if emulator is not None:
                emulator.stop()

    def __enter__(self) -> LocalEmulators:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def emulators(self) -> list[Emulator]:
        return [e for e in (self.moto, self.kinesalite) if e is not None]

    @property
    def dynamodb_endpoint(self) -> str:
        if self.moto is None:
            raise RuntimeError("LocalEmulators is not started")
        return self.moto.endpoint_url

    @property
    def cloudwatch_endpoint(self) -> str:
        return self.dynamodb_endpoint

    @property
    def kinesis_endpoint(self) -> str:
        return self.kinesalite.endpoint_url if self.kinesalite is not None else self.dynamodb_endpoint

    def endpoints(self) -> dict[str, str]:
        return {
            "dynamodb": self.dynamodb_endpoint,
            "kinesis": self.kinesis_endpoint,
            "cloudwatch": self.cloudwatch_endpoint,
        }

    def env(self) -> dict[str, str]:
        """Environment variables that point shardlease (``from_env``) and boto3 at these emulators."""
        return {
            **DUMMY_CREDENTIALS,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            # AwsConfig.from_env's per-service variables: SHARDLEASE_<SERVICE>_ENDPOINT_URL
            **{f"SHARDLEASE_{service.upper()}_ENDPOINT_URL": url for service, url in self.endpoints().items()},
        }

    def aws_config(self, **overrides: Any) -> AwsConfig:
        """An :class:`AwsConfig` with one endpoint per service, for components built in the test process."""
        return AwsConfig(region=self.region, service_endpoints=self.endpoints(), **overrides)

    def create_tables(self, app: str) -> None:
        """Create ``app``'s lease, worker-metrics and coordinator tables (what ``shardlease create-tables`` does)."""
        from worker_lib.tables.admin import ensure_tables

        ensure_tables(app, self.client("dynamodb"))

    def client(self, service: str) -> Any:
        """A boto3 client for ``dynamodb``, ``kinesis`` or ``cloudwatch`` on the emulator that serves it."""
        return aws.client(service, self.aws_config())
