"""The chaos suite's journal invariants judge what they should (tests/support/chaos.py): a shard that nobody served
after its owner was killed is found, however the journal's own lines end; with lanes, order is judged per key, the
earlier owner may finish the deliveries it had in flight (one per lane, ``parallelism`` at most) after the next one
started, and a graceful stop's duplicates are only those past the watermark it left."""

from __future__ import annotations

from tests.support.chaos import Line, check_journal, record_key, unserved_s
from worker_lib.processing.lanes import lane_count, lane_of


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


# --- lanes: the journal judged per key -----------------------------------------------------------------------------

PARALLELISM = 8


def recs(text: str) -> list[Line]:
    """Journal lines of shard s0 from ``<time> <pid> <kind> <sequence> <record id> [<delivered>]`` rows,
    ``;``-separated (INIT and SHUTDOWN rows: the sequence is their checkpoint, ``-`` for TRIM_HORIZON)."""
    out = []
    for i, row in enumerate(r.split() for r in text.split(";") if r.strip()):
        t, pid, kind, seq, c, *delivered = row
        a = "TRIM_HORIZON" if seq == "-" else seq
        out.append(Line(i, float(t), int(pid), "s0", kind, a, "0", c, float(delivered[0]) if delivered else None))
    return out


def judged(
    lines: list[Line], produced: list[str], *, lanes: bool = True, abnormal: set[int] | None = None
) -> list[str]:
    key_of = record_key if lanes else None
    found = check_journal(lines, produced, abnormal_pids=abnormal or set(), key_of=key_of, parallelism=PARALLELISM)
    return found.violations


def test_lanes_interleaved_keys_each_in_order_pass() -> None:
    # GIVEN one session whose lanes journaled keys k0 and k1 interleaved (shard order 1..6: k0 k1 k0 k1 k0 k1),
    # each key's records in shard order
    lines = recs(
        "1.0 1 INIT - -; 1.1 1 REC 1 r0000000; 1.1 1 REC 3 r0000024; 1.2 1 REC 2 r0000001; 1.3 1 REC 5 r0000048;"
        "1.4 1 REC 4 r0000025; 1.4 1 REC 6 r0000049"
    )
    # WHEN judged per key THEN nothing is reported
    assert judged(lines, ["r0000000", "r0000001", "r0000024", "r0000025", "r0000048", "r0000049"]) == []


def test_lanes_a_key_out_of_order_is_reported() -> None:
    # GIVEN one session that journaled k1's record 4 (r0000025) before its record 2 (r0000001)
    lines = recs("1.0 1 INIT - -; 1.1 1 REC 1 r0000000; 1.2 1 REC 4 r0000025; 1.3 1 REC 2 r0000001")
    # WHEN judged per key THEN that break, and only it, is reported
    violations = judged(lines, ["r0000000", "r0000001", "r0000025"])
    assert len(violations) == 1 and "order broken for key k1" in violations[0] and "r0000001" in violations[0]


def test_lanes_records_of_different_keys_out_of_shard_order_pass() -> None:
    # GIVEN one session that journaled k1's record 2 before k0's record 1 (another lane was faster)
    lines = recs("1.0 1 INIT - -; 1.1 1 REC 2 r0000001; 1.2 1 REC 1 r0000000")
    # WHEN judged per key THEN nothing is reported; judged as one lane THEN the shard's order is broken
    assert judged(lines, ["r0000000", "r0000001"]) == []
    assert len(judged(lines, ["r0000000", "r0000001"], lanes=False)) == 1


def test_lanes_one_delivery_per_lane_may_end_after_the_next_owner_started() -> None:
    # GIVEN pid 1 frozen with deliveries in flight in two lanes (k0's and k1's, handed over at 9.8 and 9.9); pid 2
    # starting at 10.5; pid 1 journaling both on waking, then another delivery of k0's lane (r0000024, handed 9.95)
    assert lane_of("k0", lane_count(PARALLELISM)) != lane_of("k1", lane_count(PARALLELISM))
    lines = recs(
        "9.0 1 INIT - -; 10.5 2 INIT - -; 10.6 1 REC 1 r0000000 9.8; 10.65 1 REC 2 r0000001 9.9;"
        "10.7 2 REC 1 r0000000 10.7; 10.7 2 REC 2 r0000001 10.7; 10.8 1 REC 3 r0000024 9.95;"
        "10.9 2 REC 3 r0000024 10.9"
    )
    produced = ["r0000000", "r0000001", "r0000024"]
    # WHEN judged per lane THEN the two lanes' deliveries in flight are accepted, the second of k0's lane is not
    violations = judged(lines, produced, abnormal={1})
    assert len(violations) == 1 and "r0000024" in violations[0] and "after the one it had in flight" in violations[0]
    # AND without that last delivery nothing is reported (as one lane, the second lane's delivery would be)
    accepted = [line for line in lines if line.c != "r0000024"]
    assert judged(accepted, produced[:2], abnormal={1}) == []
    assert len(judged(accepted, produced[:2], lanes=False, abnormal={1})) == 1


def test_lanes_more_deliveries_after_the_next_owner_started_than_run_at_once_is_two_owners() -> None:
    # GIVEN parallelism 2 (two lane deliveries at once), and pid 1 journaling deliveries of three lanes (k0, k1, k2),
    # all handed over before pid 2 started
    keys = {lane_of(f"k{n}", lane_count(2)) for n in range(3)}
    assert len(keys) == 3
    lines = recs(
        "9.0 1 INIT - -; 10.5 2 INIT - -; 10.6 1 REC 1 r0000000 9.8; 10.65 1 REC 2 r0000001 9.85;"
        "10.7 1 REC 3 r0000002 9.9"
    )
    # WHEN judged THEN the third is reported: it cannot have been in flight with the other two
    found = check_journal(lines, [], abnormal_pids={1}, key_of=record_key, parallelism=2)
    assert len(found.violations) == 1 and "r0000002" in found.violations[0] and "more than the 2" in found.violations[0]


def test_lanes_a_delivery_handed_over_after_the_next_owner_started_is_two_owners() -> None:
    # GIVEN pid 2 starting at 10.5 and pid 1 then journaling a delivery a lane started at 10.6
    lines = recs("9.0 1 INIT - -; 10.5 2 INIT - -; 10.6 1 REC 1 r0000000 10.6; 10.7 2 REC 1 r0000000 10.7")
    # WHEN judged per lane THEN it is reported
    violations = judged(lines, ["r0000000"], abnormal={1})
    assert len(violations) == 1 and "two owners at once" in violations[0]


def test_lanes_a_graceful_stop_repeats_only_records_past_the_watermark_it_left() -> None:
    # GIVEN pid 1 stopped gracefully with k1's records 2 and 4 done but k0's record 3 not: it left the watermark at
    # record 2; pid 2 starts there and processes 3 and 4 (4 again)
    lines = recs(
        "1.0 1 INIT - -; 1.1 1 REC 1 r0000000; 1.1 1 REC 2 r0000001; 1.2 1 REC 4 r0000025; 1.5 1 SHUTDOWN 2 -;"
        "2.0 2 INIT 2 -; 2.1 2 REC 3 r0000024; 2.1 2 REC 4 r0000025"
    )
    produced = ["r0000000", "r0000001", "r0000024", "r0000025"]
    # WHEN judged per key THEN the duplicate past the watermark is accepted; as one lane THEN it is reported
    assert judged(lines, produced) == []
    assert len(judged(lines, produced, lanes=False)) == 1
    # AND a duplicate the watermark it left covered is reported (here pid 2 started before it)
    covered = recs(
        "1.0 1 INIT - -; 1.1 1 REC 1 r0000000; 1.1 1 REC 2 r0000001; 1.5 1 SHUTDOWN 2 -;"
        "2.0 2 INIT - -; 2.1 2 REC 1 r0000000; 2.1 2 REC 2 r0000001"
    )
    violations = judged(covered, ["r0000000", "r0000001"])
    assert len(violations) == 2 and all("ended normally at a checkpoint covering it" in v for v in violations)


def test_a_frozen_owners_delivery_journaled_on_waking_is_its_duplicate_not_its_successors() -> None:
    # GIVEN pid 1 frozen in a delivery handed over at 9.8; pid 2 starting at 10.5 and processing records 1 and 2,
    # ending normally (SHUTDOWN past them); pid 1 journaling its delivery of 1 on waking, then its LOST
    lines = recs(
        "9.0 1 INIT - -; 10.5 2 INIT - -; 10.6 2 REC 1 r0000000 10.6; 10.6 2 REC 2 r0000001 10.6;"
        "11.0 1 REC 1 r0000000 9.8; 11.1 1 LOST - -; 12.0 2 SHUTDOWN 2 -"
    )
    # WHEN judged, pid 1 frozen (abnormal), in either mode
    # THEN the duplicate is pid 1's (it had record 1 first): nothing is reported, though pid 2 journaled it first
    for lanes in (True, False):
        assert judged(lines, ["r0000000", "r0000001"], lanes=lanes, abnormal={1}) == []
