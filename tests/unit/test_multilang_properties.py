"""A MultiLangDaemon properties file, read as KCL reads it: every key honoured or named once, nothing silent."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker_lib.core.errors import ConfigError
from worker_lib.multilang.daemon import MultiLangOverrides, effective_settings
from worker_lib.multilang.properties import HONOURED, NOT_USED, parse_properties, read_properties

PATH = Path("/apps/orders/orders.properties")

# A file of the shape of kclpy's and aws-kcl's sample files (their active keys), with some commented-out ones.
SAMPLE_LIKE = """\
# The script that abides by the multi-language protocol.
executableName = sample_kclpy_app.py
streamArn = arn:aws:kinesis:eu-west-1:123456789012:stream/orders
streamName = ignored-when-the-arn-is-set
applicationName = OrdersApp
AwsCredentialsProvider = DefaultCredentialsProvider
processingLanguage = python/3.8
initialPositionInStream = TRIM_HORIZON
regionName = us-east-1
#failoverTimeMillis = 10000
! maxRecords = 5
"""


def test_java_properties_syntax() -> None:
    text = (
        "a=1\n"
        "b : two words  \n"
        "c three\n"
        "  # a comment\n"
        "! another\n"
        "d = first \\\n"
        "    second\n"
        "e\\ key = x\n"
        "f = caf\\u00e9\\tend\n"
        "g\n"
        "a = 2\n"
    )
    assert parse_properties(text) == {
        "a": "2",
        "b": "two words  ",
        "c": "three",
        "d": "first second",
        "e key": "x",
        "f": "café\tend",
        "g": "",
    }


def test_a_sample_like_file_is_honoured_and_each_java_only_key_is_named_once() -> None:
    # GIVEN a file shaped like kclpy's sample  WHEN it is read
    props = read_properties(PATH, SAMPLE_LIKE)
    # THEN the child, the application and the stream are the file's (the ARN wins, as in KCL)
    assert props.executable == ("sample_kclpy_app.py",)
    assert props.directory == PATH.parent
    assert (props.app, props.stream, props.worker_id) == ("OrdersApp", "orders", None)
    # AND regionName wins over the ARN's region (KCL configures its clients from regionName)
    assert props.settings == {"AWS_REGION": "us-east-1", "SHARDLEASE_INITIAL_POSITION": "TRIM_HORIZON"}
    # AND the keys only the Java daemon uses are each named in one warning line; commented keys are not
    assert len(props.warnings) == 2
    assert any("AwsCredentialsProvider is not used" in w and "boto3" in w for w in props.warnings)
    assert any("processingLanguage is not used" in w for w in props.warnings)
    assert props.response_timeout_s is None


def test_every_honoured_key_sets_its_variable() -> None:
    values = {
        "regionName": "eu-central-1",
        "failoverTimeMillis": "20000",
        "maxRecords": "500",
        "idleTimeBetweenReadsInMillis": "250",
        "callProcessRecordsEvenForEmptyRecordList": "true",
        "parentShardPollIntervalMillis": "5000",
        "shardSyncIntervalMillis": "30000",
        "cleanupLeasesUponShardCompletion": "false",
        "gracefulLeaseHandoffTimeoutMillis": "15000",
        "isGracefulLeaseHandoffEnabled": "false",
        "maxLeasesForWorker": "8",
        "maxThroughputPerHostKBps": "2048",
        "dampeningPercentage": "50",
        "reBalanceThresholdPercentage": "20",
        "allowThroughputOvershoot": "false",
        "varianceBalancingFrequency": "5",
        "workerMetricsEMAAlpha": "0.3",
        "workerMetricsReporterFreqInMillis": "10000",
        "inMemoryWorkerMetricsCaptureFrequencyMillis": "2000",
        "noOfPersistedMetricsPerWorkerMetrics": "5",
        "leaseAssignmentIntervalMillis": "4000",
        "retrievalMode": "fanout",
        "fanoutConfig.consumerName": "orders-consumer",
        "fanoutConfig.consumerArn": "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/c:1",
        "kinesisEndpoint": "http://127.0.0.1:4567",
        "dynamoDBEndpoint": "http://127.0.0.1:4568",
        "cloudWatchEndpoint": "http://127.0.0.1:4569",
    }
    assert set(values) == set(HONOURED)  # a new honoured key gets a line here
    text = "executableName = app.py\nstreamName = s\napplicationName = app\n" + "".join(
        f"{key} = {value}\n" for key, value in values.items()
    )
    props = read_properties(PATH, text)
    assert props.warnings == ()
    for key, value in values.items():
        expected = {"true": "true", "false": "false", "fanout": "fanout"}.get(value, value)
        assert props.settings[HONOURED[key].variable] == expected, key


@pytest.mark.parametrize(("given", "mode"), [("FANOUT", "fanout"), ("polling", "polling"), ("DEFAULT", "polling")])
def test_retrieval_mode(given: str, mode: str) -> None:
    # KCL's DEFAULT is fan-out when no polling key is set; ours polls unless fan-out is asked for (it is billed)
    text = f"executableName = a\nstreamName = s\napplicationName = app\nretrievalMode = {given}\n"
    assert read_properties(PATH, text).settings["SHARDLEASE_RETRIEVAL"] == mode


def test_the_polling_prefix_is_read_too() -> None:
    text = "executableName = a\nstreamName = s\napplicationName = app\npollingConfig.maxRecords = 100\n"
    assert read_properties(PATH, text).settings["SHARDLEASE_MAX_RECORDS"] == "100"


def test_kcl_takes_a_default_valued_false_as_unset_we_honour_it() -> None:
    # KCL skips a value equal to Java's default (false), so cleanupLeasesUponShardCompletion=false does nothing there
    text = "executableName = a\nstreamName = s\napplicationName = app\ncleanupLeasesUponShardCompletion = false\n"
    assert read_properties(PATH, text).settings["SHARDLEASE_LEASE_CLEANUP"] == "false"


def test_an_unknown_key_is_named_as_a_probable_typo() -> None:
    text = "executableName = a\nstreamName = s\napplicationName = app\nfailoverTimeMilis = 5\n"
    (warning,) = read_properties(PATH, text).warnings
    assert "failoverTimeMilis is not a key" in warning and "typo" in warning


@pytest.mark.parametrize("key", sorted(NOT_USED))
def test_each_unused_key_says_why(key: str) -> None:
    text = f"executableName = a\nstreamName = s\napplicationName = app\n{key} = x\n"
    (warning,) = read_properties(PATH, text).warnings
    assert warning.startswith(f"orders.properties: {key} is not used by shardlease: ")
    assert len(warning.split(": ", 2)[2]) > 10


def test_initial_position_at_a_timestamp() -> None:
    text = "executableName = a\nstreamName = s\napplicationName = app\ninitialPositionInStreamExtended = 1636609142\n"
    settings = read_properties(PATH, text).settings
    assert settings["SHARDLEASE_INITIAL_POSITION"] == "AT_TIMESTAMP"
    assert settings["SHARDLEASE_INITIAL_TIMESTAMP"] == "2021-11-11T05:39:02+00:00"


def test_timeout_in_seconds() -> None:
    text = "executableName = a\nstreamName = s\napplicationName = app\ntimeoutInSeconds = 30\n"
    assert read_properties(PATH, text).response_timeout_s == 30.0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("streamName = s\napplicationName = app\n", "executableName is required"),
        ("executableName = a\napplicationName = app\n", "streamName or streamArn is required"),
        ("executableName = a\nstreamName = s\n", "applicationName is required"),
        ("executableName = a\nstreamArn = arn:aws:s3:::bucket\napplicationName = app\n", "not a Kinesis stream ARN"),
        ("executableName = a\nstreamName = s\napplicationName = app\nmaxRecords = many\n", "maxRecords='many'"),
        ("executableName = a\nstreamName = s\napplicationName = app\nfailoverTimeMillis = -1\n", "at least 1"),
        ("executableName = a\nstreamName = s\napplicationName = app\ntableName = other\n", "differs from 'app'"),
        (
            "executableName = a\nstreamName = s\napplicationName = app\nworkerMetricsTableName = x\n",
            "differs from 'app-WorkerMetricStats'",
        ),
        ("executableName = a\nstreamName = s\napplicationName = app\ninitialPositionInStream = EARLY\n", "EARLY"),
        (
            "executableName = a\nstreamName = s\napplicationName = app\ninitialPositionInStream = AT_TIMESTAMP\n",
            "needs initialPositionInStreamExtended",
        ),
        (
            "executableName = a\nstreamName = s\napplicationName = app\n"
            "callProcessRecordsEvenForEmptyRecordList = maybe\n",
            "not a boolean",
        ),
    ],
)
def test_what_cannot_work_is_one_line_naming_the_key(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_properties(PATH, text)
    message = str(caught.value)
    assert fragment in message and "\n" not in message


def test_the_file_wins_over_the_environment_and_the_flags_over_the_file() -> None:
    # GIVEN a file that sets the failover time and a region, and an environment that sets both differently
    text = (
        "executableName = a\nstreamName = s\napplicationName = app\n"
        "failoverTimeMillis = 20000\nregionName = eu-west-1\n"
    )
    props = read_properties(PATH, text)
    environment = {
        "SHARDLEASE_FAILOVER_TIME_MS": "3000",
        "AWS_REGION": "us-east-1",
        "SHARDLEASE_LIVENESS_MODE": "worker",
    }
    # WHEN the region is also given as a flag
    settings, replaced = effective_settings(props, MultiLangOverrides(region="ap-south-1"), environment)
    # THEN the flag wins, then the file; each value of the environment it replaces is named
    assert settings["AWS_REGION"] == "ap-south-1"
    assert settings["SHARDLEASE_FAILOVER_TIME_MS"] == "20000"
    assert len(replaced) == 2 and any("SHARDLEASE_FAILOVER_TIME_MS=20000" in line for line in replaced)
    # AND settings the file cannot express stay the environment's; the daemon leads unless told otherwise
    assert "SHARDLEASE_LIVENESS_MODE" not in settings
    assert settings["SHARDLEASE_LEADER_MODE"] == "embedded"
    settings, _ = effective_settings(props, MultiLangOverrides(), {"SHARDLEASE_LEADER_MODE": "none"})
    assert "SHARDLEASE_LEADER_MODE" not in settings


def test_the_endpoint_flag_replaces_every_per_service_endpoint() -> None:
    # GIVEN a file with a Kinesis endpoint and an environment with a DynamoDB one
    text = "executableName = a\nstreamName = s\napplicationName = app\nkinesisEndpoint = http://127.0.0.1:1\n"
    props = read_properties(PATH, text)
    environment = {"SHARDLEASE_DYNAMODB_ENDPOINT_URL": "http://127.0.0.1:2"}
    # WHEN --endpoint-url is given
    settings, replaced = effective_settings(props, MultiLangOverrides(endpoint_url="http://127.0.0.1:9"), environment)
    # THEN it is the endpoint of every service, and the line says the command line replaced the environment's
    assert settings["SHARDLEASE_ENDPOINT_URL"] == "http://127.0.0.1:9"
    for service in ("KINESIS", "DYNAMODB", "CLOUDWATCH"):
        assert settings[f"SHARDLEASE_{service}_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert replaced == [
        "SHARDLEASE_DYNAMODB_ENDPOINT_URL=http://127.0.0.1:9 from the command line replaces the environment's "
        "http://127.0.0.1:2"
    ]
