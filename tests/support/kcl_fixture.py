"""Loads tests/fixtures/kcl3_lease_items.json (lease items as KCL 3.x writes them).

Binary attributes are stored base64-encoded in the JSON (as DynamoDB's JSON does) and decoded to bytes here,
which is what boto3's low-level client sends and returns.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

_PATH = Path(__file__).resolve().parent.parent / "fixtures" / "kcl3_lease_items.json"


def _decode(item: dict[str, Any]) -> dict[str, Any]:
    return {name: ({"B": base64.b64decode(v["B"])} if "B" in v else v) for name, v in item.items()}


def load() -> dict[str, list[dict[str, Any]]]:
    data = json.loads(_PATH.read_text())
    return {name: [_decode(item) for item in data[name]] for name in ("items", "foreign", "corrupt")}
