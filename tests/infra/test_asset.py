"""The leader's code asset: built by the real ``cdk synth`` (pinned CLI, no Docker), containing what the handler
imports, and importable in a fresh interpreter holding only boto3 and Powertools — what the Lambda Python runtime
plus the Powertools layer provide."""

from __future__ import annotations

import json
from pathlib import Path

from worker_lib.cdk.bundling import LEADER_HANDLER, LocalPythonBundling, asset_files, asset_hash

from .support import REPO, run_isolated


def _asset_dir(cdk_out: Path) -> Path:
    (template_path,) = cdk_out.glob("*.template.json")
    template = json.loads(template_path.read_text())
    (fn,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    asset_id = fn["Properties"]["Code"]["S3Key"].removesuffix(".zip")
    path = cdk_out / f"asset.{asset_id}"
    assert path.is_dir()
    return path


def test_given_real_cdk_synth_then_template_and_bundled_asset_exist(cdk_out: Path) -> None:
    # GIVEN `npx cdk synth -q` with the pinned CLI (cdk.json context, cdk-nag plugin on)
    asset = _asset_dir(cdk_out)
    # THEN the asset is the handler plus worker_lib, no caches, no tests, no infra
    files = {p.relative_to(asset).as_posix() for p in asset.rglob("*") if p.is_file()}
    assert "functions/leader/handler.py" in files
    assert {"worker_lib/leader/host.py", "worker_lib/leader/leader.py", "worker_lib/tables/schema.py"} <= files
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    assert not any(f.startswith(("infra/", "tests/", ".venv/", "node_modules/")) for f in files)
    assert files == {p.as_posix() for p in asset_files(REPO)}


def test_given_a_copy_of_the_asset_tree_then_its_hash_follows_content_only(tmp_path: Path) -> None:
    # GIVEN a copy of the asset's files
    for rel in asset_files(REPO):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((REPO / rel).read_bytes())
    before = asset_hash(tmp_path)
    # WHEN a cache file appears THEN the hash is unchanged (an unchanged checkout never redeploys the function)
    (tmp_path / "worker_lib" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "worker_lib" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"cache")
    assert asset_hash(tmp_path) == before
    # WHEN a source file changes THEN the hash changes
    handler = tmp_path / "functions" / "leader" / "handler.py"
    handler.write_text(handler.read_text() + "\n# changed\n")
    assert asset_hash(tmp_path) != before


def test_given_the_local_bundler_when_called_by_cdk_convention_then_it_copies_the_asset(tmp_path: Path) -> None:
    # GIVEN jsii's calling convention (output dir + options struct)
    assert LocalPythonBundling(REPO).try_bundle(str(tmp_path), None) is True
    assert (tmp_path / "functions" / "leader" / "handler.py").read_bytes() == (
        REPO / "functions" / "leader" / "handler.py"
    ).read_bytes()


def test_given_a_fresh_interpreter_with_boto3_and_powertools_only_then_the_asset_imports(
    cdk_out: Path, lambda_python: Path
) -> None:
    # GIVEN the synthesized asset on sys.path of an isolated venv (boto3 + Powertools, nothing else)
    asset = _asset_dir(cdk_out)
    module, _, attr = LEADER_HANDLER.rpartition(".")
    code = f"""
import importlib, importlib.util, json, sys
for absent in ("psutil", "moto", "aws_cdk", "pytest", "worker_lib_dev_marker"):
    assert importlib.util.find_spec(absent) is None, absent + " must not be importable here"
mod = importlib.import_module({module!r})
assert callable(getattr(mod, {attr!r}))
assert mod._clients is None  # no AWS client is created at import
assert mod.__file__.startswith({str(asset)!r}), mod.__file__
loaded = sorted(m for m in sys.modules if m.startswith("worker_lib"))
print(json.dumps(loaded))
"""
    # WHEN importing the handler module
    out = run_isolated(lambda_python, code, path=[asset], env={"AWS_DEFAULT_REGION": "eu-west-1"})
    # THEN it imports cleanly, with the leader's composition loaded from the asset
    loaded = set(json.loads(out.strip().splitlines()[-1]))
    assert {"worker_lib.leader.host", "worker_lib.leader.leader", "worker_lib.telemetry.names"} <= loaded
