"""Configuration read from the environment: CPU metric choice, shard-sync flags, booleans, regions, worker defaults,
lanes."""

from __future__ import annotations

import dataclasses

import pytest

from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import KinesisRecord
from worker_lib.workermetrics.cpu import ProcessCpu, cpu_metric_from_env


def test_process_cpu_is_the_share_of_host_cpus_used_by_this_process() -> None:
    # GIVEN a process that used 1.5 CPU-seconds in 1 s of wall time on a 4-CPU host
    clock = ManualClock()
    used = iter([10.0, 11.5])
    metric = ProcessCpu(clock=clock, cpus=4, cpu_seconds=lambda: next(used))
    # WHEN it is sampled twice, one second apart
    first = metric.sample()
    clock.advance(1.0)
    second = metric.sample()
    # THEN the first sample is 0 (no baseline) and the second 1.5 / 1 / 4 = 37.5 %
    assert first == 0.0 and second == pytest.approx(37.5)


def test_cpu_metric_selection_by_environment() -> None:
    assert cpu_metric_from_env({"SHARDLEASE_CPU_METRIC": "none"}) is None
    assert isinstance(cpu_metric_from_env({"SHARDLEASE_CPU_METRIC": "process"}), ProcessCpu)
    with pytest.raises(ConfigError, match="SHARDLEASE_CPU_METRIC"):
        cpu_metric_from_env({"SHARDLEASE_CPU_METRIC": "gpu"})


def test_shard_sync_cleanup_flags_come_from_the_environment() -> None:
    from worker_lib.shardsync.config import ShardSyncConfig

    config = ShardSyncConfig.from_env(
        {"SHARDLEASE_LEASE_CLEANUP": "off", "SHARDLEASE_DELETE_UNKNOWN_SHARD_LEASES": "0"}
    )
    assert (config.cleanup_enabled, config.delete_unknown_shard_leases) == (False, False)
    assert ShardSyncConfig.from_env({}).cleanup_enabled
    with pytest.raises(ConfigError, match="SHARDLEASE_LEASE_CLEANUP"):
        ShardSyncConfig.from_env({"SHARDLEASE_LEASE_CLEANUP": "maybe"})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("TRUE", True),
        ("Yes", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("NO", False),
        ("Off", False),
    ],
)
def test_one_boolean_parser_accepts_every_usual_spelling(raw: str, expected: bool) -> None:
    # GIVEN a boolean setting spelt one of the usual ways, in any case
    from worker_lib.core.env import env_bool

    # WHEN it is read THEN it means what it says
    assert env_bool({"SHARDLEASE_X": raw}, "SHARDLEASE_X", not expected) is expected


def test_a_bad_boolean_names_the_variable_and_the_accepted_values() -> None:
    # GIVEN a boolean variable set to something that is not a boolean
    from worker_lib.core.env import env_bool

    # WHEN it is read THEN one line names the variable and lists what is accepted
    with pytest.raises(ConfigError) as err:
        env_bool({"SHARDLEASE_X": "maybe"}, "SHARDLEASE_X", True)
    assert str(err.value) == "SHARDLEASE_X='maybe' is not a boolean: expected 1/0, true/false, yes/no or on/off"


def test_blank_values_mean_the_default_and_bad_numbers_name_the_variable() -> None:
    # GIVEN blank and malformed numeric settings
    from worker_lib.core.env import env_bool, env_float, env_int, env_optional_int

    # WHEN they are read THEN blank is the default, "none"/"0" is no limit, garbage is one clear line
    assert env_int({"N": " "}, "N", 7) == 7 and env_float({}, "F", 0.5) == 0.5 and env_bool({"B": ""}, "B", True)
    assert env_optional_int({"L": "none"}, "L") is None and env_optional_int({"L": "4"}, "L") == 4
    with pytest.raises(ConfigError, match=r"^N='x' is not a whole number$"):
        env_int({"N": "x"}, "N", 1)


def test_every_boolean_setting_uses_the_same_parser() -> None:
    # GIVEN the same spelling given to the shard-sync, assignment and Spark settings
    from worker_lib.assignment.config import AssignmentConfig
    from worker_lib.shardsync.config import ShardSyncConfig
    from worker_lib.spark.options import SourceOptions

    # WHEN "no" and "maybe" are read THEN all three agree on "no" and reject "maybe" the same way
    assert not ShardSyncConfig.from_env({"SHARDLEASE_LEASE_CLEANUP": "no"}).cleanup_enabled
    assert not AssignmentConfig.from_env({"SHARDLEASE_ALLOW_THROUGHPUT_OVERSHOOT": "no"}).allow_throughput_overshoot
    assert not SourceOptions.parse({"app": "orders", "stream": "s", "metrics": "no"}).metrics
    for build in (
        lambda: ShardSyncConfig.from_env({"SHARDLEASE_LEASE_CLEANUP": "maybe"}),
        lambda: AssignmentConfig.from_env({"SHARDLEASE_ALLOW_THROUGHPUT_OVERSHOOT": "maybe"}),
        lambda: SourceOptions.parse({"app": "orders", "stream": "s", "metrics": "maybe"}),
    ):
        with pytest.raises(ConfigError, match="is not a boolean: expected 1/0, true/false, yes/no or on/off"):
            build()


def test_a_worker_config_given_only_app_and_stream_takes_the_rest_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a deployment's environment: region, emulator endpoints, embedded leader, tuned timings
    from worker_lib.worker import WorkerConfig

    for name, value in {
        "AWS_REGION": "eu-west-1",
        "SHARDLEASE_DYNAMODB_ENDPOINT_URL": "http://127.0.0.1:5000",
        "SHARDLEASE_KINESIS_ENDPOINT_URL": "http://127.0.0.1:4567",
        "SHARDLEASE_AWS_MAX_ATTEMPTS": "2",
        "SHARDLEASE_LEADER_MODE": "Embedded",
        "SHARDLEASE_WORKER_ID": "cluster-a/w1",
        "SHARDLEASE_FAILOVER_TIME_MS": "3000",
        "SHARDLEASE_DISCOVERY_INTERVAL_MS": "200",
        "SHARDLEASE_SHUTDOWN_TIMEOUT_MS": "5000",
    }.items():
        monkeypatch.setenv(name, value)
    # WHEN the README's WorkerConfig is built with nothing but the app and the stream
    config = WorkerConfig(app="orders", stream="orders-stream")
    # THEN every setting comes from the environment, as the CLI worker's would
    assert config.aws.region == "eu-west-1" and config.aws.max_attempts == 2
    assert config.aws.endpoint_for("dynamodb") == "http://127.0.0.1:5000"
    assert config.aws.endpoint_for("kinesis") == "http://127.0.0.1:4567"
    assert (config.leader_mode, config.worker_id) == ("embedded", "cluster-a/w1")
    assert (config.lease.failover_time_ms, config.discovery_interval_ms, config.shutdown_timeout_ms) == (
        3000,
        200,
        5000,
    )
    assert config == WorkerConfig.from_env(app="orders", stream="orders-stream")
    # AND an explicit argument still wins over the environment
    assert WorkerConfig(app="orders", stream="orders-stream", leader_mode="none").leader_mode == "none"


def test_a_worker_config_names_one_stream_or_several(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker_lib.worker import WorkerConfig

    monkeypatch.setenv("SHARDLEASE_STREAM", "from-env")
    # GIVEN several streams, by argument or comma-separated in the environment
    listed = WorkerConfig(app="orders", streams=("orders", "clicks"))
    monkeypatch.setenv("SHARDLEASE_STREAM", "orders,clicks")
    from_env = WorkerConfig(app="orders")
    # THEN both are multi-stream and have no default stream; one stream is not, unless told
    for config in (listed, from_env, WorkerConfig.from_env(app="orders")):
        assert (config.streams, config.multi_stream, config.stream) == (("orders", "clicks"), True, "")
    assert WorkerConfig(app="orders", stream="orders").multi_stream is False
    assert WorkerConfig(app="orders", stream="orders", multi_stream=True).stream_selection.multi_stream is True
    assert WorkerConfig.from_env(app="orders", streams=("a",)).streams == ("a",)
    # AND a copy with another field keeps its streams
    assert dataclasses.replace(listed, worker_id="w9").streams == ("orders", "clicks")
    assert dataclasses.replace(WorkerConfig(app="orders", stream="orders"), worker_id="w9").stream == "orders"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"stream": "a", "streams": ("b",)}, "either stream or streams"),
        ({"streams": ("a", "a")}, "named twice"),
        ({"stream": ""}, "needs a stream name"),
    ],
)
def test_a_wrong_stream_setting_is_one_config_error(
    kwargs: dict[str, object], fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker_lib.worker import WorkerConfig

    monkeypatch.delenv("SHARDLEASE_STREAM", raising=False)
    monkeypatch.delenv("SHARDLEASE_STREAM_TRACKER", raising=False)
    with pytest.raises(ConfigError, match=fragment):
        WorkerConfig(app="orders", **kwargs)  # type: ignore[arg-type]


def test_the_cli_takes_stream_repeated_for_a_multi_stream_application() -> None:
    from worker_lib.cli.main import _streams, build_parser

    args = build_parser().parse_args(
        ["leader", "--app", "orders", "--stream", "orders", "--stream", "clicks", "--once"]
    )
    assert _streams(args).names == ("orders", "clicks") and _streams(args).multi_stream is True
    one = build_parser().parse_args(["leader", "--app", "orders", "--stream", "orders", "--multi-stream"])
    assert _streams(one).multi_stream is True


def test_without_settings_the_region_is_aws_default_region_then_us_east_1(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN only AWS_DEFAULT_REGION, then nothing at all
    from worker_lib.core.config import AwsConfig

    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    # WHEN the AWS settings are read THEN AWS_DEFAULT_REGION is honoured, and us-east-1 is the last resort
    assert AwsConfig.from_env().region == "ap-south-1"
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert AwsConfig.from_env().region == "us-east-1"


def test_spark_options_default_to_the_environment_and_override_it() -> None:
    # GIVEN an environment naming a region and a DynamoDB endpoint
    from worker_lib.spark.options import SourceOptions

    env = {"AWS_REGION": "eu-west-1", "SHARDLEASE_DYNAMODB_ENDPOINT_URL": "http://127.0.0.1:5000"}
    # WHEN the source is configured with and without its own region option
    implicit = SourceOptions.parse({"app": "orders", "stream": "s"}, env)
    explicit = SourceOptions.parse({"app": "orders", "stream": "s", "region": "us-west-2"}, env)
    # THEN the environment fills what the options leave out, and an option wins
    assert (implicit.aws.region, implicit.aws.endpoint_for("dynamodb")) == ("eu-west-1", "http://127.0.0.1:5000")
    assert explicit.aws.region == "us-west-2"


@pytest.mark.parametrize("region", ["mars 1", "eu_west_1!", "-eu-west-1"])
def test_a_bad_region_is_one_config_error_wherever_it_comes_from(region: str) -> None:
    # GIVEN a region botocore would reject with its own InvalidRegionError
    from worker_lib.core.config import AwsConfig
    from worker_lib.worker import WorkerConfig

    # WHEN it is given directly, through AWS_REGION, or to a worker that reads the environment
    # THEN each is one ConfigError naming the value, before any client exists
    with pytest.raises(ConfigError, match="invalid region"):
        AwsConfig(region=region)
    with pytest.raises(ConfigError, match="invalid region"):
        AwsConfig.from_env({"AWS_REGION": region})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_REGION", region)
        with pytest.raises(ConfigError, match="invalid region"):
            WorkerConfig(app="orders", stream="orders-stream")


def test_the_cli_leader_takes_shard_sync_settings_from_the_environment_and_flags_replace_the_position() -> None:
    # GIVEN shard-sync variables in the environment
    import argparse

    from worker_lib.cli.main import _shard_sync_config
    from worker_lib.core.config import InitialPosition

    env = {
        "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
        "SHARDLEASE_SHARD_SYNC_INTERVAL_MS": "30000",
        "SHARDLEASE_LEASE_CLEANUP": "off",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        # WHEN the command line gives no position THEN every setting is the environment's
        from_env = _shard_sync_config(argparse.Namespace(initial_position=None, timestamp=None))
        # WHEN it gives one THEN only the position changes
        flagged = _shard_sync_config(
            argparse.Namespace(initial_position="AT_TIMESTAMP", timestamp="2026-01-31T12:00:00Z")
        )
    assert (from_env.initial_position, from_env.interval_ms, from_env.cleanup_enabled) == (
        InitialPosition.TRIM_HORIZON,
        30_000,
        False,
    )
    assert (flagged.initial_position, flagged.interval_ms, flagged.cleanup_enabled) == (
        InitialPosition.AT_TIMESTAMP,
        30_000,
        False,
    )
    assert flagged.initial_timestamp is not None


def test_a_worker_config_carries_its_embedded_leaders_settings_from_the_one_environment_it_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a process environment, and another mapping with the leader's settings
    from worker_lib.core.config import InitialPosition
    from worker_lib.worker import WorkerConfig
    from worker_lib.workermetrics.config import WorkerMetricsConfig

    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("SHARDLEASE_LEADER_CYCLE_INTERVAL_MS", "9000")
    env = {
        "SHARDLEASE_STREAM": "orders-stream",
        "AWS_REGION": "ap-south-1",
        "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON",
        "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS": "500",
        "SHARDLEASE_LEADER_LOCK_DURATION_MS": "3000",
        "SHARDLEASE_LEADER_HEARTBEAT_MS": "1000",
        "SHARDLEASE_MAX_CLOCK_SKEW_MS": "500",
        "SHARDLEASE_ASSIGNMENT_STRATEGY": "count",
        "SHARDLEASE_SCALING_MIN_WORKERS": "2",
    }
    # WHEN a worker's configuration is read from that mapping, with its own report interval
    config = WorkerConfig.from_env(env, app="orders", worker_metrics=WorkerMetricsConfig(report_interval_ms=1_000))
    # THEN every setting comes from the mapping alone, the embedded leader's included
    assert (config.stream, config.aws.region, config.leader.cycle_interval_ms) == ("orders-stream", "ap-south-1", 500)
    assert (config.leader_lock.lease_duration_ms, config.leader_lock.heartbeat_interval_ms) == (3000, 1000)
    assert (config.assignment.strategy, config.scaling.min_workers) == ("count", 2)
    assert config.shard_sync.initial_position is config.initial_position is InitialPosition.TRIM_HORIZON
    # AND the leader judges the workers' reports by the interval this worker reports at
    assert config.assignment.worker_report_interval_s == 1.0
    # AND a position given to the worker is its embedded leader's too
    given = WorkerConfig(app="orders", initial_position=InitialPosition.LATEST, environment=env)
    assert given.shard_sync.initial_position is InitialPosition.LATEST and given.shard_sync.interval_ms == 60_000


def customer_of(record: KinesisRecord) -> str:
    """A lane key function named by ``SHARDLEASE_LANE_KEY`` in the test below: the customer before the first '/'."""
    return record.partition_key.split("/", 1)[0]


def test_the_consumer_reads_its_lane_settings_from_the_environment() -> None:
    # GIVEN every lane variable set, the lane key a function named module:attr
    from worker_lib.processing.config import ConsumerConfig

    env = {
        "SHARDLEASE_PARALLELISM": "8",
        "SHARDLEASE_LANE_KEY": "tests.unit.test_config_env:customer_of",
        "SHARDLEASE_MAX_RECORDS_IN_FLIGHT": "500",
        "SHARDLEASE_LANE_CHECKPOINT_INTERVAL_MS": "250",
        "SHARDLEASE_LANE_DRAIN_TIMEOUT_MS": "4000",
    }
    # WHEN the consumer's settings are read
    config = ConsumerConfig.from_env(env)
    # THEN each is the variable's, and the lane key is the function it names
    assert (config.parallelism, config.max_records_in_flight) == (8, 500)
    assert (config.lane_checkpoint_interval_ms, config.lane_drain_timeout_ms) == (250, 4000)
    record = KinesisRecord(data=b"", partition_key="c42/order-7", sequence_number="1", explicit_hash_key="99")
    assert config.key_of is customer_of and config.key_of(record) == "c42"
    # AND the named keys pick the record's field; left out, it is one lane per shard by partition key
    assert ConsumerConfig.from_env({"SHARDLEASE_LANE_KEY": "Explicit-Hash-Key"}).key_of(record) == "99"
    default = ConsumerConfig.from_env({})
    assert (default.parallelism, default.key_of(record), default.max_records_in_flight) == (1, "c42/order-7", 10_000)
    assert (default.lane_checkpoint_interval_ms, default.lane_drain_timeout_ms) == (1_000, 10_000)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SHARDLEASE_PARALLELISM", "0", "parallelism=0 must be within 1..256"),
        ("SHARDLEASE_PARALLELISM", "257", "parallelism=257 must be within 1..256"),
        ("SHARDLEASE_PARALLELISM", "x", "SHARDLEASE_PARALLELISM='x' is not a whole number"),
        (
            "SHARDLEASE_LANE_KEY",
            "nope",
            "invalid lane key 'nope': expected partition-key, explicit-hash-key or a function module:attr",
        ),
        ("SHARDLEASE_LANE_KEY", "no.such.module:f", "invalid lane key 'no.such.module:f': no module named 'no'"),
        ("SHARDLEASE_MAX_RECORDS_IN_FLIGHT", "0", "max_records_in_flight must be positive"),
        ("SHARDLEASE_LANE_DRAIN_TIMEOUT_MS", "-1", "lane_drain_timeout_ms must not be negative"),
    ],
)
def test_a_bad_lane_setting_is_one_config_error_line(name: str, value: str, message: str) -> None:
    from worker_lib.processing.config import ConsumerConfig

    # GIVEN one lane variable that cannot work WHEN the consumer's settings are read THEN one line says why
    with pytest.raises(ConfigError) as err:
        ConsumerConfig.from_env({name: value})
    assert str(err.value) == message


def test_a_worker_configs_parallelism_is_short_for_its_consumers() -> None:
    # GIVEN an environment with consumer settings, lanes among them
    from worker_lib.processing.config import ConsumerConfig
    from worker_lib.worker import WorkerConfig

    env = {"SHARDLEASE_PARALLELISM": "2", "SHARDLEASE_MAX_RECORDS_IN_FLIGHT": "300"}
    # WHEN a worker is configured with parallelism, beside the environment or beside its own consumer settings
    from_env = WorkerConfig(app="orders", stream="s", parallelism=8, environment=env)
    given = WorkerConfig(
        app="orders", stream="s", consumer=ConsumerConfig(error_backoff_ms=5), parallelism=16, environment=env
    )
    # THEN the consumer has that parallelism, and every other setting of its own
    assert (from_env.consumer.parallelism, from_env.consumer.max_records_in_flight) == (8, 300)
    assert (given.consumer.parallelism, given.consumer.error_backoff_ms) == (16, 5)
    # AND left out, the consumer's setting stands; a copy keeps it
    assert WorkerConfig(app="orders", stream="s", environment=env).consumer.parallelism == 2
    assert dataclasses.replace(from_env, worker_id="w9").consumer.parallelism == 8
    # AND a value out of range is the consumer's one-line error
    for bad in (0, 257):
        with pytest.raises(ConfigError) as err:
            WorkerConfig(app="orders", stream="s", parallelism=bad, environment=env)
        assert str(err.value) == f"parallelism={bad} must be within 1..256"
