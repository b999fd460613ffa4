"""Constants and helpers shared by the CDK tests."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from tests.support.processes import PROCESS_START_S
from tests.support.stalls import hang_bound_s, stall_note

REPO = Path(__file__).resolve().parents[2]
ACCOUNT, REGION = "123456789012", "eu-west-1"
STREAM_ARN = f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/orders-stream"
APP = "orders-consumer"
CMK_APP = "payments.consumer"

# The commands these tests run have no timing of their own to derive a bound from: their liveness bounds
# (tests/support/stalls.py) are on what they take on the 2-core machine.
CDK_SYNTH_S = 15.0
"""Not a setting: a CDK app synthesizes (Node and the jsii kernel start, the stacks, the asset's bundling; about 10 s
alone for ``cdk synth`` of infra/)."""
CDK_SYNTH_BOUND_S = hang_bound_s(CDK_SYNTH_S)
PYTHON_BOUND_S = hang_bound_s(PROCESS_START_S)
"""A fresh interpreter's short script (an import or two)."""


def run_isolated(python: Path, code: str, *, path: list[Path], env: dict[str, str] | None = None) -> str:
    """Run ``code`` with ``python -I -B`` (no PYTHONPATH, no user site, no .pyc written into ``path``) and ``path``
    prepended to ``sys.path``."""
    prelude = f"import sys; sys.path[:0] = {[str(p) for p in path]!r}\n"
    started = time.monotonic()
    try:
        result = subprocess.run(
            [str(python), "-I", "-B", "-c", prelude + code],
            capture_output=True,
            text=True,
            timeout=PYTHON_BOUND_S,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(python.parent), **(env or {})},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"isolated interpreter: still running after its liveness bound of {PYTHON_BOUND_S:.0f} s; "
            f"{stall_note(started)}"
        ) from None
    assert result.returncode == 0, f"isolated interpreter failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def asset_dir(cdk_out: Path) -> Path:
    """The leader Lambda's bundled asset directory in a ``cdk.out`` holding one stack."""
    (template_path,) = cdk_out.glob("*.template.json")
    template = json.loads(template_path.read_text())
    (fn,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    asset_id = fn["Properties"]["Code"]["S3Key"].removesuffix(".zip")
    path = cdk_out / f"asset.{asset_id}"
    assert path.is_dir(), path
    return path


def files_under(directory: Path) -> set[str]:
    """Every file below ``directory``, as posix paths relative to it."""
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}
