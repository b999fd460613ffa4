"""The leader Lambda's code asset, built from the installed ``worker_lib`` package without Docker.

The asset holds the leader's handler module and its import closure inside ``worker_lib`` only: the modules it
imports, found by a static ``ast`` walk (imports under ``if TYPE_CHECKING:`` never run and are not followed),
each package's ``__init__.py`` on the way, and ``py.typed``. The simulator, demo, CLI, Spark source, test
emulators, worker and this CDK package stay out unless the leader imports them. The files are read from wherever
Python finds ``worker_lib`` (a virtualenv's site-packages for a pip user, the checkout for a clone), never from a
path relative to a repository.

The closure's only third-party imports are boto3/botocore (in the Lambda Python runtime) and Powertools (the
public Powertools layer), so nothing is pip-installed into the asset and no platform-specific wheel is needed:
the same asset works on arm64 and x86_64. ``tests/infra/test_asset.py`` imports the asset in a fresh interpreter
that has only boto3 and Powertools. The asset's hash is computed from the sorted relative paths and bytes of its
files (no timestamps), so an unchanged package never redeploys the function.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import aws_cdk as cdk
import jsii

PACKAGE = "worker_lib"
LEADER_MODULE = "worker_lib.leader.lambda_handler"
LEADER_HANDLER = f"{LEADER_MODULE}.handler"
PACKAGE_DATA = ("py.typed",)
"""Non-Python files of the top-level package that go into the asset."""


def package_root() -> Path:
    """The directory that holds the installed ``worker_lib`` package (site-packages, or a checkout in dev mode)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"cannot locate the installed {PACKAGE!r} package")
    return Path(spec.origin).resolve().parent.parent


def _module_file(root: Path, name: str) -> Path | None:
    """``root``-relative file of module ``name`` inside the package, or None when it is not one of its modules."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> list[str]:
    """Every module name an import statement of ``tree`` may load (``from a import b``: ``a`` and ``a.b``)."""
    names: list[str] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)  # the body runs only under a type checker
            continue
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, node.module] if node.module else parts)
            else:
                base = node.module or ""
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        todo.extend(ast.iter_child_nodes(node))
    return names


def _closure(root: Path, entry: str) -> tuple[dict[str, Path], tuple[str, ...]]:
    """(package modules by name with their files, sorted third-party top-level names) reachable from ``entry``."""
    modules: dict[str, Path] = {}
    external: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in modules:
            continue
        path = _module_file(root, name)
        if path is None:
            if name.split(".")[0] != PACKAGE:
                external.add(name.split(".")[0])
            continue
        modules[name] = path
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages run first
        tree = ast.parse(path.read_bytes(), filename=str(path))
        todo.extend(_imported_names(tree, name, path.name == "__init__.py"))
    if entry not in modules:
        raise RuntimeError(f"{entry!r} is not a module of the package under {root}")
    return modules, tuple(sorted(external - {""}))


def leader_modules(root: Path | None = None, entry: str = LEADER_MODULE) -> tuple[str, ...]:
    """The package modules the leader's handler imports, itself included (sorted)."""
    return tuple(sorted(_closure((root or package_root()).resolve(), entry)[0]))


def third_party_imports(root: Path | None = None, entry: str = LEADER_MODULE) -> tuple[str, ...]:
    """Top-level names of everything else the closure imports: the standard library and the runtime's packages."""
    return _closure((root or package_root()).resolve(), entry)[1]


def asset_files(root: Path | None = None, entry: str = LEADER_MODULE) -> list[PurePosixPath]:
    """The asset's files, relative to ``root`` (the directory holding ``worker_lib``), in a stable order."""
    root = (root or package_root()).resolve()
    files = {PurePosixPath(PACKAGE, data) for data in PACKAGE_DATA if (root / PACKAGE / data).is_file()}
    for path in _closure(root, entry)[0].values():
        files.add(PurePosixPath(path.relative_to(root).as_posix()))
    return sorted(files)


def asset_hash(root: Path | None = None, entry: str = LEADER_MODULE) -> str:
    """Content hash of the asset (relative paths and bytes): the same files give the same hash on any machine."""
    root = (root or package_root()).resolve()
    digest = hashlib.sha256()
    for rel in asset_files(root, entry):
        digest.update(str(rel).encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return digest.hexdigest()


def copy_asset(output_dir: Path, root: Path | None = None, entry: str = LEADER_MODULE) -> list[PurePosixPath]:
    """Copy the asset's files into ``output_dir`` (contents only, no metadata); returns the relative paths."""
    root = (root or package_root()).resolve()
    copied = asset_files(root, entry)
    for rel in copied:
        target = output_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
    return copied


@jsii.implements(cdk.ILocalBundling)
class LocalPythonBundling:
    """``ILocalBundling`` that copies the asset's files in Python: CDK never falls back to Docker."""

    def __init__(self, root: Path | None = None, entry: str = LEADER_MODULE) -> None:
        self._root = (root or package_root()).resolve()
        self._entry = entry

    def try_bundle(self, output_dir: str, options: Any = None, **_kwargs: Any) -> bool:
        """jsii passes the ``BundlingOptions`` struct as one positional argument; it is not needed here."""
        copy_asset(Path(output_dir), self._root, self._entry)
        return True


def leader_code(root: Path | None = None) -> cdk.aws_lambda.Code:
    """The leader's ``Code``: copied from the installed package, hashed by the asset's content."""
    root = (root or package_root()).resolve()
    return cdk.aws_lambda.Code.from_asset(
        # The source directory only anchors the asset (a custom hash means CDK never fingerprints it): the
        # handler's own package directory, small wherever the package is installed.
        str(root / PurePosixPath(*LEADER_MODULE.split(".")[:-1])),
        asset_hash_type=cdk.AssetHashType.CUSTOM,
        asset_hash=asset_hash(root),
        bundling=cdk.BundlingOptions(
            # Required by the type; never pulled, because the local bundler always succeeds.
            image=cdk.DockerImage.from_registry("public.ecr.aws/sam/build-python3.13"),
            local=LocalPythonBundling(root),
        ),
    )
