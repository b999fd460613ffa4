"""Dashboard and alarms use the metric names the leader and workers publish (worker_lib.telemetry.names)."""

from __future__ import annotations

import json
from typing import Any

from worker_lib.telemetry.names import DEFAULT_NAMESPACE, LeaderMetric, WorkerMetric

from .conftest import Synth
from .support import APP


def _dashboard_body(synth: Synth) -> str:
    (dashboard,) = synth.default.find_resources("AWS::CloudWatch::Dashboard").values()
    assert dashboard["Properties"]["DashboardName"] == f"shardlease-{APP}"
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    # tokens (Refs to the function, the tables, the region) become placeholders; the rest is the JSON body
    text = "".join(part if isinstance(part, str) else "TOKEN" for part in parts)
    return json.dumps(json.loads(text))  # normalised: one level of escaping


def test_given_the_dashboard_then_it_shows_every_required_view(synth: Synth) -> None:
    body = _dashboard_body(synth)
    # leases, CPU and throughput per worker (SEARCH over {Application, WorkerId})
    for name in (WorkerMetric.LEASES, WorkerMetric.CPU_UTILIZATION, WorkerMetric.THROUGHPUT_KBPS):
        assert f'SEARCH(\'{{{DEFAULT_NAMESPACE},Application,WorkerId}} MetricName=\\"{name}\\" Application' in body
    # moves, cycle time, expired / unassigned leases
    for name in (
        LeaderMetric.LEASE_MOVES,
        LeaderMetric.CYCLE_TIME,
        LeaderMetric.EXPIRED_LEASES,
        LeaderMetric.UNASSIGNED_LEASES,
        LeaderMetric.CYCLES,
    ):
        assert f'"{name}"' in body
    # iterator age, stream throughput, DynamoDB consumed capacity, Lambda errors and duration
    for aws_metric in (
        "GetRecords.IteratorAgeMilliseconds",
        "IncomingBytes",
        "ConsumedReadCapacityUnits",
        "ConsumedWriteCapacityUnits",
        '"Errors"',
        '"Duration"',
    ):
        assert aws_metric in body
    for table in (APP, f"{APP}-WorkerMetricStats", f"{APP}-CoordinatorState"):
        assert f'"label": "{table}"' in body


def _alarms(synth: Synth) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in synth.default.find_resources("AWS::CloudWatch::Alarm").items()}


def test_given_the_no_leader_alarm_then_it_fires_after_n_minutes_without_a_cycle(synth: Synth) -> None:
    (props,) = [p for k, p in _alarms(synth).items() if "NoLeaderCycle" in k]
    assert props["MetricName"] == LeaderMetric.CYCLES
    assert props["Namespace"] == DEFAULT_NAMESPACE
    assert props["Dimensions"] == [{"Name": "Application", "Value": APP}]
    assert props["Statistic"] == "Sum"
    assert props["Period"] == 60
    assert props["ComparisonOperator"] == "LessThanThreshold"
    assert props["Threshold"] == 1
    assert props["EvaluationPeriods"] == props["DatapointsToAlarm"] == 5
    assert props["TreatMissingData"] == "breaching"  # a dead leader publishes nothing


def test_given_the_unassigned_alarm_then_it_needs_leases_stuck_for_every_minute(synth: Synth) -> None:
    (props,) = [p for k, p in _alarms(synth).items() if "LeasesUnassigned" in k]
    metrics = {m["Id"]: m for m in props["Metrics"]}
    assert metrics["expr_1"]["Expression"] == "MAX([FILL(unassigned, 0), FILL(expired, 0)])"
    assert metrics["unassigned"]["MetricStat"]["Metric"]["MetricName"] == LeaderMetric.UNASSIGNED_LEASES
    assert metrics["expired"]["MetricStat"]["Metric"]["MetricName"] == LeaderMetric.EXPIRED_LEASES
    assert metrics["unassigned"]["MetricStat"]["Stat"] == "Minimum"  # stuck for the whole minute, not a blip
    assert props["EvaluationPeriods"] == props["DatapointsToAlarm"] == 5
    assert props["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert props["TreatMissingData"] == "notBreaching"


def test_given_the_leader_errors_alarm_then_it_watches_lambda_errors(synth: Synth) -> None:
    (props,) = [p for k, p in _alarms(synth).items() if "LeaderErrors" in k]
    assert props["Namespace"] == "AWS/Lambda"
    assert props["MetricName"] == "Errors"
    assert props["Threshold"] == 1
    assert props["Period"] == 300


def test_given_the_foreign_owner_alarm_then_it_fires_when_a_non_heartbeating_owner_stays(synth: Synth) -> None:
    # A KCL worker (or one with heartbeats off) cannot judge worker-mode leases: the leader counts such owners
    (props,) = [p for k, p in _alarms(synth).items() if "ForeignLeaseOwner" in k]
    assert props["MetricName"] == LeaderMetric.FOREIGN_OWNERS == "ForeignLeaseOwners"
    assert props["Dimensions"] == [{"Name": "Application", "Value": APP}]
    assert props["Statistic"] == "Minimum"  # present for the whole minute, not one cycle
    assert props["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and props["Threshold"] == 1
    assert props["EvaluationPeriods"] == props["DatapointsToAlarm"] == 5
    assert props["TreatMissingData"] == "notBreaching"


def test_given_the_operator_alarms_then_lag_unrenewed_leases_and_a_foreign_lock_holder_each_have_one(
    synth: Synth,
) -> None:
    alarms = _alarms(synth)
    # a shard more than 5 minutes behind the tip, for 5 minutes (the lag the workers report, max over shards)
    (lag,) = [p for k, p in alarms.items() if "ConsumerLag" in k]
    assert lag["MetricName"] == LeaderMetric.MILLIS_BEHIND_MAX and lag["Statistic"] == "Maximum"
    assert lag["Threshold"] == 300_000 and lag["ComparisonOperator"] == "GreaterThanThreshold"
    # leases renewed by nobody for 5 minutes
    (expired,) = [p for k, p in alarms.items() if "LeasesNotRenewed" in k]
    assert expired["MetricName"] == LeaderMetric.EXPIRED_LEASES and expired["Statistic"] == "Minimum"
    # the leader lock held in the lock client's own format (a KCL worker leads) for 5 minutes
    (foreign,) = [p for k, p in alarms.items() if "ForeignLeaderLock" in k]
    assert foreign["MetricName"] == LeaderMetric.FOREIGN_LOCK_HOLDER and foreign["Threshold"] == 1
    for props in (lag, expired, foreign):
        assert props["EvaluationPeriods"] == props["DatapointsToAlarm"] == 5
        assert props["Dimensions"] == [{"Name": "Application", "Value": APP}]
        assert "docs/operations.md" in props["AlarmDescription"]


def test_given_alarm_actions_then_every_alarm_notifies_them(synth: Synth) -> None:
    # GIVEN the default stack (no topic): no actions
    assert all("AlarmActions" not in p for p in _alarms(synth).values())
