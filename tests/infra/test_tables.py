"""The three tables come from worker_lib.tables.schema: names, keys, GSI with the table, PITR, encryption."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Match, Template

from worker_lib.tables.schema import LEASE_OWNER_INDEX, LEASES, BillingMode, TableKind, all_specs

from .conftest import Synth
from .support import APP, CMK_APP


def _tables(template: Template) -> dict[str, Any]:
    found = template.find_resources("AWS::DynamoDB::Table")
    return {res["Properties"]["TableName"]: res for res in found.values()}


def test_given_the_schema_when_synthesized_then_keys_attributes_and_gsi_are_the_schemas(synth: Synth) -> None:
    # GIVEN the CreateTable request of each spec
    tables = _tables(synth.default)
    # WHEN comparing with the synthesized tables
    # THEN names, key schema, attribute definitions and GSIs are exactly the schema's
    assert set(tables) == {spec.table_name(APP) for spec in all_specs()}
    for spec in all_specs():
        request = spec.create_table_request(APP, BillingMode.PAY_PER_REQUEST)
        props = tables[request["TableName"]]["Properties"]
        assert props["KeySchema"] == request["KeySchema"]
        assert sorted(props["AttributeDefinitions"], key=str) == sorted(request["AttributeDefinitions"], key=str)
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        assert props.get("GlobalSecondaryIndexes", []) == request.get("GlobalSecondaryIndexes", [])


def test_given_the_lease_table_when_synthesized_then_gsi_is_created_with_the_table_keys_only(synth: Synth) -> None:
    # GIVEN the lease table resource
    props = _tables(synth.default)[LEASES.table_name(APP)]["Properties"]
    # THEN the GSI is part of the same AWS::DynamoDB::Table resource (created with the table), KEYS_ONLY
    assert props["GlobalSecondaryIndexes"] == [
        {
            "IndexName": LEASE_OWNER_INDEX.name,
            "KeySchema": [
                {"AttributeName": "leaseOwner", "KeyType": "HASH"},
                {"AttributeName": "leaseKey", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
    ]


def test_given_default_stack_then_pitr_only_on_lease_table_and_all_encrypted_at_rest(synth: Synth) -> None:
    tables = _tables(synth.default)
    for spec in all_specs():
        props = tables[spec.table_name(APP)]["Properties"]
        # THEN point-in-time recovery follows the schema (lease table only) ...
        pitr = props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled", False)
        assert pitr is spec.point_in_time_recovery
        # ... and every table is encrypted at rest with KMS (AWS managed key by default)
        assert props["SSESpecification"] == {"SSEEnabled": True}  # SSEType defaults to KMS (aws/dynamodb key)
    # AND the lease table is retained and protected from deletion; the others are retained
    lease = tables[LEASES.table_name(APP)]
    assert lease["Properties"]["DeletionProtectionEnabled"] is True
    assert all(t["DeletionPolicy"] == "Retain" and t["UpdateReplacePolicy"] == "Retain" for t in tables.values())


def test_given_cmk_and_provisioned_then_tables_use_the_key_and_schema_throughput(synth: Synth) -> None:
    # GIVEN a construct with a customer managed key, PROVISIONED billing and DESTROY removal
    tables = _tables(synth.cmk)
    assert set(tables) == {spec.table_name(CMK_APP) for spec in all_specs()}
    key_ids = synth.cmk.find_resources("AWS::KMS::Key")
    table_key = next(k for k in key_ids if k.startswith("TableKey"))
    for spec in all_specs():
        request = spec.create_table_request(CMK_APP, BillingMode.PROVISIONED)
        res = tables[request["TableName"]]
        props = res["Properties"]
        # THEN SSE uses the given key
        assert props["SSESpecification"] == {
            "KMSMasterKeyId": {"Fn::GetAtt": [table_key, "Arn"]},
            "SSEEnabled": True,
            "SSEType": "KMS",
        }
        # AND the provisioned throughput is the schema's (table and GSI)
        assert props["ProvisionedThroughput"] == request["ProvisionedThroughput"]
        assert props.get("GlobalSecondaryIndexes", []) == request.get("GlobalSecondaryIndexes", [])
        assert res["DeletionPolicy"] == "Delete"
        assert "DeletionProtectionEnabled" not in props or props["DeletionProtectionEnabled"] is False


def test_given_the_construct_then_it_exposes_tables_by_kind(synth: Synth) -> None:
    c = synth.coordination
    assert {TableKind.LEASES, TableKind.WORKER_METRICS, TableKind.COORDINATOR_STATE} == {s.kind for s in all_specs()}
    assert c.lease_table is not c.worker_metrics_table is not c.coordinator_state_table
    synth.default.resource_count_is("AWS::DynamoDB::Table", 3)
    synth.default.has_resource_properties(
        "AWS::DynamoDB::Table", Match.object_like({"TableName": f"{APP}-CoordinatorState"})
    )
