"""Tables as other tools leave them, for the tests of what our start checks say about them."""

from __future__ import annotations

from typing import Any


def create_foreign_table(ddb: Any, table: str, *, replace: bool = False) -> None:
    """Create ``table`` keyed on ``id`` (as made by hand or by another tool), deleting ours first if ``replace``."""
    if replace:
        ddb.delete_table(TableName=table)
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
