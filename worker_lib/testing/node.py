"""Where the Node emulators (kinesalite, dynalite) come from.

A pip install carries no ``node_modules``. :func:`locate` looks, in this order:

1. ``$SHARDLEASE_KINESALITE_BIN`` / ``$SHARDLEASE_DYNALITE_BIN``: the package's own directory (the one holding its
   ``package.json``), for a copy installed anywhere;
2. ``$SHARDLEASE_NODE_MODULES``: a ``node_modules`` directory that holds the package;
3. ``node_modules`` in the current directory or one of its parents, then in this checkout (a clone after
   ``npm ci``);
4. a per-user cache, ``$XDG_CACHE_HOME/shardlease/node`` (``~/.cache/shardlease/node`` by default), populated on
   first use by ``npm ci`` from the ``package.json`` and ``package-lock.json`` shipped in this package (kinesalite
   pinned; dynalite is not shipped, install it yourself where you need it).

Every answer says which path was taken (:attr:`NodePackage.source`), so the demo can log it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from worker_lib.core.env import env_str, environ
from worker_lib.core.errors import ShardleaseError

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
LOCK_DIR = _HERE / "node"  # package.json + package-lock.json (package data)
CACHEABLE = frozenset({"kinesalite"})  # what the shipped lockfile installs
NPM_TIMEOUT_S = 300.0


class NodePackageError(ShardleaseError):
    """A Node emulator package cannot be found or installed (the message says what to install)."""


@dataclass(frozen=True)
class NodePackage:
    name: str
    path: Path  # the package directory (holds its package.json)
    source: str  # how it was found, for the log: "$SHARDLEASE_NODE_MODULES", "./node_modules", "user cache", ...


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/shardlease/node`` (``~/.cache/shardlease/node`` when XDG_CACHE_HOME is unset)."""
    base = env_str(environ(), "XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardlease" / "node"


def _env_var(name: str) -> str:
    return f"SHARDLEASE_{name.upper().replace('-', '_')}_BIN"


def _is_package(path: Path) -> bool:
    return (path / "package.json").is_file()


def _from_environment(name: str) -> NodePackage | None:
    env = environ()
    if explicit := env_str(env, _env_var(name)):
        path = Path(explicit).expanduser()
        if not _is_package(path):
            raise NodePackageError(f"${_env_var(name)}={explicit} is not a {name} package directory (no package.json)")
        return NodePackage(name, path, f"${_env_var(name)}")
    if modules := env_str(env, "SHARDLEASE_NODE_MODULES"):
        path = Path(modules).expanduser() / name
        if not _is_package(path):
            raise NodePackageError(f"$SHARDLEASE_NODE_MODULES={modules} holds no {name}")
        return NodePackage(name, path, "$SHARDLEASE_NODE_MODULES")
    return None


def _from_node_modules(name: str) -> NodePackage | None:
    cwd = Path.cwd()
    for base in (cwd, *cwd.parents):
        if _is_package(base / "node_modules" / name):
            return NodePackage(
                name, base / "node_modules" / name, f"{base / 'node_modules'} (from the working directory)"
            )
    # a checkout: worker_lib/testing/ sits two levels below the repository's node_modules
    checkout = _HERE.parents[1] / "node_modules" / name
    if _is_package(checkout):
        return NodePackage(name, checkout, f"{checkout.parent} (this checkout)")
    return None


def _lock_digest() -> str:
    return hashlib.sha256((LOCK_DIR / "package-lock.json").read_bytes()).hexdigest()[:16]


def _from_cache(name: str, *, install: bool) -> NodePackage | None:
    if name not in CACHEABLE:
        return None
    root = cache_dir()
    path = root / "node_modules" / name
    stamp = root / ".lock-digest"
    # the stamp is written after a complete install, so a half-finished npm ci is never taken for an install
    if _is_package(path) and stamp.is_file() and stamp.read_text().strip() == _lock_digest():
        return NodePackage(name, path, f"user cache {root}")
    if not install:
        return None
    _npm_ci(root)
    stamp.write_text(_lock_digest() + "\n")
    return NodePackage(name, path, f"user cache {root} (installed now with npm ci)")


def _npm_ci(root: Path) -> None:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise NodePackageError("kinesalite needs Node.js 18 or later with npm on PATH: install Node.js (nodejs.org)")
    root.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(LOCK_DIR / name, root / name)
    log.info("installing kinesalite into %s with npm ci (first use)", root)
    # --ignore-scripts: kinesalite runs in memory, so leveldown's native build is never needed
    argv = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"]
    # own session, killed as a group: npm starts children of its own, and a SIGTERM to us must not leave them
    process = subprocess.Popen(
        argv,
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=NPM_TIMEOUT_S)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    if process.returncode != 0:
        last = (output or b"").decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise NodePackageError(f"npm ci in {root} failed with exit code {process.returncode}: {last[0]}")


def locate(name: str, *, install: bool = True) -> NodePackage:
    """Find the Node package ``name`` (see the module docstring for the order); may run ``npm ci`` once."""
    found = _from_environment(name) or _from_node_modules(name) or _from_cache(name, install=install)
    if found is None:
        raise NodePackageError(
            f"{name} is not installed: run `npm install {name}` in this directory or set $SHARDLEASE_NODE_MODULES"
        )
    return found
