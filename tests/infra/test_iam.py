"""Least privilege: named actions only, each scoped to a table, the GSI, the stream, the log group or a key.

The only ``Resource: "*"`` statements allowed are the two services without resource-level permissions: X-Ray
(tracing) and CloudWatch PutMetricData, the latter pinned to the application's namespace by a condition.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Template

from worker_lib.cdk import permissions as p

from .conftest import Synth
from .support import STREAM_ARN

STAR_ALLOWED = {
    frozenset({"xray:PutTraceSegments", "xray:PutTelemetryRecords"}),
    frozenset({"cloudwatch:PutMetricData"}),
}


def _statements(template: Template) -> list[tuple[str, dict[str, Any]]]:
    """(logical id of the policy, statement) for every IAM policy and managed policy in the template."""
    out = []
    for type_ in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        for logical_id, res in template.find_resources(type_).items():
            for statement in res["Properties"]["PolicyDocument"]["Statement"]:
                out.append((logical_id, statement))
    return out


def _actions(statement: dict[str, Any]) -> set[str]:
    actions = statement["Action"]
    return {actions} if isinstance(actions, str) else set(actions)


def _resources(statement: dict[str, Any]) -> list[Any]:
    resources = statement["Resource"]
    return resources if isinstance(resources, list) else [resources]


def _describe(resource: Any, template: Template) -> str:
    """A readable name for a resource ARN expression: table:<id>, index:<id>/<name>, stream, key:<id>, loggroup."""
    if resource == STREAM_ARN:
        return "stream"
    text = json.dumps(resource)
    types = {k: v["Type"] for k, v in template.to_json()["Resources"].items()}
    if isinstance(resource, dict) and "Fn::GetAtt" in resource:
        logical, attr = resource["Fn::GetAtt"]
        kind = {
            "AWS::DynamoDB::Table": "table",
            "AWS::Kinesis::Stream": "stream",
            "AWS::KMS::Key": "key",
            "AWS::Logs::LogGroup": "loggroup",
        }[types[logical]]
        assert attr == "Arn"
        return f"{kind}:{logical}"
    if isinstance(resource, dict) and "Fn::Join" in resource:
        parts = resource["Fn::Join"][1]
        if len(parts) == 2 and isinstance(parts[1], str) and parts[1].startswith("/index/"):
            return f"index:{parts[0]['Fn::GetAtt'][0]}{parts[1]}"
    raise AssertionError(f"unscoped or unexpected resource {text}")


def test_given_all_policies_when_inspected_then_no_action_has_a_wildcard(synth: Synth) -> None:
    for template in (synth.default, synth.cmk):
        for logical_id, statement in _statements(template):
            wild = [a for a in _actions(statement) if "*" in a]
            assert not wild, f"{logical_id}: wildcard actions {wild}"
            assert statement["Effect"] == "Allow"


def test_given_all_policies_then_star_resources_only_for_xray_and_namespaced_put_metric_data(synth: Synth) -> None:
    for template in (synth.default, synth.cmk):
        for logical_id, statement in _statements(template):
            if "*" in _resources(statement):
                # THEN only services without resource-level permissions use "*" ...
                assert frozenset(_actions(statement)) in STAR_ALLOWED, f"{logical_id}: {statement}"
                if "cloudwatch:PutMetricData" in _actions(statement):
                    # ... and PutMetricData is confined to one namespace
                    assert set(statement["Condition"]["StringEquals"]) == {"cloudwatch:namespace"}
            else:
                # THEN every other resource is a table, the GSI, the stream, the log group or a KMS key
                for resource in _resources(statement):
                    _describe(resource, template)


def _grants_by_resource(template: Template, policy_prefix: str) -> dict[str, set[str]]:
    grants: dict[str, set[str]] = {}
    for logical_id, statement in _statements(template):
        if not logical_id.startswith(policy_prefix):
            continue
        for resource in _resources(statement):
            name = "*" if resource == "*" else _describe(resource, template)
            grants.setdefault(name, set()).update(_actions(statement))
    return grants


def _table_ids(template: Template) -> dict[str, str]:
    ids = {}
    for logical_id, res in template.find_resources("AWS::DynamoDB::Table").items():
        name = res["Properties"]["TableName"]
        if name.endswith("-WorkerMetricStats"):
            ids["metrics"] = logical_id
        elif name.endswith("-CoordinatorState"):
            ids["state"] = logical_id
        else:
            ids["leases"] = logical_id
    return ids


def test_given_the_leader_role_then_it_has_exactly_the_leader_permission_set(synth: Synth) -> None:
    # GIVEN the leader role's policy in the default stack
    template = synth.default
    ids = _table_ids(template)
    grants = _grants_by_resource(template, "CoordinationLeaderRole")
    logs = next(iter(template.find_resources("AWS::Logs::LogGroup")))
    # THEN each resource gets exactly what the leader calls, nothing else
    assert grants == {
        f"table:{ids['leases']}": set(p.LEADER_LEASE_ACTIONS),
        f"index:{ids['leases']}/index/LeaseOwnerToLeaseKeyIndex": {"dynamodb:Query"},
        f"table:{ids['metrics']}": set(p.LEADER_WORKER_METRICS_ACTIONS),
        f"table:{ids['state']}": set(p.LEADER_COORDINATOR_ACTIONS),
        "stream": {"kinesis:DescribeStreamSummary", "kinesis:ListShards"},
        f"loggroup:{logs}": {"logs:CreateLogStream", "logs:PutLogEvents"},
        "*": {"xray:PutTraceSegments", "xray:PutTelemetryRecords"},
    }
    # AND no AWS managed policy is attached to the role
    role = next(iter(template.find_resources("AWS::IAM::Role").values()))
    assert "ManagedPolicyArns" not in role["Properties"]
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "lambda.amazonaws.com"
    }


def test_given_the_worker_managed_policy_then_it_reads_the_stream_and_writes_leases(synth: Synth) -> None:
    template = synth.default
    ids = _table_ids(template)
    grants = _grants_by_resource(template, "CoordinationWorkerPolicy")
    assert grants == {
        f"table:{ids['leases']}": set(p.WORKER_LEASE_ACTIONS),
        f"index:{ids['leases']}/index/LeaseOwnerToLeaseKeyIndex": {"dynamodb:Query"},
        f"table:{ids['metrics']}": set(p.WORKER_METRICS_ACTIONS),
        f"table:{ids['state']}": {"dynamodb:DescribeTable", "dynamodb:GetItem"},
        "stream": set(p.WORKER_STREAM_ACTIONS),
        "*": {"cloudwatch:PutMetricData"},
    }
    # AND workers can never delete leases or touch the leader lock
    assert "dynamodb:DeleteItem" not in grants[f"table:{ids['leases']}"]
    assert not {"dynamodb:PutItem", "dynamodb:UpdateItem"} & grants[f"table:{ids['state']}"]


def test_given_grant_worker_on_a_task_role_then_it_matches_the_managed_policy_plus_keys(synth: Synth) -> None:
    # GIVEN grant_worker(task role) in the CMK stack (stream and tables encrypted with customer keys)
    template = synth.cmk
    ids = _table_ids(template)
    worker = _grants_by_resource(template, "WorkerTaskRole")
    keys = {k for k in template.find_resources("AWS::KMS::Key")}
    stream_id = next(iter(template.find_resources("AWS::Kinesis::Stream")))
    table_key = next(k for k in keys if k.startswith("TableKey"))
    stream_key = next(k for k in keys if k.startswith("StreamKey"))
    # THEN the same data-plane permissions, plus the table key (via DynamoDB only) and the stream key (decrypt)
    assert worker[f"table:{ids['leases']}"] == set(p.WORKER_LEASE_ACTIONS)
    assert worker[f"stream:{stream_id}"] == set(p.WORKER_STREAM_ACTIONS)
    assert worker[f"key:{table_key}"] == set(p.TABLE_KEY_ACTIONS)
    assert worker[f"key:{stream_key}"] == {"kms:Decrypt"}
    assert worker["*"] == {"cloudwatch:PutMetricData"}
    key_statements = [
        s for lid, s in _statements(template) if lid.startswith("WorkerTaskRole") and "kms:Encrypt" in _actions(s)
    ]
    assert key_statements
    assert all("kms:ViaService" in s["Condition"]["StringEquals"] for s in key_statements)
    # AND the namespace condition is the construct's namespace
    (put,) = [s for lid, s in _statements(template) if lid.startswith("WorkerTaskRole") and s["Resource"] == "*"]
    assert put["Condition"] == {"StringEquals": {"cloudwatch:namespace": "Payments/Shardlease"}}


def test_given_an_embedded_leader_worker_then_it_also_gets_the_leader_permissions(synth: Synth) -> None:
    template = synth.cmk
    ids = _table_ids(template)
    embedded = _grants_by_resource(template, "EmbeddedRole")
    assert set(p.LEADER_LEASE_ACTIONS) <= embedded[f"table:{ids['leases']}"]
    assert set(p.LEADER_COORDINATOR_ACTIONS) <= embedded[f"table:{ids['state']}"]
    plain = _grants_by_resource(template, "WorkerTaskRole")
    assert "dynamodb:DeleteItem" not in plain[f"table:{ids['leases']}"]


def test_given_a_wildcard_action_when_building_a_permission_then_it_is_refused() -> None:
    with pytest.raises(ValueError, match="wildcard"):
        p.Permission(actions=("dynamodb:*",), resources=("arn:aws:dynamodb:eu-west-1:1:table/x",))


def test_given_the_spark_worker_policy_then_coordinator_writes_are_limited_to_spark_batch_keys(synth: Synth) -> None:
    # GIVEN the Spark worker policy (for EMR roles) and the key format worker_lib.spark writes
    from worker_lib.spark.planning import batch_item_key

    assert batch_item_key("w", "r", 1, "shardId-0").startswith(p.SPARK_BATCH_KEY_PREFIX)
    template = synth.default
    ids = _table_ids(template)
    state_arn = {"Fn::GetAtt": [ids["state"], "Arn"]}
    statements = [s for lid, s in _statements(template) if lid.startswith("CoordinationSparkWorkerPolicy")]
    writes = [s for s in statements if s["Resource"] == state_arn and "dynamodb:PutItem" in _actions(s)]
    # THEN every write to CoordinatorState is conditioned on the spark-batch# leading key (never the lock item)
    assert len(writes) == 1
    assert writes[0]["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["spark-batch#*"]}}
    assert _actions(writes[0]) == set(p.SPARK_BATCH_ACTIONS)
    # AND the plain worker policy has no such write at all
    plain = _grants_by_resource(template, "CoordinationWorkerPolicy")
    assert plain[f"table:{ids['state']}"] == {"dynamodb:DescribeTable", "dynamodb:GetItem"}
