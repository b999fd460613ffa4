"""The chaos suite's journal invariants judge what they should (tests/support/chaos.py): a shard that nobody served
after its owner was killed is found, however the journal's own lines end."""

from __future__ import annotations

from tests.support.chaos import Line, unserved_s


def journal(text: str) -> list[Line]:
    """Journal lines from ``<time> <pid> <shard> <kind>`` rows, ``;``-separated."""
    rows = [row.split() for row in text.split(";") if row.strip()]
    return [Line(i, float(t), int(pid), shard, kind, "-", "-", "-") for i, (t, pid, shard, kind) in enumerate(rows)]


def test_a_shard_left_owned_by_a_killed_process_is_unserved_until_its_next_session() -> None:
    # GIVEN (issue 26's failing run) pid 1 frozen at 3.0 after taking s0 and s1; pid 2 takes both at 7.0; pid 1
    # wakes and journals LOST at 7.5; pid 2 is killed at 11.5; pid 3 starts s0 at 15.6 but s1 only at 47.0
    lines = journal(
        "2.9 1 s0 INIT; 2.9 1 s1 INIT; 7.0 2 s0 INIT; 7.0 2 s1 INIT; 7.5 1 s0 LOST; 7.5 1 s1 LOST;"
        "15.6 3 s0 INIT; 47.0 3 s1 INIT; 47.4 3 s0 SHUTDOWN; 47.5 3 s1 SHUTDOWN"
    )
    # WHEN the gaps are measured with the kill and the freeze as the ends of those processes' sessions
    gaps = unserved_s(lines, cut_at={1: [3.0], 2: [11.5]}, until=47.3)
    # THEN s1 went unserved from the kill to its next session, s0 from the kill to pid 3's start
    assert gaps == {"s0": 4.1, "s1": 35.5}


def test_a_graceful_handover_an_ended_shard_and_a_stall_until_the_end_are_told_apart() -> None:
    # GIVEN s0 handed over gracefully (SHUTDOWN, then the next INIT 0.4 s later), s1 ended (END: nothing to serve
    # after), and s2 whose only session (pid 1) never ended in the journal
    lines = journal("1.0 1 s0 INIT; 1.0 1 s1 INIT; 1.0 1 s2 INIT; 4.0 1 s0 SHUTDOWN; 4.4 2 s0 INIT; 6.0 1 s1 END")
    # WHEN measured until 20.0, with pid 1 frozen at 8.0
    gaps = unserved_s(lines, cut_at={1: [8.0]}, until=20.0)
    # THEN the hand-over cost 0.4 s, the ended shard nothing, and s2 the whole rest of the watch
    assert gaps == {"s0": 0.4, "s1": 0.0, "s2": 12.0}
