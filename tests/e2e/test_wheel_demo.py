"""`pip install 'shardlease[demo]'` then `shardlease demo`, as a pip user does it: the wheel built from this
checkout, a fresh virtualenv, a working directory outside the repository and an empty per-user cache, so that
kinesalite is installed by npm from the lockfile shipped in the wheel (worker_lib/testing/node/). Without the
extra, the demo says in one line which extra to install."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.processes import CLI_BOUND_S, DEMO_OVERHEAD_S
from tests.support.stalls import hang_bound_s, stall_note
from tests.support.wheel import build_wheel, clean_env, fresh_venv

pytestmark = pytest.mark.slow

DURATION_S = 30.0  # --duration of the demo
NPM_CI_S = 15.0  # not a setting: npm installs kinesalite from the wheel's lockfile (about 5 s from npm's cache)
DEMO_BOUND_S = hang_bound_s(NPM_CI_S + DURATION_S + DEMO_OVERHEAD_S)  # a liveness bound (tests/support/stalls.py)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def demo_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return fresh_venv(tmp_path_factory.mktemp("venv-demo") / "venv", wheel, "demo")


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return fresh_venv(tmp_path_factory.mktemp("venv-bare") / "venv", wheel)


def user_env(bin_dir: Path, cache: Path) -> dict[str, str]:
    env = clean_env(bin_dir, XDG_CACHE_HOME=str(cache))
    for name in ("SHARDLEASE_NODE_MODULES", "SHARDLEASE_KINESALITE_BIN"):
        env.pop(name, None)
    return env


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    assert not any((p / "node_modules").exists() for p in (cwd, *cwd.parents))
    return cwd


@pytest.mark.heavy
def test_the_demo_runs_from_the_wheel_with_the_demo_extra(demo_venv: Path, outside: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # WHEN a pip user runs the shortest demo from a directory outside any checkout, with an empty cache
    process = subprocess.Popen(
        [str(demo_venv / "shardlease"), "demo", "--duration", f"{DURATION_S:g}", "--workers", "2", "--shards", "3"],
        cwd=outside,
        env=user_env(demo_venv, cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started = time.monotonic()
    try:
        out, err = process.communicate(timeout=DEMO_BOUND_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the demo still runs after {DEMO_BOUND_S:.0f} s; {stall_note(started)}") from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    # THEN kinesalite came from npm into the user cache, and the log says so
    assert process.returncode == 0, out[-3000:] + err[-3000:]
    assert f"kinesalite from user cache {cache / 'shardlease' / 'node'} (installed now with npm ci)" in out
    assert (cache / "shardlease" / "node" / "node_modules" / "kinesalite" / "package.json").is_file()
    # AND the demo ran the whole fleet through the packaged Lambda handler and lost nothing
    produced = int(re.search(r"records produced\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    processed = int(re.search(r"records processed\s+(\d+) distinct", out).group(1))  # type: ignore[union-attr]
    assert produced > 0 and processed == produced and "none lost" in out
    assert "leader ran as: Lambda handler" in out
    assert "stopped emulators" in out
    assert "Traceback" not in out + err


def test_without_the_demo_extra_one_line_names_it(bare_venv: Path, outside: Path, tmp_path: Path) -> None:
    # WHEN the wheel is installed without extras and the user runs the demo
    result = subprocess.run(
        [str(bare_venv / "shardlease"), "demo", "--duration", "30"],
        cwd=outside,
        env=user_env(bare_venv, tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=CLI_BOUND_S,
        check=False,
    )
    # THEN one line names the extra to install, exit 1, and nothing was started or installed
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == ["shardlease demo: error: shardlease demo needs the 'demo' extra: pip install 'shardlease[demo]'"]
    assert not (tmp_path / "cache").exists()
