"""What ``cdk synth`` runs (cdk.json: ``python -m infra``): the app of :mod:`infra.app`, with one readable line in
place of jsii's Node end-of-life banner.

jsii's Python runtime forwards the lines its Node process writes to stderr with ``print(line)`` on *bytes*
(``jsii/_kernel/providers/process.py``, ``stderr_sink``), so its eleven-line end-of-life banner arrives as Python
bytes literals (``b'!!  Node 20 is end-of-life ...'``). jsii reads ``JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION``
(a list of Node majors) before the app imports ``aws_cdk``: we set it for the running Node and say the same in one
line instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

OLDEST_SUPPORTED_NODE = 22
"""The oldest Node major jsii still supports (Node 20 reached its jsii end of life on 2026-10-30)."""


def node_major() -> int | None:
    """The major version of the ``node`` on PATH (what jsii runs), or None when it cannot be told."""
    node = shutil.which(os.environ.get("JSII_NODE", "node"))
    if node is None:
        return None
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
        return int(version.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def main() -> None:
    major = node_major()
    if major is not None and major < OLDEST_SUPPORTED_NODE:
        os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", str(major))
        print(
            f"note: Node {major} is past its end of life for the CDK (jsii); synth works, but use Node "
            f"{OLDEST_SUPPORTED_NODE} or newer",
            file=sys.stderr,
        )
    from infra.app import main as synth

    synth()


if __name__ == "__main__":
    main()
