"""Constants and helpers shared by the CDK tests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ACCOUNT, REGION = "123456789012", "eu-west-1"
STREAM_ARN = f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/orders-stream"
APP = "orders-consumer"
CMK_APP = "payments.consumer"


def run_isolated(python: Path, code: str, *, path: list[Path], env: dict[str, str] | None = None) -> str:
    """Run ``code`` with ``python -I -B`` (no PYTHONPATH, no user site, no .pyc written into ``path``) and ``path``
    prepended to ``sys.path``."""
    prelude = f"import sys; sys.path[:0] = {[str(p) for p in path]!r}\n"
    result = subprocess.run(
        [str(python), "-I", "-B", "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(python.parent), **(env or {})},
        check=False,
    )
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
