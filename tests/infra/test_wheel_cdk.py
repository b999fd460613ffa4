"""The construct as a pip user gets it: ``shardlease[cdk]`` installed from the wheel into a fresh virtualenv, used
by a CDK app written outside the repository. The leader's asset comes from the installed package and holds only
the handler's import closure (docs/deploy.md gives its size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import run_command
from tests.support.wheel import build_wheel, clean_env, fresh_venv
from worker_lib.cdk.bundling import asset_files

from .support import CDK_SYNTH_BOUND_S, PYTHON_BOUND_S, REPO, asset_dir, files_under, run_isolated

LEFT_OUT = ("tools", "testing", "cli", "spark", "cdk", "worker")

USER_APP = """\
from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesis as kinesis
from cdk_nag import AwsSolutionsChecks

import worker_lib
from worker_lib.cdk import ShardleaseCoordination
from worker_lib.cdk.bundling import package_root

app = cdk.App(outdir="cdk.out")
cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
stack = cdk.Stack(app, "OrdersCoordination", env=cdk.Environment(account="123456789012", region="eu-west-1"))
stream = kinesis.Stream.from_stream_arn(stack, "OrdersStream", "arn:aws:kinesis:eu-west-1:123456789012:stream/orders")
coordination = ShardleaseCoordination(stack, "Orders", application_name="orders-consumer", stream=stream)
iam.Role(stack, "TaskRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com")).add_managed_policy(
    coordination.worker_policy  # its one Resource "*" is acknowledged for cdk-nag inside the construct
)
app.synth()
Path("bundled-from.json").write_text(json.dumps({"package": worker_lib.__file__, "root": str(package_root())}))
"""


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip()).resolve()


@pytest.mark.slow
def test_given_the_wheel_with_the_cdk_extra_when_an_outside_app_synthesizes_then_the_asset_is_the_leader_closure(
    tmp_path: Path, cdk_out: Path, lambda_python: Path
) -> None:
    # GIVEN shardlease[cdk] from the wheel in a fresh virtualenv, and a marker in its installed handler module
    bin_dir = fresh_venv(tmp_path / "venv", build_wheel(tmp_path / "build"), "cdk")
    site = _site_packages(bin_dir / "python")
    installed_handler = site / "worker_lib" / "leader" / "lambda_handler.py"
    marker = "# installed copy in the test's virtualenv\n"
    installed_handler.write_text(installed_handler.read_text() + marker)
    # AND a CDK app outside the repository using the construct, with cdk-nag's AwsSolutions checks
    app_dir = tmp_path / "user-app"
    app_dir.mkdir()
    (app_dir / "app.py").write_text(USER_APP)
    env = clean_env(bin_dir, JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
    for var in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION", "CDK_OUTDIR", "CDK_CONTEXT_JSON"):
        env.pop(var, None)
    assert REPO.resolve() not in app_dir.resolve().parents

    # WHEN the venv's python runs the app from its own directory (node on PATH, nothing of the checkout)
    result = run_command([bin_dir / "python", "app.py"], cwd=app_dir, env=env, timeout_s=CDK_SYNTH_BOUND_S)

    # THEN it synthesizes with no cdk-nag finding
    assert result.returncode == 0, f"synth failed:\n{result.stdout}\n{result.stderr}"
    assert "AwsSolutions-" not in result.stdout + result.stderr
    # AND worker_lib was imported and bundled from the virtualenv's site-packages, not from the checkout
    bundled = json.loads((app_dir / "bundled-from.json").read_text())
    assert Path(bundled["package"]).resolve().is_relative_to(site)
    assert Path(bundled["root"]) == site
    asset = asset_dir(app_dir / "cdk.out")
    assert (asset / "worker_lib/leader/lambda_handler.py").read_text().endswith(marker)
    # AND the asset is the handler and its closure, none of the other layers
    files = files_under(asset)
    assert {"worker_lib/leader/lambda_handler.py", "worker_lib/leader/__init__.py", "worker_lib/py.typed"} <= files
    assert not [f for f in files if f.split("/")[1] in LEFT_OUT], files
    # AND it is the same file list as the clone's, in-process and through `cdk synth` of infra/
    assert files == {str(f) for f in asset_files()} == files_under(asset_dir(cdk_out))
    for rel in files - {"worker_lib/leader/lambda_handler.py"}:
        assert (asset / rel).read_bytes() == (REPO / rel).read_bytes(), rel
    # AND it imports where only boto3 and Powertools exist (the Lambda runtime plus the Powertools layer)
    check = "import worker_lib.leader.lambda_handler as m; assert callable(m.handler)"
    run_isolated(lambda_python, check, path=[asset], env={"AWS_DEFAULT_REGION": "eu-west-1"})

    size_kb = sum((asset / f).stat().st_size for f in files) / 1024
    sys.stderr.write(f"leader asset: {len(files)} files, {size_kb:.0f} KB\n")


def test_given_no_aws_cdk_when_importing_the_construct_then_one_line_names_the_extra() -> None:
    # GIVEN an interpreter where aws_cdk cannot be imported
    code = (
        "import sys; sys.modules['aws_cdk'] = None\n"
        "try:\n    import worker_lib.cdk\nexcept ImportError as exc:\n    print(type(exc).__name__, exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # WHEN importing worker_lib.cdk
    out = run_command([sys.executable, "-c", code], timeout_s=PYTHON_BOUND_S, cwd=REPO, env=env)
    out.check_returncode()
    # THEN the error is the one-line MissingExtraError naming the cdk extra
    assert out.stdout.strip() == (
        "MissingExtraError the CDK construct needs the 'cdk' extra: pip install 'shardlease[cdk]'"
    )
