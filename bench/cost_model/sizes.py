"""DynamoDB's rules for item sizes and request units, and which operations read or write.

The estimate of request units rests on these rules alone (the emulator charges nothing), so they are written once
and shared by the counting, the scale inputs and the extrapolation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

PAGE_BYTES = 1024 * 1024  # Scan/Query page limit
READ_BLOCK = 4096
WRITE_BLOCK = 1024

READS = {"GetItem", "Scan", "Query", "BatchGetItem"}
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"}


def number_size(raw: str) -> int:
    """A number: 1 byte per two significant digits, plus 1."""
    digits = raw.lstrip("+-").split("e")[0].split("E")[0].replace(".", "").strip("0")
    return math.ceil(max(1, len(digits)) / 2) + 1


def value_size(value: Mapping[str, Any]) -> int:
    ((kind, raw),) = value.items()
    if kind == "S":
        return len(str(raw).encode())
    if kind == "N":
        return number_size(str(raw))
    if kind == "B":
        return len(raw) if isinstance(raw, (bytes, bytearray)) else len(str(raw).encode())
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(x).encode()) for x in raw)
    if kind == "NS":
        return sum(number_size(str(x)) for x in raw)
    if kind == "BS":
        return sum(len(x) for x in raw)
    if kind == "L":
        return 3 + sum(value_size(x) + 1 for x in raw)
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in raw.items())
    return len(json.dumps(raw, default=str))


def item_size(item: Mapping[str, Any]) -> int:
    """DynamoDB's item size: attribute names (UTF-8) plus values."""
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def read_units(nbytes: int, *, consistent: bool) -> float:
    units = max(1, math.ceil(nbytes / READ_BLOCK))
    return float(units) if consistent else units / 2


def write_units(nbytes: int) -> float:
    return float(max(1, math.ceil(nbytes / WRITE_BLOCK)))
