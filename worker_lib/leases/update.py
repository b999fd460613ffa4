"""One DynamoDB UpdateItem request on a lease item, built clause by clause (:class:`LeaseUpdate`)."""

from __future__ import annotations

from typing import Any

from worker_lib.leases.serializer import number
from worker_lib.tables.schema import LeaseAttr as A


class LeaseUpdate:
    """Builds one UpdateItem request with placeholder names for every attribute (several are reserved words)."""

    def __init__(self) -> None:
        self.sets: list[str] = []
        self.removes: list[str] = []
        self.adds: list[str] = []
        self.conditions: list[str] = []
        self.names: dict[str, str] = {}
        self.values: dict[str, dict[str, Any]] = {}

    def name(self, attr: str) -> str:
        placeholder = f"#{attr}"
        self.names[placeholder] = attr
        return placeholder

    def value(self, tag: str, attr_value: dict[str, Any]) -> str:
        placeholder = f":{tag}"
        self.values[placeholder] = attr_value
        return placeholder

    def set(self, attr: str, attr_value: dict[str, Any]) -> LeaseUpdate:
        self.sets.append(f"{self.name(attr)} = {self.value('set_' + attr, attr_value)}")
        return self

    def remove(self, attr: str) -> LeaseUpdate:
        self.removes.append(self.name(attr))
        return self

    def add(self, attr: str, amount: int) -> LeaseUpdate:
        self.adds.append(f"{self.name(attr)} {self.value('add_' + attr, number(amount))}")
        return self

    def require_equal(self, attr: str, attr_value: dict[str, Any]) -> LeaseUpdate:
        self.conditions.append(f"{self.name(attr)} = {self.value('cond_' + attr, attr_value)}")
        return self

    def require_absent(self, attr: str) -> LeaseUpdate:
        self.conditions.append(f"attribute_not_exists({self.name(attr)})")
        return self

    def require_present(self, attr: str) -> LeaseUpdate:
        self.conditions.append(f"attribute_exists({self.name(attr)})")
        return self

    def require_equal_or_absent(self, attr: str, expected: str | None) -> LeaseUpdate:
        if expected is None:
            return self.require_absent(attr)
        return self.require_equal(attr, {"S": expected})

    def require(self, expression: str) -> LeaseUpdate:
        self.conditions.append(expression)
        return self

    def request(self, table: str, lease_key: str) -> dict[str, Any]:
        clauses = []
        if self.sets:
            clauses.append("SET " + ", ".join(self.sets))
        if self.removes:
            clauses.append("REMOVE " + ", ".join(self.removes))
        if self.adds:
            clauses.append("ADD " + ", ".join(self.adds))
        request: dict[str, Any] = {
            "TableName": table,
            "Key": {A.LEASE_KEY: {"S": lease_key}},
            "UpdateExpression": " ".join(clauses),
            "ExpressionAttributeNames": self.names,
            "ReturnValues": "ALL_NEW",
        }
        if self.conditions:
            request["ConditionExpression"] = " AND ".join(f"({c})" for c in self.conditions)
        if self.values:
            request["ExpressionAttributeValues"] = self.values
        return request

    def transaction_item(self, table: str, lease_key: str) -> dict[str, Any]:
        """The same update as one ``TransactWriteItems`` ``Update`` action (which returns no item)."""
        item = self.request(table, lease_key)
        del item["ReturnValues"]
        return item
