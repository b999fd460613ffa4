"""The liveness-mode rules (worker_lib/leases/mode.py), the worker's view of the stored mode (ModeFollower, over a
stand-in of the ``LivenessModeSource`` seam) and the lease settings that depend on the mode."""

from __future__ import annotations

import logging

import pytest

from worker_lib.core.clock import ManualClock
from worker_lib.core.errors import ConfigError, CorruptItemError, ThrottledError
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.mode import (
    LivenessMode,
    LivenessModeMismatchError,
    StoredMode,
    handoff_request,
    initial_mode,
    parse_handoff_request,
    parse_setting,
    refusal,
)
from worker_lib.leases.mode_store import ModeFollower, parse_stored_mode

L, W = LivenessMode.LEASE, LivenessMode.WORKER


@pytest.mark.parametrize(
    ("mode", "target", "renew", "per_owner", "intended"),
    [
        (L, None, True, False, L),  # KCL's way
        (L, W, True, True, W),  # switching to worker: the leader judges per owner first, workers still renew
        (W, None, False, True, W),  # worker mode
        (W, L, True, True, L),  # switching back: workers renew first, the leader still judges per owner
    ],
)
def test_each_stored_state_says_who_renews_and_how_the_leader_judges(
    mode: LivenessMode, target: LivenessMode | None, renew: bool, per_owner: bool, intended: LivenessMode
) -> None:
    stored = StoredMode(mode=mode, target=target)
    assert (stored.workers_renew, stored.leader_judges_per_owner, stored.intended) == (renew, per_owner, intended)
    # At every state of a switch, a lease is covered: renewed, or judged by a heartbeat
    assert stored.workers_renew or stored.leader_judges_per_owner


def test_a_target_equal_to_the_mode_is_no_switch() -> None:
    assert StoredMode(mode=W, target=W) == StoredMode(mode=W)
    assert not StoredMode(mode=W, target=W).switching


@pytest.mark.parametrize(
    ("setting", "stored", "refused"),
    [
        ("lease", None, False),
        ("worker", None, False),
        ("lease", StoredMode(mode=W), True),
        ("worker", StoredMode(mode=L), True),
        ("worker", StoredMode(mode=L, target=W), False),  # joining a switch towards its own mode
        ("lease", StoredMode(mode=L, target=W), True),
        ("auto", StoredMode(mode=W), False),
        ("auto", StoredMode(mode=L, target=W), False),
    ],
)
def test_a_process_refuses_only_an_explicit_mode_the_application_is_not_going_to(
    setting: str, stored: StoredMode | None, refused: bool
) -> None:
    reason = refusal(setting, stored, who="worker w1")
    assert (reason is not None) == refused
    if reason is not None:
        assert reason.startswith("worker w1 is configured for liveness mode")
        assert "SHARDLEASE_LIVENESS_MODE" in reason and "shardlease liveness --set" in reason


def test_settings_parse_case_insensitively_and_reject_anything_else() -> None:
    assert [parse_setting(v) for v in ("LEASE", " worker ", "Auto")] == ["lease", "worker", "auto"]
    with pytest.raises(ConfigError, match="expected lease, worker or auto"):
        parse_setting("heartbeat")
    assert [initial_mode(s) for s in ("lease", "worker", "auto")] == [L, W, L]


def test_handoff_requests_round_trip_and_foreign_elements_are_not_ours() -> None:
    element = handoff_request("stream:shardId-000000000007", 30_000)
    assert element == "30000:stream:shardId-000000000007"
    assert parse_handoff_request(element) == ("stream:shardId-000000000007", 30_000)
    assert parse_handoff_request("no-timeout") is None
    assert parse_handoff_request("x:shard") is None
    assert parse_handoff_request("30000:") is None


def test_a_stored_item_with_an_unknown_mode_is_corrupt_not_guessed() -> None:
    assert parse_stored_mode({"mode": "worker", "target": "lease"}) == StoredMode(mode=W, target=L)
    with pytest.raises(CorruptItemError, match="expected lease or worker"):
        parse_stored_mode({"mode": "sometimes"})
    with pytest.raises(CorruptItemError):
        parse_stored_mode({"mode": "lease", "target": 3})


# --- lease settings ----------------------------------------------------------------------------------------------


def test_the_default_heartbeat_follows_the_mode_and_an_explicit_one_wins() -> None:
    default = LeaseConfig()
    assert (default.heartbeat_interval_for(L), default.heartbeat_interval_for(W)) == (1_000, 2_000)
    short = LeaseConfig(failover_time_ms=3_000)
    assert (short.heartbeat_interval_for(L), short.heartbeat_interval_for(W)) == (1_000, 1_000)
    fixed = LeaseConfig(heartbeat_interval_ms=500)
    assert fixed.heartbeat_interval_for(W) == 500


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"liveness_mode": "worker", "heartbeat_interval_ms": 0}, "needs the worker heartbeat"),
        ({"liveness_mode": "auto", "heartbeat_interval_ms": 0}, "needs the worker heartbeat"),
        ({"liveness_mode": "sometimes"}, "expected lease, worker or auto"),
        ({"mode_check_interval_ms": 10}, "mode_check_interval_ms"),
        ({"throughput_update_interval_ms": 0}, "throughput_update_interval_ms"),
    ],
)
def test_bad_liveness_settings_are_one_config_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LeaseConfig(**kwargs)  # type: ignore[arg-type]


def test_lease_mode_may_still_turn_the_heartbeat_off_and_the_environment_sets_the_mode() -> None:
    assert not LeaseConfig(heartbeat_interval_ms=0).heartbeat_enabled
    config = LeaseConfig.from_env(
        {
            "SHARDLEASE_LIVENESS_MODE": "Worker",
            "SHARDLEASE_LIVENESS_MODE_CHECK_MS": "5000",
            "SHARDLEASE_THROUGHPUT_UPDATE_INTERVAL_MS": "120000",
        }
    )
    assert (config.liveness_mode, config.mode_check_interval_ms, config.throughput_update_interval_ms) == (
        "worker",
        5_000,
        120_000,
    )


# --- the worker's view -------------------------------------------------------------------------------------------


class StoredModes:
    """The ``LivenessModeSource`` seam: what the table holds now, or an error to raise."""

    def __init__(self, stored: StoredMode | None) -> None:
        self.stored = stored
        self.error: Exception | None = None
        self.reads = 0

    def read(self) -> StoredMode | None:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return self.stored


def test_the_follower_reads_at_start_then_only_every_check_interval() -> None:
    # GIVEN worker mode stored and an auto worker
    clock = ManualClock()
    source = StoredModes(StoredMode(mode=W))
    follower = ModeFollower(source, setting="auto", check_interval_s=60, who="worker w1", clock=clock)
    # WHEN it starts THEN it runs in worker mode
    assert follower.start() == StoredMode(mode=W) and source.reads == 1
    # WHEN the table changes THEN nothing is read before the interval, and the change is returned after it, once
    source.stored = StoredMode(mode=W, target=L)
    clock.advance(59)
    assert follower.poll() is None and source.reads == 1
    clock.advance(1)
    assert follower.poll() == StoredMode(mode=W, target=L)
    clock.advance(60)
    assert follower.poll() is None and follower.current == StoredMode(mode=W, target=L)


def test_without_a_stored_mode_the_follower_renews_and_a_mismatch_refuses_at_start() -> None:
    clock = ManualClock()
    nothing = ModeFollower(StoredModes(None), setting="worker", check_interval_s=60, who="w", clock=clock)
    assert nothing.start().workers_renew
    refused = ModeFollower(StoredModes(StoredMode(mode=L)), setting="worker", check_interval_s=60, who="w", clock=clock)
    with pytest.raises(LivenessModeMismatchError):
        refused.start()


def test_a_failed_reread_keeps_the_mode_and_a_runtime_mismatch_is_followed_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a worker explicitly configured for worker mode, running in it
    clock = ManualClock()
    source = StoredModes(StoredMode(mode=W))
    follower = ModeFollower(source, setting="worker", check_interval_s=1, who="worker w1", clock=clock)
    follower.start()
    # WHEN the re-read is throttled THEN the mode is kept
    source.error = ThrottledError("throttled")
    clock.advance(1)
    with caplog.at_level(logging.WARNING, logger="worker_lib.leases.mode_store"):
        assert follower.poll() is None
    assert follower.current == StoredMode(mode=W)
    # WHEN an operator switches the application back to lease mode
    source.error = None
    source.stored = StoredMode(mode=W, target=L)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="worker_lib.leases.mode_store"):
        clock.advance(1)
        changed = follower.poll()
        clock.advance(1)
        follower.poll()
    # THEN it follows (renewing is what keeps the switch safe) and warns once that its configuration disagrees
    assert changed is not None and changed.workers_renew
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "configured for liveness mode 'worker'" in warnings[0]
