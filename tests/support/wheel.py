"""The project as a pip user gets it: a wheel built from this checkout, installed into a fresh virtualenv.

The wheel is built from a copy of the files a wheel is made of (``pyproject.toml``, ``README.md``,
``worker_lib/``), so building leaves no ``build/`` or ``*.egg-info`` in the checkout. Virtualenvs are created
without system site-packages and with nothing from the checkout on ``sys.path``: what they can import is what
the wheel and its extras install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# pip downloads the extras' dependencies on a fresh machine; its cache makes later runs fast.
INSTALL_TIMEOUT_S = 900


def build_wheel(out_dir: Path) -> Path:
    """Build shardlease's wheel from the checkout's current files; returns the ``.whl`` path."""
    source = out_dir / "source"
    source.mkdir(parents=True)
    shutil.copy2(REPO / "pyproject.toml", source)
    shutil.copy2(REPO / "README.md", source)
    shutil.copytree(
        REPO / "worker_lib",
        source / "worker_lib",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    wheels = out_dir / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("shardlease-*.whl")
    return wheel


def fresh_venv(directory: Path, wheel: Path, extras: str = "") -> Path:
    """Create a virtualenv at ``directory`` and install ``shardlease[extras]`` from ``wheel``; returns its bin/."""
    subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True, capture_output=True, timeout=120)
    bin_dir = directory / "bin"
    requirement = f"shardlease[{extras}] @ {wheel.as_uri()}" if extras else f"shardlease @ {wheel.as_uri()}"
    result = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pip install {requirement!r} failed:\n{result.stdout}\n{result.stderr}")
    return bin_dir


def clean_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """An environment for commands of the fresh virtualenv: its bin/ first, no PYTHONPATH, no checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env.update(extra)
    return env
