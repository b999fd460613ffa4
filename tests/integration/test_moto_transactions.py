"""The moto server our tests use keeps DynamoDB's transaction isolation: a cancelled TransactWriteItems undoes
nothing another request wrote meanwhile (worker_lib/testing/_moto_server.py serialises DynamoDB requests; moto alone
puts back whole copies of the tables a cancelled transaction touched)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from worker_lib.core import aws
from worker_lib.core.config import AwsConfig

ITEMS = 400  # table size: moto copies the whole table per transaction, which widens the window
TRANSACTIONS = 60
UPDATES = 150


def test_a_cancelled_transaction_undoes_no_concurrent_write(moto_aws: AwsConfig, app_name: str) -> None:
    # GIVEN a table of 400 items and a counter item in it
    ddb: Any = aws.client("dynamodb", moto_aws)
    table = f"{app_name}-iso"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for start in range(0, ITEMS, 25):
        requests = [
            {"PutRequest": {"Item": {"pk": {"S": f"i{n}"}, "pad": {"S": "x" * 200}}}} for n in range(start, start + 25)
        ]
        ddb.batch_write_item(RequestItems={table: requests})
    ddb.put_item(TableName=table, Item={"pk": {"S": "counter"}, "n": {"N": "0"}})

    def cancelled_transactions() -> None:
        other: Any = aws.client("dynamodb", moto_aws)
        for _ in range(TRANSACTIONS):
            with contextlib.suppress(other.exceptions.TransactionCanceledException):
                other.transact_write_items(
                    TransactItems=[
                        {"Put": {"TableName": table, "Item": {"pk": {"S": "doomed"}}}},
                        {
                            "ConditionCheck": {
                                "TableName": table,
                                "Key": {"pk": {"S": "i0"}},
                                "ConditionExpression": "attribute_not_exists(pk)",
                            }
                        },
                    ]
                )

    # WHEN one client's transactions are cancelled over and over while another increments the counter
    canceller = threading.Thread(target=cancelled_transactions)
    canceller.start()
    for _ in range(UPDATES):
        ddb.update_item(
            TableName=table,
            Key={"pk": {"S": "counter"}},
            UpdateExpression="ADD n :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
        )
    canceller.join()
    # THEN every increment is there, and nothing of the cancelled transactions
    item = ddb.get_item(TableName=table, Key={"pk": {"S": "counter"}}, ConsistentRead=True)["Item"]
    assert item["n"]["N"] == str(UPDATES)
    assert "Item" not in ddb.get_item(TableName=table, Key={"pk": {"S": "doomed"}})
