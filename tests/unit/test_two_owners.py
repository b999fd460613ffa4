"""The chaos suite's "one owner at a time" invariant (tests/support/chaos.py ``two_owners``), judged by journal order
and delivery stamps, on hand-made journals: what it accepts (the one batch in flight when the next owner started) and
what it reports (a delivery after the next owner's start, or a second batch)."""

from __future__ import annotations

from tests.support.chaos import Line, two_owners


def journal(*entries: tuple[float, int, str, str, float | None]) -> list[Line]:
    """(stamp, pid, kind, record, delivered) per line, all on one shard."""
    return [
        Line(i, t, pid, "s0", kind, "1", "0", c, delivered) for i, (t, pid, kind, c, delivered) in enumerate(entries)
    ]


PID_2_STARTS_AT_10_5 = ((9.0, 1, "INIT", "-", None), (10.5, 2, "INIT", "-", None))
"""The journal's start: pid 1's session on the shard from 9.0, the next owner's (pid 2) from 10.5."""


def test_the_batch_in_flight_when_the_next_owner_started_is_accepted() -> None:
    # GIVEN pid 1 handed a batch at 10.0, pid 2 starting its session at 10.5, and pid 1 journaling that batch after it
    lines = journal(
        *PID_2_STARTS_AT_10_5,
        (10.6, 1, "REC", "r1", 10.0),
        (10.6, 1, "REC", "r2", 10.0),
        (10.7, 2, "REC", "r1", 10.7),
    )
    # WHEN judged THEN nothing is reported, and one batch in flight is counted
    found = two_owners(lines)
    assert found.violations == [] and found.in_flight == 1


def test_a_batch_handed_over_after_the_next_owner_started_is_two_owners() -> None:
    # GIVEN pid 1 handed a batch at 11.0, after pid 2 started at 10.5 (its fence did not hold)
    lines = journal(
        *PID_2_STARTS_AT_10_5,
        (11.0, 1, "REC", "r1", 11.0),
    )
    # WHEN judged THEN it is reported, whatever the stamps' distance
    assert len(two_owners(lines).violations) == 1


def test_a_second_batch_after_the_next_owner_started_is_two_owners() -> None:
    # GIVEN pid 1 journaling two batches after pid 2's start, both handed over before it (stamps late under load)
    lines = journal(
        *PID_2_STARTS_AT_10_5,
        (10.6, 1, "REC", "r1", 10.0),
        (10.8, 1, "REC", "r2", 10.1),
    )
    # WHEN judged THEN the second batch is reported
    violations = two_owners(lines).violations
    assert len(violations) == 1 and "r2" in violations[0]


def test_a_new_session_of_the_earlier_owner_is_its_own() -> None:
    # GIVEN pid 1 starting a new session after pid 2's (the lease came back), then journaling
    lines = journal(
        *PID_2_STARTS_AT_10_5,
        (20.0, 1, "INIT", "-", None),
        (20.1, 1, "REC", "r1", 20.1),
        (20.2, 1, "REC", "r2", 20.2),
    )
    # WHEN judged for pid 1's records THEN nothing is reported
    assert two_owners(lines).violations == []
