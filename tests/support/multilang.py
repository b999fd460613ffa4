"""Third-party MultiLang applications for tests, fetched at their pinned versions from the registries at test time.

* amazon-kclpy: the source distribution from PyPI (no JARs, no Java: the tarball holds the Python modules and
  ``samples/``; nothing of it is built or installed, so its setup.py — which fetches JARs from Maven — never runs).
  The test puts its Python modules on the child's path and runs ``samples/sample_kclpy_app.py`` as it is.
* aws-kcl: from npm, pinned in package.json and package-lock.json (``node_modules/aws-kcl``). Its tarball ships no
  samples, so ``multilang_node_consumer.js`` here is a record processor of ours written against its public API.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import pytest

KCLPY_VERSION = "3.2.0"
KCLPY_SDIST_SHA256 = "62e81cc84714c920fe6aa5d61837b298fe7e01f6326dcb564b12ab8e6c4aca4e"
PYPI_JSON = "https://pypi.org/pypi/amazon-kclpy/json"

NODE_CONSUMER = Path(__file__).resolve().parent / "multilang_node_consumer.js"


def fetch_kclpy(into: Path, *, timeout_s: float = 60.0) -> Path:
    """The unpacked amazon-kclpy source distribution (its root: ``amazon_kclpy/``, ``samples/``), downloaded once
    into ``into``; skips the test, saying why, if PyPI cannot be reached. A download whose digest is not the
    pinned one fails the test: it is not the code we pinned."""
    root = into / f"amazon_kclpy-{KCLPY_VERSION}"
    if (root / "samples" / "sample_kclpy_app.py").is_file():
        return root
    try:
        with urllib.request.urlopen(PYPI_JSON, timeout=timeout_s) as reply:
            index = json.load(reply)
        (sdist,) = [f for f in index["releases"][KCLPY_VERSION] if f["packagetype"] == "sdist"]
        url = urllib.parse.urljoin(PYPI_JSON, sdist["url"])  # a mirror may answer with a relative address
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            data = reply.read()
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        pytest.skip(f"PyPI is not reachable, so amazon-kclpy {KCLPY_VERSION} cannot be fetched: {exc}")
    digest = hashlib.sha256(data).hexdigest()
    assert digest == KCLPY_SDIST_SHA256, f"amazon-kclpy {KCLPY_VERSION} from PyPI has digest {digest}"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        archive.extractall(into, filter="data")
    return root


_ENTRY = re.compile(r"^(\s*)([A-Za-z][\w.]*)(\s*[=:]\s*).*$")


def edit_properties(text: str, values: Mapping[str, str]) -> str:
    """``text`` with the active keys of ``values`` set to them (as a user edits the sample file: comments and
    every other key stay), and the keys it lacks appended."""
    left = dict(values)
    lines = []
    for line in text.splitlines():
        match = _ENTRY.match(line)
        if match and match.group(2) in left:
            lines.append(f"{match.group(1)}{match.group(2)}{match.group(3)}{left.pop(match.group(2))}")
        else:
            lines.append(line)
    lines += [f"{key} = {value}" for key, value in left.items()]
    return "\n".join(lines) + "\n"


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (every thread's children, from /proc)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children


_KCLPY_RECORD = re.compile(r"Partition Key: (\S+), Sequence Number: (\d+)")
_SHARD_PREFIX = re.compile(r"\[(shardId-\d+)\] (.*)$")


def kclpy_sample_records(log: str) -> dict[str, list[tuple[str, int]]]:
    """What kclpy's sample app wrote to stderr (the daemon's log, one ``[shardId]`` prefix per line), by shard:
    (partition key, sequence number) of every record it processed, in order, repeats included."""
    seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for line in log.splitlines():
        prefixed = _SHARD_PREFIX.search(line)
        if prefixed:
            seen[prefixed.group(1)] += [(key, int(seq)) for key, seq in _KCLPY_RECORD.findall(prefixed.group(2))]
    return dict(seen)
