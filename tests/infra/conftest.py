"""Session fixtures for the CDK tests: one in-process synth (bundling skipped), one real ``cdk synth``, one
fresh interpreter holding only boto3 and Powertools."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Template
from packaging.requirements import Requirement

from infra.stacks import ShardleaseStack
from tests.support.processes import run_command
from worker_lib.cdk import ShardleaseCoordination
from worker_lib.tables.schema import BillingMode

from .support import ACCOUNT, APP, CDK_SYNTH_BOUND_S, CMK_APP, PYTHON_BOUND_S, REGION, REPO, STREAM_ARN

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


@dataclass(frozen=True)
class Synth:
    default: Template  # ShardleaseStack from context-like values: stream by ARN, on-demand, AWS managed key
    cmk: Template  # construct in a user stack: IStream with its own CMK, table CMK, PROVISIONED, DESTROY
    cmk_stack: cdk.Stack
    coordination: ShardleaseCoordination
    cmk_coordination: ShardleaseCoordination


@pytest.fixture(scope="session")
def synth() -> Synth:
    """Both stacks in one App, synthesized once (bundling skipped: the asset is tested through real synth)."""
    app = cdk.App(context={"aws:cdk:bundling-stacks": []})
    env = cdk.Environment(account=ACCOUNT, region=REGION)
    default = ShardleaseStack(app, "Default", env=env, application_name=APP, stream_arn=STREAM_ARN)

    user = cdk.Stack(app, "UserStack", env=env)
    stream_key = kms.Key(user, "StreamKey", enable_key_rotation=True)
    stream = kinesis.Stream(user, "PaymentsStream", encryption_key=stream_key, encryption=kinesis.StreamEncryption.KMS)
    table_key = kms.Key(user, "TableKey", enable_key_rotation=True)
    cmk = ShardleaseCoordination(
        user,
        "Payments",
        application_name=CMK_APP,
        stream=stream,
        encryption_key=table_key,
        billing_mode=BillingMode.PROVISIONED,
        removal_policy=cdk.RemovalPolicy.DESTROY,
        failover_time=cdk.Duration.seconds(20),
        liveness_mode="worker",
        metrics_namespace="Payments/Shardlease",
    )
    worker_role = iam.Role(user, "WorkerTaskRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"))
    cmk.grant_worker(worker_role)
    embedded_role = iam.Role(user, "EmbeddedRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    cmk.grant_worker(embedded_role, embedded_leader=True)
    return Synth(
        default=Template.from_stack(default),
        cmk=Template.from_stack(user),
        cmk_stack=user,
        coordination=default.coordination,
        cmk_coordination=cmk,
    )


@pytest.fixture(scope="session")
def cdk_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real CLI, once: ``npx cdk synth -q`` with the pinned CDK CLI, offline, into a temp dir."""
    out = tmp_path_factory.mktemp("cdk") / "cdk.out"
    npx = shutil.which("npx")
    assert npx, "npx (Node) is needed for the CDK CLI"
    env = {**os.environ, "CDK_DISABLE_VERSION_CHECK": "1"}
    env.pop("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", None)  # the app itself deals with the banner
    env.pop("CDK_DEFAULT_ACCOUNT", None)
    env.pop("CDK_DEFAULT_REGION", None)
    result = run_command(
        [npx, "--no-install", "cdk", "synth", "-q", "--no-notices", "-o", out],
        cwd=REPO,
        env=env,
        timeout_s=CDK_SYNTH_BOUND_S,
    )
    assert result.returncode == 0, f"cdk synth failed:\n{result.stdout}\n{result.stderr}"
    (out / "synth-output.txt").write_text(result.stdout + result.stderr)
    return out


# --- a fresh interpreter with only boto3 and Powertools ---------------------------------------------------------

LAMBDA_PROVIDED = ("boto3", "aws-lambda-powertools[tracer]")
"""What the Lambda Python runtime (boto3) and the Powertools layer (Powertools and its tracer extra) provide."""


def _key(name: str) -> str:
    return name.lower().replace("_", "-")


def _closure(roots: tuple[str, ...]) -> set[str]:
    """Installed distributions needed by ``roots``, following environment markers and requested extras only."""
    seen: dict[str, set[str]] = {}
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        key, extras = _key(req.name), set(req.extras)
        done = seen.get(key)
        if done is not None and extras <= done:
            continue
        seen[key] = (done or set()) | extras
        for raw in metadata.distribution(req.name).requires or []:
            sub = Requirement(raw)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras or {""}):
                todo.append(sub)
    return set(seen)


@pytest.fixture(scope="session")
def lambda_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv (no pip, no system site-packages) whose site-packages holds only the distributions of boto3 and
    aws-lambda-powertools[tracer], copied file by file (per their RECORD) from this environment: offline, ~1 s."""
    root = tmp_path_factory.mktemp("lambda-venv")
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(root)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            timeout=PYTHON_BOUND_S,
            check=True,
        ).stdout.strip()
    )
    for name in sorted(_closure(LAMBDA_PROVIDED)):
        dist = metadata.distribution(name)
        for file in dist.files or []:
            if file.parts[0] == ".." or file.suffix == ".pyc":
                continue
            source = Path(str(dist.locate_file(file)))
            if source.is_file():
                target = site / file
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    return python
