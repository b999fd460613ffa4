"""The leader Lambda's code asset, built without Docker.

The asset is ``worker_lib/`` and ``functions/`` copied from the checkout (caches and the demo's Node launcher left
out). Their only third-party imports on the leader's path are boto3 (in the Lambda Python runtime) and Powertools
(the public Powertools layer), so nothing is pip-installed into the asset and no platform-specific wheel is needed:
the same asset works on arm64 and x86_64. ``tests/infra`` proves that the asset imports in a fresh interpreter that
has only boto3 and Powertools.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsii

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSET_PACKAGES = ("worker_lib", "functions")
LEADER_HANDLER = "functions.leader.handler.handler"
_IGNORED_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
_IGNORED_SUFFIXES = (".pyc", ".pyo", ".js")  # the .js files are the demo's emulator launcher (Node), not Lambda code


def asset_files(root: Path = REPO_ROOT) -> Iterator[Path]:
    """The files of the asset, relative to ``root``, in a stable order."""
    for package in ASSET_PACKAGES:
        for path in sorted((root / package).rglob("*")):
            rel = path.relative_to(root)
            if (
                path.is_file()
                and not _IGNORED_DIRS.intersection(rel.parts)
                and not path.name.endswith(_IGNORED_SUFFIXES)
            ):
                yield rel


def asset_hash(root: Path = REPO_ROOT) -> str:
    """Content hash of the asset's files (paths and bytes), so an unchanged checkout never redeploys the function."""
    digest = hashlib.sha256()
    for rel in asset_files(root):
        digest.update(rel.as_posix().encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return digest.hexdigest()


def copy_asset(output_dir: Path, root: Path = REPO_ROOT) -> list[Path]:
    """Copy the asset's files into ``output_dir``; returns the relative paths copied."""
    copied = []
    for rel in asset_files(root):
        target = output_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
        copied.append(rel)
    return copied


@jsii.implements(cdk.ILocalBundling)
class LocalPythonBundling:
    """``ILocalBundling`` that copies the packages in Python: CDK never falls back to Docker."""

    def __init__(self, root: Path = REPO_ROOT) -> None:
        self._root = root

    def try_bundle(self, output_dir: str, options: Any = None, **_kwargs: Any) -> bool:
        """jsii passes the ``BundlingOptions`` struct as one positional argument; it is not needed here."""
        copy_asset(Path(output_dir), self._root)
        return True


def leader_code(root: Path = REPO_ROOT) -> cdk.aws_lambda.Code:
    """The leader's ``Code``: bundled locally, hashed by content (not by the whole checkout)."""
    return cdk.aws_lambda.Code.from_asset(
        str(root / "functions"),  # a small source directory: CDK never fingerprints .venv or node_modules
        asset_hash_type=cdk.AssetHashType.CUSTOM,
        asset_hash=asset_hash(root),
        bundling=cdk.BundlingOptions(
            # Required by the type; never pulled, because the local bundler always succeeds.
            image=cdk.DockerImage.from_registry("public.ecr.aws/sam/build-python3.13"),
            local=LocalPythonBundling(root),
        ),
    )
