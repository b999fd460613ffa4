"""A KCL MultiLangDaemon properties file, read as KCL reads it, turned into shardlease settings (pure: no I/O).

Every key of KCL 3.x's MultiLangDaemon configuration is either **honoured** — it becomes the shardlease setting
(an environment variable of docs/api.md) that does the same thing — or **not used here**, and then named once in
a warning line that says why or what replaces it (:data:`NOT_USED`). A key KCL does not know is named too, as a
probable typo. docs/multilang.md lists both tables.

The file's settings win over the same variables in the environment (the file is the application's configuration;
each such override is named in a warning); the command line's flags win over the file. Settings the file cannot
express (liveness mode, leader mode, ...) keep coming from the environment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from worker_lib.core.config import InitialPosition
from worker_lib.core.env import parse_bool
from worker_lib.core.errors import ConfigError
from worker_lib.tables.schema import coordinator_state_table_name, lease_table_name, worker_metrics_table_name

# --- Java's .properties format -----------------------------------------------------------------------------------

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> dict[str, str]:
    """``java.util.Properties.load``: ``#``/``!`` comments, ``key = value``, ``key: value`` or ``key value``,
    backslash line continuations, ``\\t \\n \\uXXXX`` escapes; the last of repeated keys wins."""
    result: dict[str, str] = {}
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index].lstrip(" \t\f")
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and index < len(lines):  # an odd number of trailing backslashes joins the next line
            line = line[:-1] + lines[index].lstrip(" \t\f")
            index += 1
        if _continues(line):
            line = line[:-1]
        key, value = _split_entry(line)
        result[_unescape(key)] = _unescape(value)
    return result


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    """The key ends at the first unescaped ``=``, ``:`` or blank; one ``=``/``:`` after blanks still separates."""
    escaped = False
    for position, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "=:":
            return line[:position], line[position + 1 :].lstrip(" \t\f")
        elif char in " \t\f":
            rest = line[position:].lstrip(" \t\f")
            if rest[:1] in ("=", ":"):
                rest = rest[1:].lstrip(" \t\f")
            return line[:position], rest
    return line, ""


def _unescape(text: str) -> str:
    out: list[str] = []
    chars = iter(range(len(text)))
    for position in chars:
        char = text[position]
        if char != "\\" or position + 1 >= len(text):
            out.append(char)
            continue
        following = text[position + 1]
        next(chars, None)
        if following == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[position + 2 : position + 6]):
            out.append(chr(int(text[position + 2 : position + 6], 16)))
            for _ in range(4):
                next(chars, None)
        else:
            out.append(_ESCAPES.get(following, following))
    return "".join(out)


# --- the keys ----------------------------------------------------------------------------------------------------


Convert = Callable[[str, str], str]
"""``convert(key, raw)``: the variable's value for the key's raw value; a :class:`ConfigError` naming the key."""


def _whole(minimum: int) -> Convert:
    def convert(key: str, raw: str) -> str:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{key}={raw!r} is not a whole number") from None
        if value < minimum:
            raise ConfigError(f"{key}={raw!r} must be at least {minimum}")
        return str(value)

    return convert


_COUNT, _POSITIVE = _whole(0), _whole(1)


def _boolean(key: str, raw: str) -> str:
    return "true" if parse_bool(raw, name=key, default=False) else "false"


def _text(key: str, raw: str) -> str:
    return raw.strip()


def _retrieval_mode(key: str, raw: str) -> str:
    value = raw.strip().upper()
    if value not in ("FANOUT", "POLLING", "DEFAULT"):
        raise ConfigError(f"{key}={raw!r}: expected FANOUT, POLLING or DEFAULT")
    # KCL's DEFAULT is fan-out unless a polling key is set; shardlease polls unless fan-out is asked for, because
    # fan-out is billed per consumer-shard-hour (docs/fanout.md).
    return "fanout" if value == "FANOUT" else "polling"


@dataclass(frozen=True)
class Honoured:
    """A key that becomes ``variable`` (after ``convert`` checks and normalises the value)."""

    variable: str
    convert: Convert
    meaning: str


HONOURED: dict[str, Honoured] = {
    "regionName": Honoured("AWS_REGION", _text, "the AWS region"),
    "failoverTimeMillis": Honoured("SHARDLEASE_FAILOVER_TIME_MS", _POSITIVE, "the lease duration"),
    "maxRecords": Honoured("SHARDLEASE_MAX_RECORDS", _POSITIVE, "GetRecords Limit"),
    "idleTimeBetweenReadsInMillis": Honoured(
        "SHARDLEASE_IDLE_TIME_BETWEEN_READS_MS", _COUNT, "the wait after a read at the tip of the shard"
    ),
    "callProcessRecordsEvenForEmptyRecordList": Honoured(
        "SHARDLEASE_DELIVER_EMPTY_BATCHES", _boolean, "processRecords also for a read that returned nothing"
    ),
    "parentShardPollIntervalMillis": Honoured(
        "SHARDLEASE_PARENT_POLL_INTERVAL_MS", _POSITIVE, "how often a child shard checks whether its parents ended"
    ),
    "shardSyncIntervalMillis": Honoured(
        "SHARDLEASE_SHARD_SYNC_INTERVAL_MS", _POSITIVE, "the leader's shard sync interval"
    ),
    "cleanupLeasesUponShardCompletion": Honoured(
        "SHARDLEASE_LEASE_CLEANUP", _boolean, "delete the leases of finished shards"
    ),
    "gracefulLeaseHandoffTimeoutMillis": Honoured(
        "SHARDLEASE_GRACEFUL_HANDOFF_TIMEOUT_MS", _COUNT, "how long a graceful hand-off may take before it is forced"
    ),
    "maxLeasesForWorker": Honoured("SHARDLEASE_MAX_LEASES_FOR_WORKER", _POSITIVE, "the lease cap of one worker"),
    "maxThroughputPerHostKBps": Honoured(
        "SHARDLEASE_MAX_THROUGHPUT_PER_HOST_KBPS", _POSITIVE, "the throughput cap of one worker"
    ),
    "dampeningPercentage": Honoured("SHARDLEASE_DAMPENING_PCT", _POSITIVE, "how much load one rebalance moves"),
    "reBalanceThresholdPercentage": Honoured(
        "SHARDLEASE_REBALANCE_THRESHOLD_PCT", _POSITIVE, "the utilisation band that triggers a rebalance"
    ),
    "allowThroughputOvershoot": Honoured(
        "SHARDLEASE_ALLOW_THROUGHPUT_OVERSHOOT", _boolean, "move one lease even if it overshoots"
    ),
    "varianceBalancingFrequency": Honoured(
        "SHARDLEASE_BALANCING_FREQUENCY", _POSITIVE, "rebalance every n-th assignment cycle"
    ),
    "workerMetricsEMAAlpha": Honoured("SHARDLEASE_WORKER_METRICS_EMA_ALPHA", _text, "the worker metrics' EMA"),
    "workerMetricsReporterFreqInMillis": Honoured(
        "SHARDLEASE_WORKER_METRICS_REPORT_INTERVAL_MS", _POSITIVE, "how often a worker reports its metrics"
    ),
    "inMemoryWorkerMetricsCaptureFrequencyMillis": Honoured(
        "SHARDLEASE_WORKER_METRICS_SAMPLE_INTERVAL_MS", _POSITIVE, "how often the worker samples its CPU"
    ),
    "noOfPersistedMetricsPerWorkerMetrics": Honoured(
        "SHARDLEASE_WORKER_METRICS_MAX_VALUES", _POSITIVE, "how many values of each metric the report keeps"
    ),
    "isGracefulLeaseHandoffEnabled": Honoured(
        "SHARDLEASE_GRACEFUL_HANDOFF", _boolean, "whether a rebalancing move lets the old owner checkpoint first"
    ),
    "leaseAssignmentIntervalMillis": Honoured(
        "SHARDLEASE_LEADER_CYCLE_INTERVAL_MS", _POSITIVE, "the leader's assignment cycle (20 000 by default)"
    ),
    "retrievalMode": Honoured(
        "SHARDLEASE_RETRIEVAL",
        _retrieval_mode,
        "FANOUT: enhanced fan-out; POLLING: GetRecords (DEFAULT and no key: polling, docs/fanout.md)",
    ),
    "fanoutConfig.consumerName": Honoured(
        "SHARDLEASE_FANOUT_CONSUMER_NAME", _text, "the fan-out consumer's name (default: applicationName)"
    ),
    "fanoutConfig.consumerArn": Honoured(
        "SHARDLEASE_FANOUT_CONSUMER_ARN", _text, "a fan-out consumer created beforehand, used as it is"
    ),
    "kinesisEndpoint": Honoured("SHARDLEASE_KINESIS_ENDPOINT_URL", _text, "the Kinesis endpoint (local use)"),
    "dynamoDBEndpoint": Honoured("SHARDLEASE_DYNAMODB_ENDPOINT_URL", _text, "the DynamoDB endpoint (local use)"),
    "cloudWatchEndpoint": Honoured("SHARDLEASE_CLOUDWATCH_ENDPOINT_URL", _text, "the CloudWatch endpoint (local use)"),
}

# Keys read in code: what the daemon itself needs.
READ_HERE = {
    "executableName": "the child's command, run in the properties file's directory",
    "streamName": "the stream",
    "streamArn": "the stream (wins over streamName, as in KCL); its region too, unless regionName is set",
    "applicationName": "the application: the lease table's name",
    "workerId": "this worker's id (leaseOwner)",
    "initialPositionInStream": "where new leases start: TRIM_HORIZON, LATEST or AT_TIMESTAMP",
    "initialPositionInStreamExtended": "AT_TIMESTAMP from this time (epoch seconds, as KCL reads it)",
    "timeoutInSeconds": "how long a child may take to answer one message before it is killed",
    "tableName": "must be the application name (shardlease's lease table is named after the application)",
    "coordinatorStateTableName": "must be <applicationName>-CoordinatorState",
    "workerMetricsTableName": "must be <applicationName>-WorkerMetricStats",
    "disableWorkerMetrics": "true: balance by throughput only (no CPU reports)",
}

_CREDENTIALS = (
    "credentials come from boto3's chain (environment, profile, container or instance role); no Java provider"
)
_JVM = "a setting of the Java daemon's internals with no counterpart here"
_TABLE_CREATION = (
    "missing tables are created on demand with KCL's defaults; for other settings create them with "
    "`shardlease create-tables` or the CDK stack (docs/deploy.md)"
)
_METRICS = "metrics: SHARDLEASE_METRICS (off, emf, cloudwatch) and SHARDLEASE_METRICS_FLUSH_INTERVAL_MS"

NOT_USED: dict[str, str] = {
    "AwsCredentialsProvider": _CREDENTIALS,
    "AwsCredentialsProviderDynamoDB": _CREDENTIALS,
    "AwsCredentialsProviderCloudWatch": _CREDENTIALS,
    "AWSCredentialsProvider": _CREDENTIALS,
    "AWSCredentialsProviderDynamoDB": _CREDENTIALS,
    "AWSCredentialsProviderCloudWatch": _CREDENTIALS,
    "processingLanguage": "only KCL's user agent",
    "maxActiveThreads": "one thread per held lease, as KCL's default cached pool",
    "taskBackoffTimeMillis": (
        "a failed child gives its lease back at once and the next child starts from the last checkpoint"
    ),
    "metricsBufferTimeMillis": _METRICS,
    "metricsMaxQueueSize": _METRICS,
    "metricsLevel": _METRICS,
    "metricsEnabledDimensions": _METRICS,
    "validateSequenceNumberBeforeCheckpointing": (
        "a checkpoint is always checked against the records delivered, without a call to Kinesis"
    ),
    "clientVersionConfig": "shardlease runs KCL 3.x's protocol; KCL 2.x tables are adopted as they are",
    "maxLeasesToStealAtOneTime": "the leader moves leases by measured load (KCL 3.x), nothing is stolen",
    "initialLeaseTableReadCapacity": _TABLE_CREATION,
    "initialLeaseTableWriteCapacity": _TABLE_CREATION,
    "coordinatorStateBillingMode": _TABLE_CREATION,
    "coordinatorStateReadCapacity": _TABLE_CREATION,
    "coordinatorStateWriteCapacity": _TABLE_CREATION,
    "coordinatorStatePointInTimeRecoveryEnabled": _TABLE_CREATION,
    "coordinatorStateDeletionProtectionEnabled": _TABLE_CREATION,
    "coordinatorStateTags": _TABLE_CREATION,
    "workerMetricsBillingMode": _TABLE_CREATION,
    "workerMetricsReadCapacity": _TABLE_CREATION,
    "workerMetricsWriteCapacity": _TABLE_CREATION,
    "workerMetricsPointInTimeRecoveryEnabled": _TABLE_CREATION,
    "workerMetricsDeletionProtectionEnabled": _TABLE_CREATION,
    "workerMetricsTags": _TABLE_CREATION,
    "staleWorkerMetricsEntryCleanupDuration": "the leader removes a stopped worker's metrics with its heartbeat",
    "shardPrioritization": _JVM,
    "shutdownGraceMillis": "SIGTERM asks every child to checkpoint; SHARDLEASE_SHUTDOWN_TIMEOUT_MS bounds the wait",
    "skipShardSyncAtWorkerInitializationIfLeasesExist": "workers never sync shards: the leader does",
    "listShardsBackoffTimeInMillis": _JVM,
    "maxListShardsRetryAttempts": _JVM,
    "maxGetRecordsThreadPool": _JVM,
    "retryGetRecordsInSeconds": _JVM,
    "maxCacheByteSize": _JVM,
    "maxPendingProcessRecordsInput": _JVM,
    "maxRecordsCount": _JVM,
    "idleMillisBetweenCalls": _JVM,
    "logWarningForTaskAfterMillis": _JVM,
    "listShardsCacheAllowedAgeInSeconds": _JVM,
    "cacheMissWarningModulus": _JVM,
    "userAgentPrefix": "only KCL's user agent",
    "billingMode": _TABLE_CREATION,
    "leaseTableDeletionProtectionEnabled": _TABLE_CREATION,
    "leaseTablePitrEnabled": _TABLE_CREATION,
    "ignoreUnexpectedChildShards": "children of unknown parents are always taken (the leader creates their leases)",
    "maxLeaseRenewalThreads": "renewals are one batch per interval on the lease keeper's thread",
    "leaseTableScanTotalSegments": "workers read their leases by the owner index, never by scan",
    "enablePriorityLeaseAssignment": "the leader always assigns expired and unassigned leases first",
    "schedulerInitializationBackoffTimeMillis": "startup retries: SHARDLEASE_STARTUP_TIMEOUT_MS",
    "migrateAllEntitiesToLeaseTable": "the table layout: SHARDLEASE_TABLE_LAYOUT (docs/kcl-compatibility.md)",
    "tableMigrationCompleteBakeTimeSeconds": "the table layout: SHARDLEASE_TABLE_LAYOUT (docs/kcl-compatibility.md)",
    "millisBehindLatestThresholdForReducedTps": _JVM,
}


# --- the result --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MultiLangProperties:
    """What one properties file says.

    executable: ``executableName`` split on whitespace (run from ``directory``).
    app / stream / worker_id: ``applicationName``, the stream (``streamArn`` wins over ``streamName``),
      ``workerId`` (None: shardlease's default, ``host:pid``).
    settings: the variables the file sets (docs/api.md), e.g. ``{"SHARDLEASE_FAILOVER_TIME_MS": "10000"}``.
    response_timeout_s: ``timeoutInSeconds`` (None: a child may take as long as it takes, as in KCL).
    warnings: one line per key that is not used here or not known.
    """

    path: Path
    directory: Path
    executable: tuple[str, ...]
    app: str
    stream: str
    worker_id: str | None
    settings: Mapping[str, str]
    response_timeout_s: float | None
    warnings: tuple[str, ...]


_STREAM_ARN = re.compile(r"^arn:aws[a-z-]*:kinesis:([a-z0-9-]+):\d{12}:stream/([A-Za-z0-9_.-]{1,128})$")


def read_properties(path: Path, text: str) -> MultiLangProperties:
    """Interpret the properties ``text`` of the file at ``path``; :class:`ConfigError` (one line naming the key)
    for what cannot work."""
    where = path.name
    props = parse_properties(text)
    settings: dict[str, str] = {}
    warnings: list[str] = []

    def required(key: str) -> str:
        value = props.get(key, "").strip()
        if not value:
            raise ConfigError(f"{where}: {key} is required")
        return value

    executable = tuple(required("executableName").split())
    app = required("applicationName")
    stream = props.get("streamName", "").strip()
    arn = props.get("streamArn", "").strip()
    if arn:
        match = _STREAM_ARN.match(arn)
        if match is None:
            raise ConfigError(f"{where}: streamArn={arn!r} is not a Kinesis stream ARN")
        stream = match.group(2)
        settings["AWS_REGION"] = match.group(1)
    if not stream:
        raise ConfigError(f"{where}: streamName or streamArn is required")
    worker_id = props.get("workerId", "").strip() or None

    for given_key, raw in props.items():
        value = raw.strip()
        key = given_key.removeprefix("pollingConfig.")  # KCL reads the polling keys under this prefix too
        if key in HONOURED:
            if value:
                rule = HONOURED[key]
                settings[rule.variable] = rule.convert(key, value)
        elif key in READ_HERE:
            continue
        elif key in NOT_USED:
            warnings.append(f"{where}: {given_key} is not used by shardlease: {NOT_USED[key]}")
        elif "." in key:  # KCL's nested settings (kinesisClient.x, fanoutConfig.x, ...): the JVM's SDK clients
            warnings.append(f"{where}: {given_key} is not used by shardlease: {_JVM}")
        else:
            warnings.append(f"{where}: {given_key} is not a key KCL's MultiLangDaemon knows (a typo?): ignored")

    _initial_position(props, settings, where)
    _tables(props, app, where)
    if parse_bool(props.get("disableWorkerMetrics"), name=f"{where}: disableWorkerMetrics", default=False):
        settings["SHARDLEASE_CPU_METRIC"] = "none"
    timeout = props.get("timeoutInSeconds", "").strip()
    response_timeout_s = float(_POSITIVE("timeoutInSeconds", timeout)) if timeout else None

    return MultiLangProperties(
        path=path,
        directory=path.parent,
        executable=executable,
        app=app,
        stream=stream,
        worker_id=worker_id,
        settings=settings,
        response_timeout_s=response_timeout_s,
        warnings=tuple(warnings),
    )


def _initial_position(props: Mapping[str, str], settings: dict[str, str], where: str) -> None:
    position = props.get("initialPositionInStream", "").strip()
    if position:
        try:
            settings["SHARDLEASE_INITIAL_POSITION"] = InitialPosition.parse(position).value
        except (ConfigError, ValueError):
            raise ConfigError(
                f"{where}: initialPositionInStream={position!r}: expected TRIM_HORIZON, LATEST or AT_TIMESTAMP"
            ) from None
    extended = props.get("initialPositionInStreamExtended", "").strip()
    if extended:
        try:
            when = datetime.fromtimestamp(float(extended), timezone.utc)
        except (ValueError, OverflowError, OSError):
            raise ConfigError(
                f"{where}: initialPositionInStreamExtended={extended!r} is not a time in epoch seconds"
            ) from None
        settings["SHARDLEASE_INITIAL_POSITION"] = InitialPosition.AT_TIMESTAMP.value
        settings["SHARDLEASE_INITIAL_TIMESTAMP"] = when.isoformat()
    elif settings.get("SHARDLEASE_INITIAL_POSITION") == InitialPosition.AT_TIMESTAMP.value:
        raise ConfigError(f"{where}: initialPositionInStream=AT_TIMESTAMP needs initialPositionInStreamExtended")


def _tables(props: Mapping[str, str], app: str, where: str) -> None:
    """Table names other than the application's own cannot be honoured: workers of one application must meet in
    one table, and a shardlease worker finds its tables by the application name."""
    expected = {
        "tableName": lease_table_name(app),
        "coordinatorStateTableName": coordinator_state_table_name(app),
        "workerMetricsTableName": worker_metrics_table_name(app),
    }
    for key, name in expected.items():
        given = props.get(key, "").strip()
        if given and given != name:
            raise ConfigError(
                f"{where}: {key}={given!r} differs from {name!r}: shardlease names its tables after applicationName"
            )
