"""The leader's code asset: built by the real ``cdk synth`` (pinned CLI, no Docker) from the installed
``worker_lib`` package, holding the handler module's import closure and nothing else, and importable in a fresh
interpreter holding only boto3 and Powertools — what the Lambda Python runtime plus the Powertools layer provide."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import worker_lib
from worker_lib.cdk.bundling import (
    LEADER_HANDLER,
    LEADER_MODULE,
    LocalPythonBundling,
    asset_files,
    asset_hash,
    leader_modules,
    package_root,
    third_party_imports,
)

from .support import asset_dir, files_under, run_isolated

LEFT_OUT = ("tools", "testing", "cli", "spark", "cdk", "worker")
"""Packages of worker_lib the leader does not import: none of their files may be in the asset."""
LAMBDA_PROVIDED_IMPORTS = {"boto3", "botocore", "aws_lambda_powertools"}


def test_given_the_checkout_then_the_package_root_is_where_python_finds_worker_lib() -> None:
    assert package_root() == Path(worker_lib.__file__).resolve().parents[1]


def test_given_the_handler_then_its_closure_holds_the_leader_and_leaves_other_layers_out() -> None:
    files = {str(f) for f in asset_files()}
    assert f"{LEADER_MODULE}.handler" == LEADER_HANDLER
    assert {
        "worker_lib/__init__.py",
        "worker_lib/py.typed",
        "worker_lib/leader/__init__.py",
        "worker_lib/leader/lambda_handler.py",
        "worker_lib/leader/leader.py",
        "worker_lib/tables/schema.py",
    } <= files
    assert not [f for f in files if f.split("/")[1] in LEFT_OUT], files
    # every package on the way to a module is there with its __init__.py
    for name in leader_modules():
        for i in range(1, name.count(".") + 1):
            assert "/".join(name.split(".")[:i]) + "/__init__.py" in files
    # third-party imports: the standard library, boto3 (Lambda runtime) and Powertools (layer) only
    assert set(third_party_imports()) - set(sys.stdlib_module_names) <= LAMBDA_PROVIDED_IMPORTS


def test_given_real_cdk_synth_then_its_output_has_no_bytes_literals(cdk_out: Path) -> None:
    # GIVEN `cdk synth` as a user runs it (the Node of this machine, whatever jsii thinks of it)
    output = (cdk_out / "synth-output.txt").read_text()
    # THEN no line is a Python bytes literal (jsii prints its Node banner so), at most one readable note
    assert not [line for line in output.splitlines() if line.startswith(("b'", 'b"'))], output
    assert sum(line.startswith("note: Node") for line in output.splitlines()) <= 1


def test_given_real_cdk_synth_then_template_and_bundled_asset_exist(cdk_out: Path) -> None:
    # GIVEN `npx cdk synth -q` with the pinned CLI (cdk.json context, cdk-nag plugin on)
    files = files_under(asset_dir(cdk_out))
    # THEN the asset is exactly the handler's closure: no caches, no tests, no infra, no functions/
    assert files == {str(f) for f in asset_files()}
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    assert all(f.startswith("worker_lib/") for f in files)


def test_given_a_copy_of_the_package_then_the_asset_hash_follows_content_only(tmp_path: Path) -> None:
    # GIVEN a copy of the installed package's files
    for rel in asset_files():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((package_root() / rel).read_bytes())
    before = asset_hash(tmp_path)
    assert before == asset_hash()  # the same bytes give the same hash wherever they are installed
    # WHEN a cache file and a module the leader does not import appear THEN the hash is unchanged
    (tmp_path / "worker_lib" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "worker_lib" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"cache")
    (tmp_path / "worker_lib" / "tools").mkdir(exist_ok=True)
    (tmp_path / "worker_lib" / "tools" / "simulate.py").write_text("x = 1\n")
    assert asset_hash(tmp_path) == before
    # WHEN a source file of the closure changes THEN the hash changes
    handler = tmp_path / "worker_lib" / "leader" / "lambda_handler.py"
    handler.write_text(handler.read_text() + "\n# changed\n")
    assert asset_hash(tmp_path) != before


def test_given_the_local_bundler_when_called_by_cdk_convention_then_it_copies_the_asset(tmp_path: Path) -> None:
    # GIVEN jsii's calling convention (output dir + options struct)
    assert LocalPythonBundling().try_bundle(str(tmp_path), None) is True
    handler = Path("worker_lib", "leader", "lambda_handler.py")
    assert (tmp_path / handler).read_bytes() == (package_root() / handler).read_bytes()
    assert files_under(tmp_path) == {str(f) for f in asset_files()}


def test_given_a_fresh_interpreter_with_boto3_and_powertools_only_then_the_asset_imports(
    cdk_out: Path, lambda_python: Path
) -> None:
    # GIVEN the synthesized asset on sys.path of an isolated venv (boto3 + Powertools, nothing else)
    asset = asset_dir(cdk_out)
    code = f"""
import importlib, importlib.util, json, sys
for absent in ("psutil", "moto", "aws_cdk", "pytest"):
    assert importlib.util.find_spec(absent) is None, absent + " must not be importable here"
mod = importlib.import_module({LEADER_MODULE!r})
assert callable(mod.handler)
assert mod.__file__.startswith({str(asset)!r}), mod.__file__
print(json.dumps(sorted(m for m in sys.modules if m.startswith("worker_lib"))))
"""
    # WHEN importing the handler module
    out = run_isolated(lambda_python, code, path=[asset], env={"AWS_DEFAULT_REGION": "eu-west-1"})
    # THEN it imports cleanly, with the leader's composition loaded from the asset
    loaded = set(json.loads(out.strip().splitlines()[-1]))
    assert {"worker_lib.leader.leader", "worker_lib.telemetry.names"} <= loaded
    assert loaded <= set(leader_modules())  # the static closure covers everything the import loads
