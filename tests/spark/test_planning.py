"""The source's pure planning logic: offsets, next offsets, idleness, partitions, commit decisions."""

from __future__ import annotations

import pytest

from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import ConfigError
from worker_lib.core.models import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, KinesisRecord
from worker_lib.leases.mode import LivenessMode
from worker_lib.spark.load import ExecutorCpu
from worker_lib.spark.options import SourceOptions
from worker_lib.spark.planning import (
    BatchEnd,
    LeaseForPlanning,
    ReadSettings,
    ShardOffset,
    SourceOffset,
    caught_up_shards,
    commit_actions,
    handoffs_to_complete,
    is_idle,
    later_of,
    peak_concurrency,
    plan_next_offset,
    plan_partitions,
    positions_after,
    without_shards,
)
from worker_lib.spark.reading import records_up_to


def cp(seq: int, sub: int = 0) -> Checkpoint:
    return Checkpoint(sequence=str(seq), sub_sequence=sub)


def offset(batch: int, **shards: tuple[Checkpoint, str]) -> SourceOffset:
    return SourceOffset(
        run="r1", batch=batch, shards={k: ShardOffset(position=p, epoch=e) for k, (p, e) in shards.items()}
    )


def test_offsets_round_trip_through_json() -> None:
    original = SourceOffset(
        run="abc",
        batch=3,
        shards={
            "s1": ShardOffset(position=cp(17, 2), epoch="x:1"),
            "s2": ShardOffset(position=AT_TIMESTAMP, epoch="x:2", timestamp=1700000000.5),
        },
    )
    assert SourceOffset.from_json(original.to_json()) == original


def test_a_bad_offset_is_refused() -> None:
    with pytest.raises(ConfigError):
        SourceOffset.from_json({"v": 99, "run": "r", "batch": 0, "shards": {}})
    with pytest.raises(ConfigError):
        SourceOffset.from_json({"v": 1, "run": "r", "batch": 1, "shards": {"s": {"seq": "abc", "sub": 0}}})


def test_later_of() -> None:
    assert later_of(cp(5), cp(7)) == cp(7)
    assert later_of(cp(7, 1), cp(7, 0)) == cp(7, 1)
    assert later_of(TRIM_HORIZON, cp(3)) == cp(3)
    assert later_of(cp(3), TRIM_HORIZON) == cp(3)
    assert later_of(cp(3), SHARD_END) == SHARD_END


def test_the_initial_offset_is_never_read_and_recorded_ends_move_positions() -> None:
    start = offset(0, s1=(TRIM_HORIZON, "e1"))
    assert positions_after(start, {"s1": BatchEnd(lease_key="s1", position=cp(9))}) == {"s1": TRIM_HORIZON}
    start = offset(4, s1=(cp(3), "e1"), s2=(cp(5), "e1"))
    ends = {"s1": BatchEnd(lease_key="s1", position=cp(9), records=2)}
    # s2 has no recorded end: the sink did not evaluate it; it stays where it was.
    assert positions_after(start, ends) == {"s1": cp(9), "s2": cp(5)}


def test_next_offset_follows_held_readable_leases() -> None:
    start = offset(2, s1=(cp(3), "e1"), s2=(cp(5), "e1"), s3=(cp(1), "e1"))
    ends = {
        "s1": BatchEnd(lease_key="s1", position=cp(9), records=3),
        "s2": BatchEnd(lease_key="s2", position=SHARD_END, records=1),
        "s3": BatchEnd(lease_key="s3", position=cp(2), records=1),
    }
    held = [
        LeaseForPlanning(lease_key="s1", checkpoint=cp(3), epoch="e1"),
        LeaseForPlanning(lease_key="s2", checkpoint=cp(5), epoch="e1"),  # ended: not read again
        # s3 lost: dropped
        LeaseForPlanning(lease_key="s4", checkpoint=cp(40), epoch="e2"),  # newly taken: from its checkpoint
        LeaseForPlanning(lease_key="s5", checkpoint=cp(1), epoch="e3", readable=False),  # handoff / parents: not read
    ]
    nxt = plan_next_offset(start, ends, held, now_epoch_s=100.0)
    assert nxt.batch == 3 and nxt.run == "r1"
    assert nxt.positions() == {"s1": cp(9), "s4": cp(40)}
    assert nxt.shards["s4"].epoch == "e2"


def test_next_offset_takes_the_lease_checkpoint_when_another_owner_moved_it() -> None:
    start = offset(2, s1=(cp(3), "e1"))
    ends = {"s1": BatchEnd(lease_key="s1", position=cp(9), records=3)}
    held = [LeaseForPlanning(lease_key="s1", checkpoint=cp(50), epoch="e9")]
    nxt = plan_next_offset(start, ends, held, now_epoch_s=1)
    assert nxt.positions() == {"s1": cp(50)}


def test_a_shard_taken_again_resumes_after_what_committed_batches_delivered_not_from_its_stale_checkpoint() -> None:
    # GIVEN a restarted query whose replayed batch read s1 up to 9 and was committed while the lease was not yet
    # held again (no checkpoint written: the lease table still says 3), and a batch without s1 since
    start = offset(5, s2=(cp(1), "e2"))
    ends = {"s2": BatchEnd(lease_key="s2", position=cp(2), records=1)}
    held = [
        LeaseForPlanning(lease_key="s1", checkpoint=cp(3), epoch="e3"),
        LeaseForPlanning(lease_key="s2", checkpoint=cp(1), epoch="e2"),
    ]
    # WHEN s1's lease is held again THEN it is read after 9, not again from 3
    nxt = plan_next_offset(start, ends, held, now_epoch_s=1, delivered={"s1": cp(9), "s2": cp(1)})
    assert nxt.positions() == {"s1": cp(9), "s2": cp(2)}
    # AND another owner's later checkpoint still wins
    moved = [LeaseForPlanning(lease_key="s1", checkpoint=cp(50), epoch="e4")]
    assert plan_next_offset(start, ends, moved, now_epoch_s=1, delivered={"s1": cp(9)}).positions() == {"s1": cp(50)}


def test_latest_is_pinned_to_the_time_it_was_first_planned() -> None:
    start = offset(0)
    held = [LeaseForPlanning(lease_key="s1", checkpoint=LATEST, epoch="e1")]
    first = plan_next_offset(start, {}, held, now_epoch_s=1000.0)
    assert first.shards["s1"].position == AT_TIMESTAMP and first.shards["s1"].timestamp == 1000.0
    idle = {"s1": BatchEnd(lease_key="s1", position=AT_TIMESTAMP, caught_up=True)}
    second = plan_next_offset(first, idle, held, now_epoch_s=2000.0)
    assert second.shards["s1"].timestamp == 1000.0  # records between the two batches are not skipped
    assert is_idle(first, idle, second)


def test_idleness() -> None:
    start = offset(5, s1=(cp(3), "e1"))
    idle_end = {"s1": BatchEnd(lease_key="s1", position=cp(3), caught_up=True)}
    held = [LeaseForPlanning(lease_key="s1", checkpoint=cp(3), epoch="e1")]
    assert is_idle(start, idle_end, plan_next_offset(start, idle_end, held, now_epoch_s=0))
    busy_end = {"s1": BatchEnd(lease_key="s1", position=cp(8), records=2, caught_up=True)}
    assert not is_idle(start, busy_end, plan_next_offset(start, busy_end, held, now_epoch_s=0))
    capped = {"s1": BatchEnd(lease_key="s1", position=cp(3), caught_up=False)}  # time budget ran out
    assert not is_idle(start, capped, plan_next_offset(start, capped, held, now_epoch_s=0))
    more = [*held, LeaseForPlanning(lease_key="s2", checkpoint=TRIM_HORIZON, epoch="e2")]
    assert not is_idle(start, idle_end, plan_next_offset(start, idle_end, more, now_epoch_s=0))
    assert not is_idle(offset(0, s1=(cp(3), "e1")), {}, plan_next_offset(offset(0), {}, held, now_epoch_s=0))


def test_one_partition_per_shard_and_deterministic() -> None:
    settings = ReadSettings(app="app", stream="s", worker_id="w", region="us-east-1")
    end = offset(7, b=(cp(2), "e"), a=(TRIM_HORIZON, "e"))
    tasks = plan_partitions(end, settings)
    assert [t.lease_key for t in tasks] == ["a", "b"]
    assert tasks == plan_partitions(SourceOffset.from_json(end.to_json()), settings)
    assert tasks[0].item_key == "spark-batch#w#r1#7#a"


def test_commit_writes_only_what_a_still_held_lease_read() -> None:
    committed = offset(3, ok=(cp(1), "e1"), lost=(cp(1), "e1"), retaken=(cp(1), "e1"), none=(cp(1), "e1"))
    committed = SourceOffset(
        run="r1",
        batch=3,
        shards={
            **committed.shards,
            "ended": ShardOffset(position=cp(1), epoch="e1"),
            "empty": ShardOffset(position=TRIM_HORIZON, epoch="e1"),
            "same": ShardOffset(position=cp(4), epoch="e1"),
        },
    )
    ends = {
        "ok": BatchEnd(lease_key="ok", position=cp(9), records=3, bytes=30),
        "lost": BatchEnd(lease_key="lost", position=cp(9), records=3),
        "retaken": BatchEnd(lease_key="retaken", position=cp(9), records=3),
        "ended": BatchEnd(lease_key="ended", position=SHARD_END, records=1, children=("c1", "c2")),
        "empty": BatchEnd(lease_key="empty", position=TRIM_HORIZON, caught_up=True),
        "same": BatchEnd(lease_key="same", position=cp(4), caught_up=True),
    }
    epochs = {"ok": "e1", "retaken": "e7", "ended": "e1", "empty": "e1", "none": "e1", "same": "e1"}
    checkpoints = {"ok": cp(1), "retaken": cp(1), "ended": cp(1), "empty": TRIM_HORIZON, "same": cp(4)}
    actions = {
        a.lease_key: a for a in commit_actions(committed, ends, held_epochs=epochs, lease_checkpoints=checkpoints)
    }
    assert actions["ok"].checkpoint == cp(9) and actions["ok"].bytes == 30
    assert actions["lost"].checkpoint is None and actions["lost"].skipped == "lease lost"
    assert actions["retaken"].checkpoint is None and actions["retaken"].skipped == "lease re-taken"
    assert actions["none"].checkpoint is None and actions["none"].skipped == "not read"
    assert actions["ended"].checkpoint == SHARD_END and actions["ended"].shard_end
    assert actions["ended"].children == ("c1", "c2")
    assert actions["empty"].checkpoint is None
    assert actions["same"].checkpoint is None and actions["same"].skipped == "already checkpointed"
    assert commit_actions(offset(0, ok=(cp(1), "e1")), ends, held_epochs=epochs, lease_checkpoints={}) == []


def test_handoffs_complete_once_no_uncommitted_batch_reads_the_shard() -> None:
    assert handoffs_to_complete(["a", "b", "c"], {"a": 4, "b": 5}, 4) == ["a", "c"]


def test_peak_concurrency_counts_reads_running_at_once() -> None:
    # GIVEN four reads on two slots (two waves) and one that ran alone afterwards
    def read(key: str, start: float, finish: float) -> BatchEnd:
        return BatchEnd(lease_key=key, position=cp(1), started_at=start, finished_at=finish)

    ends = [read("a", 10, 12), read("b", 10.5, 11), read("c", 11, 13), read("d", 12, 14), read("e", 20, 21)]
    # THEN at most two ran at the same time (a read ending as another starts does not overlap it)
    assert peak_concurrency(ends) == 2
    assert peak_concurrency([read("a", 1, 2)]) == 1
    assert peak_concurrency([BatchEnd(lease_key="x", position=cp(1))]) == 0  # no times recorded


def test_executor_cpu_grows_with_the_work_held_and_shrinks_with_the_slots() -> None:
    # GIVEN an application whose batches read 1 shard, then one whose batches read 7 (same CPU per shard read)
    clock = ManualClock()

    def batch(shards: int, slots: int) -> list[BatchEnd]:
        return [
            BatchEnd(
                lease_key=f"s{i}",
                position=cp(1),
                started_at=100 + i // slots,
                finished_at=100.9 + i // slots,
                cpu_seconds=0.05,
            )
            for i in range(shards)
        ]

    def load(shards: int, slots: int, fixed: int | None = None) -> float:
        metric = ExecutorCpu(slots=fixed, clock=clock)
        metric.sample()
        for _ in range(10):
            metric.add_batch(batch(shards, slots))
        clock.advance(10.0)
        value = metric.sample()
        assert value is not None
        return value

    # THEN the figure is proportional to the shards held (10 batches x shards x 0.05 s over 10 s, on 2 slots)
    assert load(1, 2, fixed=2) == pytest.approx(2.5)
    assert load(7, 2, fixed=2) == pytest.approx(17.5)
    # AND with slots measured from the reads, half the slots doubles the figure for the same work
    assert load(4, 2) == pytest.approx(10.0)
    assert load(4, 1) == pytest.approx(20.0)


def test_caught_up_shards_leave_an_available_now_run() -> None:
    # GIVEN batch 3 read a (to the tip) and b (stopped by the record cap); c was not read in it
    start = offset(3, a=(cp(1), "e"), b=(cp(1), "e"))
    ends = {
        "a": BatchEnd(lease_key="a", position=cp(9), records=8, caught_up=True),
        "b": BatchEnd(lease_key="b", position=cp(9), records=8, caught_up=False),
    }
    candidate = offset(4, a=(cp(9), "e"), b=(cp(9), "e"), c=(cp(1), "e"))
    # THEN only a is done, and leaving it out keeps the others
    assert caught_up_shards(start, ends) == {"a"}
    assert set(without_shards(candidate, {"a"}).shards) == {"b", "c"}
    assert caught_up_shards(offset(0, a=(cp(1), "e")), ends) == set()  # the initial offset was never read


def record(seq: int) -> KinesisRecord:
    return KinesisRecord(data=b"x", partition_key="k", sequence_number=str(seq))


def test_records_up_to_a_recorded_end() -> None:
    # GIVEN a read that returned records 5..9
    records = [record(n) for n in range(5, 10)]
    # THEN a recorded end inside it gives the prefix, one beyond it or at SHARD_END needs a re-read (None)
    assert [r.sequence_number for r in records_up_to(records, cp(7)) or ()] == ["5", "6", "7"]
    assert records_up_to(records, cp(9)) == tuple(records)
    assert records_up_to(records, cp(12)) is None
    assert records_up_to(records, SHARD_END) is None
    # AND a recorded read that found nothing (its end is the start sentinel) gives nothing
    assert records_up_to(records, TRIM_HORIZON) == ()
    assert records_up_to([], cp(3)) is None


def test_options() -> None:
    options = SourceOptions.parse(
        {"app": "orders", "stream": "orders-stream", "max_records_per_shard": "50", "endpoint_url": "http://x:1"}
    )
    assert options.max_records_per_shard == 50 and options.aws.endpoint_url == "http://x:1"
    assert options.worker_id.startswith("spark-")
    with pytest.raises(ConfigError, match="unknown"):
        SourceOptions.parse({"app": "orders", "stream": "s", "max_record": "5"})
    with pytest.raises(ConfigError, match="stream"):
        SourceOptions.parse({"app": "orders"})
    with pytest.raises(ConfigError, match="AT_TIMESTAMP"):
        SourceOptions.parse({"app": "orders", "stream": "s", "initial_position": "AT_TIMESTAMP"})
    with pytest.raises(ConfigError, match="whole number"):
        SourceOptions.parse({"app": "orders", "stream": "s", "max_read_ms": "soon"})


def test_lease_options_come_from_the_environment_with_the_options_over_them() -> None:
    base = {"app": "orders", "stream": "s"}
    # GIVEN nothing set THEN lease mode, the heartbeat by mode (1 s / 2 s), KCL's failover time
    default = SourceOptions.parse(base, env={}).lease
    assert (default.liveness_mode, default.failover_time_ms, default.heartbeat_enabled) == ("lease", 10_000, True)
    assert default.heartbeat_interval_for(LivenessMode.WORKER) == 2_000
    # GIVEN the cluster's environment THEN the driver follows it
    env = {"SHARDLEASE_LIVENESS_MODE": "worker", "SHARDLEASE_FAILOVER_TIME_MS": "6000"}
    from_env = SourceOptions.parse(base, env=env).lease
    assert (from_env.liveness_mode, from_env.failover_time_ms) == ("worker", 6_000)
    # GIVEN options as well THEN the query's options win (Spark lower-cases option names)
    opts = {**base, "liveness_mode": "Auto", "failover_time_ms": "3000", "heartbeat_interval_ms": "500"}
    over = SourceOptions.parse(opts, env=env).lease
    assert (over.liveness_mode, over.failover_time_ms, over.heartbeat_interval_for(LivenessMode.WORKER)) == (
        "auto",
        3_000,
        500,
    )
    # AND a bad mode, or worker mode without a heartbeat, is one ConfigError
    with pytest.raises(ConfigError, match="invalid liveness mode"):
        SourceOptions.parse({**base, "liveness_mode": "per-lease"}, env={})
    with pytest.raises(ConfigError, match="needs the worker heartbeat"):
        SourceOptions.parse({**base, "liveness_mode": "worker", "heartbeat_interval_ms": "0"}, env={})


def test_publishing_comes_from_the_environment_with_the_options_over_it() -> None:
    # GIVEN an environment publishing to CloudWatch under a namespace of its own
    env = {"SHARDLEASE_METRICS": "cloudwatch", "SHARDLEASE_METRICS_NAMESPACE": "Ops"}
    # WHEN the source is configured with and without its own options
    implicit = SourceOptions.parse({"app": "orders", "stream": "s"}, env)
    explicit = SourceOptions.parse(
        {"app": "orders", "stream": "s", "publish_metrics": "EMF", "metrics_flush_interval_ms": "5000"}, env
    )
    # THEN the environment fills what the options leave out, and an option wins
    assert (implicit.publishing.mode, implicit.publishing.namespace) == ("cloudwatch", "Ops")
    assert (explicit.publishing.mode, explicit.publishing.namespace) == ("emf", "Ops")
    assert explicit.publishing.flush_interval_ms == 5000
    assert SourceOptions.parse({"app": "orders", "stream": "s"}, {}).publishing.mode == "off"
    # AND a mode that does not exist is one error naming the option
    with pytest.raises(ConfigError, match="shardlease option publish_metrics='statsd': expected off, emf or cloudw"):
        SourceOptions.parse({"app": "orders", "stream": "s", "publish_metrics": "statsd"}, {})


class RecordingPublisher:
    def __init__(self) -> None:
        self.added: list[tuple[str, float, str, str]] = []
        self.flushes = 0

    def add(self, name: str, value: float, *, unit: str = "Count", aggregation: str = "sum") -> None:
        self.added.append((name, value, unit, aggregation))

    def flush(self) -> None:
        self.flushes += 1


def test_a_committed_batch_counts_its_records_bytes_and_worst_lag_and_flushes_once_an_interval() -> None:
    from worker_lib.spark.telemetry import SparkWorkerMetrics

    # GIVEN the metrics of a driver holding 3 leases whose load metric last sampled 42 %, flushing every 10 s
    clock, publisher = ManualClock(), RecordingPublisher()
    metrics = SparkWorkerMetrics(
        publisher, flush_interval_ms=10_000, leases_held=lambda: 3, cpu_percent=lambda: 42.0, clock=clock
    )
    ends = [
        BatchEnd(lease_key="a", position=Checkpoint(sequence="1"), records=10, bytes=1000, millis_behind_latest=500),
        BatchEnd(lease_key="b", position=Checkpoint(sequence="2"), records=5, bytes=200, millis_behind_latest=9000),
        BatchEnd(lease_key="c", position=Checkpoint(sequence="3")),
    ]
    # WHEN a batch is committed before the interval has passed
    metrics.committed(ends)
    # THEN its records and bytes are counted, its worst lag kept, and nothing is flushed yet
    sums = {name: sum(v for n, v, _, _ in publisher.added if n == name) for name, *_ in publisher.added}
    assert (sums["RecordsProcessed"], sums["BytesProcessed"]) == (15, 1200)
    assert ("MillisBehindLatest", 9000, "Milliseconds", "max") in publisher.added
    assert publisher.flushes == 0
    # WHEN the interval passes and the driver plans again
    clock.advance(10.0)
    metrics.tick()
    # THEN the gauges are added and one flush happens; a second tick at once flushes nothing more
    assert ("LeasesHeld", 3, "Count", "last") in publisher.added
    assert ("WorkerCpuUtilization", 42.0, "Percent", "last") in publisher.added
    metrics.tick()
    assert publisher.flushes == 1
