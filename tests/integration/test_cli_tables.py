"""`shardlease create-tables` and the CLI's error contract, run as a real process against a moto server."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.processes import shardlease_run
from tests.support.tables import create_foreign_table
from worker_lib.core import aws
from worker_lib.core.config import AwsConfig
from worker_lib.core.errors import TableSchemaError
from worker_lib.tables.admin import ensure_tables
from worker_lib.tables.schema import LEASE_OWNER_INDEX, all_specs


def test_create_tables_is_idempotent_and_waits_for_active_indexes(moto_endpoint: str, app_name: str) -> None:
    # WHEN create-tables runs twice
    first = shardlease_run("create-tables", "--app", app_name, "--endpoint-url", moto_endpoint)
    second = shardlease_run("create-tables", "--app", app_name, "--endpoint-url", moto_endpoint)
    # THEN it creates three tables, then finds them
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("created") == 3
    assert second.returncode == 0 and second.stdout.count("exists") == 3
    # AND the tables have KCL's keys and the KEYS_ONLY owner index
    ddb = aws.client("dynamodb", AwsConfig(endpoint_url=moto_endpoint))
    lease_table = ddb.describe_table(TableName=app_name)["Table"]
    assert lease_table["TableStatus"] == "ACTIVE"
    assert lease_table["KeySchema"] == [{"AttributeName": "leaseKey", "KeyType": "HASH"}]
    (gsi,) = lease_table["GlobalSecondaryIndexes"]
    assert gsi["IndexName"] == LEASE_OWNER_INDEX.name == "LeaseOwnerToLeaseKeyIndex"
    assert gsi["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert gsi["KeySchema"] == [
        {"AttributeName": "leaseOwner", "KeyType": "HASH"},
        {"AttributeName": "leaseKey", "KeyType": "RANGE"},
    ]
    for suffix, key in (("-WorkerMetricStats", "wid"), ("-CoordinatorState", "key")):
        table = ddb.describe_table(TableName=app_name + suffix)["Table"]
        assert table["KeySchema"] == [{"AttributeName": key, "KeyType": "HASH"}]
    backups = ddb.describe_continuous_backups(TableName=app_name)["ContinuousBackupsDescription"]
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"


def test_tables_are_created_on_dynalite_too(dynalite_endpoint: str, app_name: str) -> None:
    ddb = aws.client("dynamodb", AwsConfig(endpoint_url=dynalite_endpoint))
    created = ensure_tables(app_name, ddb)
    assert list(created.values()) == [True, True, True]
    assert ensure_tables(app_name, ddb) == dict.fromkeys(created, False)


def test_a_conflicting_table_is_one_clear_error(moto_endpoint: str, app_name: str) -> None:
    # GIVEN a table with the app's name but another key
    ddb: Any = aws.client("dynamodb", AwsConfig(endpoint_url=moto_endpoint))
    create_foreign_table(ddb, app_name)
    # WHEN create-tables runs
    result = shardlease_run("create-tables", "--app", app_name, "--endpoint-url", moto_endpoint)
    # THEN it fails with one line naming the table and the key it needs
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert app_name in result.stderr and "leaseKey" in result.stderr
    with pytest.raises(TableSchemaError):
        ensure_tables(app_name, ddb)


def test_a_lease_table_without_the_owner_index_gets_it(moto_endpoint: str, app_name: str) -> None:
    # GIVEN a lease table as KCL 2.x creates it: our key, no owner index
    ddb: Any = aws.client("dynamodb", AwsConfig(endpoint_url=moto_endpoint))
    lease_spec = all_specs()[0]
    request = lease_spec.create_table_request(app_name)
    del request["GlobalSecondaryIndexes"]
    request["AttributeDefinitions"] = [{"AttributeName": "leaseKey", "AttributeType": "S"}]
    ddb.create_table(**request)
    # WHEN create-tables runs
    result = shardlease_run("create-tables", "--app", app_name, "--endpoint-url", moto_endpoint)
    # THEN it succeeds, keeps the table and adds the index (docs/kcl-compatibility.md, adopting KCL 2.x)
    assert result.returncode == 0, result.stderr
    assert f"{app_name}: exists (ACTIVE)" in result.stdout
    indexes = ddb.describe_table(TableName=app_name)["Table"]["GlobalSecondaryIndexes"]
    assert [g["IndexName"] for g in indexes] == ["LeaseOwnerToLeaseKeyIndex"]


def test_an_owner_index_with_other_keys_is_refused(moto_endpoint: str, app_name: str) -> None:
    # GIVEN a lease table whose index of our name has other keys
    ddb: Any = aws.client("dynamodb", AwsConfig(endpoint_url=moto_endpoint))
    ddb.create_table(
        TableName=app_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "leaseKey", "AttributeType": "S"},
            {"AttributeName": "owner", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
        GlobalSecondaryIndexes=[
            {
                "IndexName": "LeaseOwnerToLeaseKeyIndex",
                "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    )
    # THEN ensuring the tables refuses it with a typed error naming the index
    with pytest.raises(TableSchemaError, match="LeaseOwnerToLeaseKeyIndex"):
        ensure_tables(app_name, ddb)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["create-tables"], "--app"),
        (["create-tables", "--app", "x"], "invalid application name"),
        (["create-tables", "--app", "good-app", "--endpoint-url", "not a url"], "invalid endpoint URL"),
        (["create-tables", "--app", "good-app", "--timeout", "-3"], "must be positive"),
        (["leader", "--app", "good-app"], "--stream"),
        (["leader", "--app", "good-app", "--stream", "s", "--initial-position", "EARLIEST"], "initial position"),
        (["leader", "--app", "good-app", "--stream", "s", "--initial-position", "AT_TIMESTAMP"], "timestamp"),
        (
            ["leader", "--app", "good-app", "--stream", "s", "--initial-position", "AT_TIMESTAMP", "--timestamp", "x"],
            "invalid timestamp",
        ),
        (["demo", "--workers", "0"], "at least 1"),
        (["no-such-command"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    result = shardlease_run(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr


def test_an_unreachable_endpoint_is_one_line_and_exit_1() -> None:
    result = shardlease_run("create-tables", "--app", "good-app", "--endpoint-url", "http://127.0.0.1:9")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "cannot reach endpoint" in result.stderr
