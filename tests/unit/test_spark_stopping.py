"""stop_between_batches: when it calls query.stop() (pure: a scripted query, no Spark)."""

from __future__ import annotations

from worker_lib.core.clock import ManualClock
from worker_lib.spark import stop_between_batches


class ScriptedQuery:
    """A StreamingQuery whose trigger is active for the first ``busy_polls`` looks at its status."""

    def __init__(self, busy_polls: int, *, active: bool = True) -> None:
        self.busy_polls = busy_polls
        self.isActive = active
        self.polls = 0
        self.stopped_while_busy: bool | None = None

    @property
    def status(self) -> dict[str, object]:
        self.polls += 1
        return {"message": "", "isDataAvailable": True, "isTriggerActive": self.polls <= self.busy_polls}

    def stop(self) -> None:
        self.stopped_while_busy = self.polls <= self.busy_polls
        self.isActive = False


def test_a_running_batch_is_waited_for_and_the_query_stopped_between_batches() -> None:
    # GIVEN a query in the middle of a micro-batch for the next 5 looks
    query, clock = ScriptedQuery(busy_polls=5), ManualClock()
    # WHEN it is stopped between batches
    stopped_between = stop_between_batches(query, timeout_s=10, clock=clock)
    # THEN stop() came once the trigger was no longer active, and it said so
    assert stopped_between is True
    assert query.stopped_while_busy is False and query.polls == 6 and not query.isActive


def test_back_to_back_batches_are_stopped_anyway_at_the_timeout() -> None:
    # GIVEN a query whose batches never leave a gap
    query, clock = ScriptedQuery(busy_polls=10**9), ManualClock()
    started = clock.monotonic()
    # WHEN stopped with a 1 s timeout THEN it is stopped mid-batch after about 1 s, and the caller is told
    assert stop_between_batches(query, timeout_s=1.0, clock=clock) is False
    assert query.stopped_while_busy is True and not query.isActive
    assert 1.0 <= clock.monotonic() - started < 1.1


def test_a_query_that_already_ended_is_left_alone() -> None:
    # GIVEN a query that is no longer active WHEN stopped between batches THEN nothing is called
    query = ScriptedQuery(busy_polls=0, active=False)
    assert stop_between_batches(query, clock=ManualClock()) is True
    assert query.polls == 0 and query.stopped_while_busy is None


class BackToBackQuery(ScriptedQuery):
    """A :class:`ScriptedQuery` whose batches run back to back: its trigger is always active, and its status message
    cycles through ``phases`` (one per look)."""

    def __init__(self, phases: list[str]) -> None:
        super().__init__(busy_polls=10**9)
        self.phases = phases
        self.stopped_in: str | None = None

    @property
    def phase(self) -> str:
        """The status message of the latest look."""
        return self.phases[(self.polls - 1) % len(self.phases)]

    @property
    def status(self) -> dict[str, object]:
        looked = super().status  # counts the look
        return {**looked, "message": self.phase}

    def stop(self) -> None:
        self.stopped_in = self.phase
        super().stop()


def test_back_to_back_batches_are_stopped_while_the_next_one_is_planned() -> None:
    # GIVEN a query whose batches leave no gap: each is mostly its sink, then the next one's planning
    phases = ["Processing new data"] * 20 + ["Getting offsets from ShardleaseStreamReader", "Writing offsets to log"]
    query, clock = BackToBackQuery(phases), ManualClock()
    # WHEN it is stopped between batches
    stopped_between = stop_between_batches(query, timeout_s=10, clock=clock)
    # THEN stop() came while the next batch was being planned (not inside a sink), at the first chance
    assert stopped_between is True
    assert query.stopped_in == "Getting offsets from ShardleaseStreamReader" and query.polls == 21
