"""The leader's fast path (docs/failover.md): between full cycles, one cheap read a tick, and an assignment pass
at once when a worker left, went silent or changed something.

* :class:`LivenessWatch` — the leader's :class:`~worker_lib.assignment.heartbeats.HeartbeatTracker` fed from the
  worker-metrics table, with the consistent confirmation read the assigner takes before moving a gone worker's
  leases (the :class:`~worker_lib.leader.assigner.LivenessJudge` the assigner uses in every run).
* :class:`FastPath` — one tick: scan the worker-metrics table (eventually consistent: one item per worker, about
  one read unit per tick for 20 workers) and, if the picture changed in a way that needs action — a worker gone
  (stopped, or silent past the failover time), a worker that released or created leases (``evc``) — run a fast
  assignment pass (:meth:`~worker_lib.leader.assigner.LeaseAssigner.run` with ``fast=True``, which reads the rows
  again after its lease scan). A failing read (e.g. throttling) backs the fast path off, doubling up to the
  full-cycle interval: the full cycle keeps assigning.
  The read runs on a helper thread and the tick waits for it at most ``read_timeout_s``: a read that botocore keeps
  retrying (throttling) must not hold the leader loop past its lock heartbeat. While it is still running, ticks skip.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from worker_lib.assignment.heartbeats import HeartbeatTracker, LivenessView
from worker_lib.core.backoff import Backoff
from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import WorkerMetricStats, WorkerState
from worker_lib.leader.assignment_report import AssignmentReport

log = logging.getLogger(__name__)


class WorkerRows(Protocol):
    def list_all(self, *, consistent: bool = False) -> list[WorkerMetricStats]: ...

    def get(self, worker_id: str) -> WorkerMetricStats | None: ...

    def declare_gone(self, worker_id: str, counter: int) -> bool: ...

    def certify_declarations(self, worker_id: str) -> bool: ...


class FastAssignment(Protocol):
    def run(self, *, run_number: int, fast: bool = False) -> AssignmentReport: ...


class LivenessWatch:
    """Heartbeat observations for one leader (kept across its terms: observations are facts on its own clock)."""

    def __init__(
        self, rows: WorkerRows, *, failover_ms: int, max_clock_skew_ms: int, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._rows = rows
        self._clock = clock
        self._tracker = HeartbeatTracker(failover_s=failover_ms / 1000, max_clock_skew_s=max_clock_skew_ms / 1000)
        self._certified: set[str] = set()
        self.last_view = LivenessView()

    def observe(self, workers: Sequence[WorkerMetricStats]) -> LivenessView:
        self.last_view = self._tracker.observe(workers, self._clock.monotonic(), self._clock.wall())
        self._certify(workers)
        return self.last_view

    def _certify(self, workers: Sequence[WorkerMetricStats]) -> None:
        """Mark each heartbeating worker's item ``hbg`` = 0, once: this leader declares a worker gone before it
        moves anything of it, so the worker may trust that no certificate means nothing moved (docs/failover.md)."""
        for row in workers:
            beat = row.heartbeat
            if beat is None or beat.gone_counter is not None or row.worker_id in self._certified:
                continue
            try:
                self._rows.certify_declarations(row.worker_id)
            except DependencyError as exc:
                log.debug("could not mark worker %s as certified: %s", row.worker_id, exc)
                continue
            self._certified.add(row.worker_id)
        self._certified &= {row.worker_id for row in workers}

    def confirm_gone(self, worker_id: str) -> bool:
        """Still gone by a consistent read taken after the caller's lease scan, and so declared on the worker's item
        (conditionally on the counter it stood still at): only then may its leases move. A beat that landed after
        the read makes the declaration fail, and the worker keeps its leases."""
        row = self._rows.get(worker_id)
        if not self._tracker.still_gone(row, self._clock.monotonic(), self._clock.wall()):
            return False
        assert row is not None and row.heartbeat is not None
        if row.heartbeat.state is WorkerState.STOPPED:
            return True  # it fenced itself before saying so: nothing to certify
        if row.heartbeat.gone_counter == row.heartbeat.counter:
            return True  # declared at this very counter already (an earlier pass): no second write
        if self._rows.declare_gone(worker_id, row.heartbeat.counter):
            return True
        log.info("worker %s beat again as it was declared gone: it keeps its leases", worker_id)
        return False

    def scan(self) -> list[WorkerMetricStats]:
        """The tick's read: every worker item, eventually consistent (observe the result on the leader's thread)."""
        return self._rows.list_all(consistent=False)


def _signature(view: LivenessView) -> tuple[frozenset[str], tuple[tuple[str, int], ...]]:
    return view.gone, tuple(sorted(view.events.items()))


class FastPath:
    """One tick of the leader's fast path; see the module documentation."""

    def __init__(
        self,
        watch: LivenessWatch,
        assignment: FastAssignment,
        *,
        max_backoff_s: float,
        read_timeout_s: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._watch = watch
        self._read_timeout_s = read_timeout_s
        self._inflight: threading.Event | None = None
        self._assignment = assignment
        self._clock = clock
        # 1 s, doubling up to the full-cycle interval, exact: one leader, one reader.
        self._backoff = Backoff(base_s=min(1.0, max_backoff_s), max_s=max_backoff_s)
        self._failures = 0
        self._handled: tuple[frozenset[str], tuple[tuple[str, int], ...]] | None = None
        self._resume_at = 0.0
        self.ticks = 0
        self.passes = 0

    def note_full_cycle(self) -> None:
        """A full cycle just ran with the current picture: nothing it saw needs a fast pass."""
        self._handled = _signature(self._watch.last_view)

    def tick(self, *, run_number: int) -> AssignmentReport | None:
        """Read, and run a fast pass if warranted; the pass's report, or None."""
        now = self._clock.monotonic()
        if now < self._resume_at:
            return None
        self.ticks += 1
        try:
            rows = self._bounded_read()
            if rows is None:
                self._back_off(now, f"fast path read still running after {self._read_timeout_s:.1f} s")
                return None
            view = self._watch.observe(rows)
            signature = _signature(view)
            if self._handled is None:  # first tick of this leader: the full cycle that just ran saw the same
                self._handled = signature
                return None
            if not self._needs_pass(signature):
                # Forget what is no longer so (a gone worker that came back can be noticed going again).
                self._handled = signature
                self._failures = 0
                return None
            report = self._assignment.run(run_number=run_number, fast=True)
        except DependencyError as exc:
            self._back_off(now, f"fast path failed: {exc}")
            return None
        self._handled = signature
        self._failures = 0
        self.passes += 1
        return report

    def _back_off(self, now: float, why: str) -> None:
        self._failures += 1
        delay = self._backoff.delay_s(self._failures)
        self._resume_at = now + delay  # from the tick's start, as the failed tick would have been
        log.warning("%s (fast path backs off %.0f s; full cycles go on)", why, delay)

    def _bounded_read(self) -> list[WorkerMetricStats] | None:
        """The worker-metrics scan on a daemon thread, waited for at most ``read_timeout_s`` (real time: the wait
        guards the leader loop against botocore's retries, whatever clock the leader runs on). None while it runs."""
        if self._inflight is not None and not self._inflight.is_set():
            return None  # the previous read is still being retried
        done = threading.Event()
        box: dict[str, object] = {}

        def read() -> None:
            try:
                box["value"] = self._watch.scan()
            except BaseException as exc:  # handed to the leader loop below
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=read, name="leader-fast-read", daemon=True).start()
        if not done.wait(self._read_timeout_s):
            self._inflight = done
            return None
        self._inflight = None
        error = box.get("error")
        if isinstance(error, BaseException):
            raise error
        return box["value"]  # type: ignore[return-value]

    def _needs_pass(self, signature: tuple[frozenset[str], tuple[tuple[str, int], ...]]) -> bool:
        assert self._handled is not None
        gone, events = signature
        handled_gone, handled_events = self._handled
        if gone - handled_gone:
            return True
        before = dict(handled_events)
        return any(before.get(worker) not in (None, count) for worker, count in events)
