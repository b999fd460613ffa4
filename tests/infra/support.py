"""Constants and helpers shared by the CDK tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ACCOUNT, REGION = "123456789012", "eu-west-1"
STREAM_ARN = f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/orders-stream"
APP = "orders-consumer"
CMK_APP = "payments.consumer"


def run_isolated(python: Path, code: str, *, path: list[Path], env: dict[str, str] | None = None) -> str:
    """Run ``code`` with ``python -I`` (no PYTHONPATH, no user site) and ``path`` prepended to ``sys.path``."""
    prelude = f"import sys; sys.path[:0] = {[str(p) for p in path]!r}\n"
    result = subprocess.run(
        [str(python), "-I", "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(python.parent), **(env or {})},
        check=False,
    )
    assert result.returncode == 0, f"isolated interpreter failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout
