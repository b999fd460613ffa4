"""Shard graph A's creation table (docs/kcl-compatibility.md "Shard sync and lease lifecycle"), shared by the pure
rules' test (tests/unit/test_shard_hierarchy.py) and the one against real resharding
(tests/integration/test_shard_sync.py): graph A is 0–5 closed; 6 = merge(0,1); 7 = merge(2,3); 8 = merge(6,7);
9, 10 = split(5)."""

from __future__ import annotations

from typing import Any

import pytest

from worker_lib.core.config import InitialPosition

L, TH, AT = InitialPosition.LATEST, InitialPosition.TRIM_HORIZON, InitialPosition.AT_TIMESTAMP

# existing leases → created (LATEST, TRIM_HORIZON, AT_TIMESTAMP)
TABLE = [
    ((4, 5, 7), (6,), (0, 1), (0, 1)),
    ((3, 4, 5), (2, 6), (0, 1, 2), (0, 1, 2)),
    ((2, 6), (3, 4, 9, 10), (3, 4, 5), (3, 4, 5)),
    ((4, 9, 10), (8,), (0, 1, 2, 3), (0, 1, 2, 3)),
    ((), (4, 8, 9, 10), (0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 4, 5)),
    ((4, 5, 6, 7), (), (), ()),
]
CASES: list[Any] = [
    pytest.param(existing, position, expected, id=f"{','.join(map(str, existing)) or 'none'}-{position.value}")
    for existing, latest, trim, at in TABLE
    for position, expected in ((L, latest), (TH, trim), (AT, at))
]
"""(existing shards, initial position, created shards) per row and position; ids such as ``4,5,7-LATEST``."""
