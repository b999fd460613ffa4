"""docs/testing.md's example test, run as written: a user's pytest file outside this repository, using only
``worker_lib.testing`` and the public worker API against moto and kinesalite."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.support.processes import EMULATORS_START_S, PROCESS_START_S, run_command
from tests.support.stalls import hang_bound_s

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_BOUNDS_S = 60 + 20  # the example's own waits (docs/testing.md: its wait_until and its shutdown)
RUN_BOUND_S = EXAMPLE_BOUNDS_S + hang_bound_s(PROCESS_START_S + EMULATORS_START_S)  # so that its own fail first


@pytest.mark.slow
@pytest.mark.kinesalite
def test_the_documented_example_test_passes(tmp_path: Path) -> None:
    text = (REPO / "docs" / "testing.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (tmp_path / "test_example.py").write_text(example)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "test_example.py"]
    result = run_command(command, cwd=tmp_path, env=env, timeout_s=RUN_BOUND_S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout
