"""What happens to the leases of streams a multi-stream application no longer consumes (pure planning)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker_lib.shardsync.former_streams import plan_former_streams

A, B, C = "1:a:10", "1:b:10", "1:c:10"
GRACE = 60_000
NOW = 1_000_000


def test_a_tracked_stream_is_never_planned() -> None:
    plan = plan_former_streams(leased=[A], tracked=[A], deleted=[], untracked_since={}, now_ms=NOW, grace_ms=GRACE)
    assert plan.delete_now == () and dict(plan.waiting) == {}


def test_a_stream_found_untracked_starts_its_grace_period_now() -> None:
    plan = plan_former_streams(leased=[A, B], tracked=[A], deleted=[], untracked_since={}, now_ms=NOW, grace_ms=GRACE)
    assert plan.delete_now == () and dict(plan.waiting) == {B: NOW}


def test_its_leases_go_when_the_grace_period_is_over_and_not_before() -> None:
    # GIVEN B untracked since NOW
    def at(now: int) -> tuple[tuple[str, ...], dict[str, int]]:
        plan = plan_former_streams(
            leased=[B], tracked=[], deleted=[], untracked_since={B: NOW}, now_ms=now, grace_ms=GRACE
        )
        return plan.delete_now, dict(plan.waiting)

    # THEN it waits until the grace period is over, then goes
    assert at(NOW + GRACE - 1) == ((), {B: NOW})
    assert at(NOW + GRACE) == ((B,), {})


def test_a_deleted_stream_goes_at_once_whatever_its_clock() -> None:
    plan = plan_former_streams(leased=[B], tracked=[], deleted=[B], untracked_since={}, now_ms=NOW, grace_ms=GRACE)
    assert plan.delete_now == (B,) and "deleted in Kinesis" in plan.reasons[B]


def test_a_negative_grace_period_never_deletes_an_existing_stream() -> None:
    plan = plan_former_streams(
        leased=[B, C], tracked=[], deleted=[C], untracked_since={B: 0}, now_ms=NOW * 1000, grace_ms=-1
    )
    assert plan.delete_now == (C,) and dict(plan.waiting) == {B: 0}


def test_an_undecided_stream_keeps_its_clock_and_its_leases() -> None:
    plan = plan_former_streams(
        leased=[B, C],
        tracked=[],
        deleted=[B],
        undecided=[B, C],
        untracked_since={B: 5},
        now_ms=NOW,
        grace_ms=GRACE,
    )
    assert plan.delete_now == () and dict(plan.waiting) == {B: 5}


def test_a_stream_tracked_again_or_without_leases_is_forgotten() -> None:
    plan = plan_former_streams(
        leased=[A], tracked=[A], deleted=[], untracked_since={A: 1, B: 2}, now_ms=NOW, grace_ms=GRACE
    )
    assert dict(plan.waiting) == {}


@settings(deadline=None)  # correctness, whatever the machine's speed: no per-example time limit
@given(
    since=st.integers(min_value=0, max_value=10**9),
    elapsed=st.integers(min_value=0, max_value=10**9),
    grace=st.integers(min_value=-1, max_value=10**9),
)
def test_an_existing_stream_is_deleted_exactly_when_its_grace_period_has_passed(
    since: int, elapsed: int, grace: int
) -> None:
    plan = plan_former_streams(
        leased=[B], tracked=[], deleted=[], untracked_since={B: since}, now_ms=since + elapsed, grace_ms=grace
    )
    assert (plan.delete_now == (B,)) == (grace >= 0 and elapsed >= grace)
    assert (B in plan.waiting) != (plan.delete_now == (B,))
