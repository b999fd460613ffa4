"""Where worker_lib.testing takes kinesalite from: explicit variables, then node_modules, then the user cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker_lib.testing import node


def make_package(directory: Path, name: str = "kinesalite") -> Path:
    package = directory / name
    package.mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"name": name}))
    return package


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No variables, a working directory without node_modules, not a checkout, an empty cache."""
    for name in ("SHARDLEASE_KINESALITE_BIN", "SHARDLEASE_NODE_MODULES"):
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(node, "_HERE", tmp_path / "site-packages" / "worker_lib" / "testing")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_the_order_is_variable_then_node_modules_then_cache(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN kinesalite in the cache (a finished install), in ./node_modules and in an explicit directory
    cached = make_package(node.cache_dir() / "node_modules")
    (node.cache_dir() / ".lock-digest").write_text(node._lock_digest())
    assert node.locate("kinesalite", install=False).path == cached
    local = make_package(isolated / "work" / "node_modules")
    assert node.locate("kinesalite").path == local
    modules = make_package(isolated / "modules")
    monkeypatch.setenv("SHARDLEASE_NODE_MODULES", str(isolated / "modules"))
    assert node.locate("kinesalite").path == modules
    explicit = make_package(isolated / "elsewhere")
    monkeypatch.setenv("SHARDLEASE_KINESALITE_BIN", str(explicit))
    found = node.locate("kinesalite")
    # THEN the explicit variable wins, and the answer says which path was taken
    assert found.path == explicit and found.source == "$SHARDLEASE_KINESALITE_BIN"


def test_a_half_finished_cache_install_is_not_taken_for_one(isolated: Path) -> None:
    make_package(node.cache_dir() / "node_modules")  # no stamp: npm ci was interrupted
    with pytest.raises(node.NodePackageError, match="not installed"):
        node.locate("kinesalite", install=False)


def test_without_node_one_line_says_what_to_install(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(node.NodePackageError) as caught:
        node.locate("kinesalite")
    assert str(caught.value) == "kinesalite needs Node.js 18 or later with npm on PATH: install Node.js (nodejs.org)"


def test_a_wrong_explicit_directory_is_named(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDLEASE_KINESALITE_BIN", str(isolated / "nothing"))
    with pytest.raises(node.NodePackageError, match=r"\$SHARDLEASE_KINESALITE_BIN=.* is not a kinesalite package"):
        node.locate("kinesalite")


def test_dynalite_is_never_installed_into_the_cache(isolated: Path) -> None:
    with pytest.raises(node.NodePackageError, match="run `npm install dynalite`"):
        node.locate("dynalite")
