"""The local scaler's start delay (worker_lib.testing.scaler): pure bookkeeping on a manual clock; DesiredWorkers is
given directly (the CloudWatch read is the integration test's)."""

from __future__ import annotations

from typing import Any

from worker_lib.core.clock import ManualClock
from worker_lib.testing.scaler import LocalScaler


class GivenDesired(LocalScaler):
    def __init__(self, clock: ManualClock, running: list[str], *, start_delay_s: float) -> None:
        self.wanted: int | None = None
        self.started: list[str] = []
        self.stopped: list[str] = []
        self._fleet = running
        super().__init__(
            cloudwatch=None,
            state=NoState(),  # type: ignore[arg-type]
            namespace="ns",
            app="app",
            running=lambda: list(running),
            start=self._start_one,
            stop=self._stop_one,
            start_delay_s=start_delay_s,
            clock=clock,
        )

    def _start_one(self, name: str) -> None:
        self.started.append(name)
        self._fleet.append(name)

    def _stop_one(self, name: str) -> None:
        self.stopped.append(name)
        self._fleet.remove(name)

    def desired(self) -> int | None:
        return self.wanted


def pending(scaler: LocalScaler) -> tuple[str, ...]:
    return scaler.pending


class NoState:
    def get(self, key: str) -> dict[str, Any] | None:
        return None


def test_a_worker_asked_for_starts_after_the_delay_and_counts_meanwhile() -> None:
    # GIVEN one worker running and a start delay of 5 s
    clock, running = ManualClock(), ["scaled-0"]
    scaler = GivenDesired(clock, running, start_delay_s=5)
    # WHEN DesiredWorkers says 2
    scaler.wanted = 2
    scaler.step()
    # THEN nothing starts yet, but the fleet counts the pending one: the next steps ask for nobody else
    assert scaler.started == [] and pending(scaler) == ("scaled-1",)
    clock.advance(4)
    scaler.step()
    assert scaler.started == [] and scaler.history[-1][2] == 2
    # AND it starts once the delay has passed
    clock.advance(1)
    scaler.step()
    assert scaler.started == ["scaled-1"] and pending(scaler) == () and running == ["scaled-0", "scaled-1"]


def test_a_surplus_cancels_pending_starts_before_it_stops_anyone() -> None:
    # GIVEN two running and two pending
    clock, running = ManualClock(), ["scaled-a", "scaled-b"]
    scaler = GivenDesired(clock, running, start_delay_s=5)
    scaler.wanted = 4
    scaler.step()
    assert pending(scaler) == ("scaled-1", "scaled-2")
    # WHEN DesiredWorkers drops to 1
    scaler.wanted = 1
    scaler.step()
    # THEN both pending starts are cancelled and one running worker (the newest) is stopped
    assert pending(scaler) == () and scaler.stopped == ["scaled-b"] and running == ["scaled-a"]
    clock.advance(10)
    scaler.step()
    assert scaler.started == []


def test_without_a_delay_a_worker_starts_at_once() -> None:
    clock, running = ManualClock(), list[str]()
    scaler = GivenDesired(clock, running, start_delay_s=0)
    scaler.wanted = 1
    scaler.step()
    assert scaler.started == ["scaled-1"] and pending(scaler) == ()
