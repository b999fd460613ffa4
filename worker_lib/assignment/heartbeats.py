"""Worker liveness from heartbeats, judged by the leader (pure; docs/failover.md has the safety argument).

A heartbeating worker (``hbc``/``hbt``/``hbi``/``wst`` in its worker-metrics item) is

* **departing** when it says ``DEPARTING``: it is shutting down, gives its leases up itself, and gets nothing more;
* **gone** when it says ``STOPPED`` (it fenced itself before writing that), or when its heartbeat counter has
  stood still for longer than the failover time. The worker stops processing every lease once its own last beat is
  that old (:meth:`~worker_lib.leases.renewer.LeaseHolder.heartbeat_succeeded`), so the leader may move a gone
  worker's leases without watching each lease's counter — after confirming with a consistent read of the worker's
  item taken *after* it read the leases it will move (:class:`HeartbeatTracker.still_gone`).

"Stood still" is observed on the leader's monotonic clock, like lease expiry: a counter value is dated when this
leader first saw it. A leader that sees a worker for the first time (a new term, a new Lambda invocation) dates the
value it reads by the worker's own stamp instead: ``hbt`` + the clock-skew bound, mapped onto its monotonic clock —
so a new leader can judge a worker that died before it took over at once, relying on the same bound on wall-clock
disagreement as the leader lock (docs/leader-lock.md). Workers without heartbeat attributes (KCL workers, or
heartbeats turned off) are judged per lease only, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from worker_lib.core.models import WorkerMetricStats, WorkerState


@dataclass(frozen=True, kw_only=True)
class LivenessView:
    """What the leader knows about heartbeating workers at one moment."""

    departing: frozenset[str] = frozenset()
    """Announced their shutdown: assign them nothing; their leases are theirs until they give them up."""
    gone: frozenset[str] = frozenset()
    """Stopped or silent past the failover time: assign them nothing; their leases may move (after confirmation)."""
    heartbeating: frozenset[str] = frozenset()
    """Every worker with heartbeat attributes."""
    events: dict[str, int] = field(default_factory=dict)
    """Each heartbeating worker's ``evc``: a change means it released or created leases."""

    @property
    def excluded(self) -> frozenset[str]:
        return self.departing | self.gone


@dataclass(frozen=True)
class _Seen:
    counter: int
    since: float  # leader-monotonic time from which the counter is known to have stood still


class HeartbeatTracker:
    """Observations of heartbeat counters on the leader's monotonic clock."""

    def __init__(self, *, failover_s: float, max_clock_skew_s: float) -> None:
        if failover_s <= 0:
            raise ValueError("failover_s must be positive")
        if max_clock_skew_s < 0:
            raise ValueError("max_clock_skew_s must not be negative")
        self._failover_s = failover_s
        self._skew_s = max_clock_skew_s
        self._seen: dict[str, _Seen] = {}

    def _note(self, worker: WorkerMetricStats, now_mono: float, now_wall: float) -> _Seen | None:
        beat = worker.heartbeat
        if beat is None:
            self._seen.pop(worker.worker_id, None)
            return None
        previous = self._seen.get(worker.worker_id)
        if previous is not None and previous.counter == beat.counter:
            return previous
        if previous is None:
            # First sight: the value was sent at the latest at hbt (the worker's wall clock), i.e. at hbt + skew
            # on ours; never later than now.
            age_s = now_wall - (beat.wall_ms / 1000 + self._skew_s)
            since = now_mono - max(0.0, age_s)
        else:
            since = now_mono
        seen = _Seen(beat.counter, since)
        self._seen[worker.worker_id] = seen
        return seen

    def is_gone(self, worker: WorkerMetricStats, now_mono: float) -> bool:
        """STOPPED, or the counter observed unchanged for longer than the failover time (call after observing)."""
        beat = worker.heartbeat
        if beat is None:
            return False
        if beat.state is WorkerState.STOPPED:
            return True
        seen = self._seen.get(worker.worker_id)
        return seen is not None and seen.counter == beat.counter and now_mono - seen.since > self._failover_s

    def observe(self, workers: Iterable[WorkerMetricStats], now_mono: float, now_wall: float) -> LivenessView:
        """Record one read of the worker-metrics table and classify every heartbeating worker."""
        departing: set[str] = set()
        gone: set[str] = set()
        beating: set[str] = set()
        events: dict[str, int] = {}
        present: set[str] = set()
        for worker in workers:
            present.add(worker.worker_id)
            if self._note(worker, now_mono, now_wall) is None:
                continue
            beat = worker.heartbeat
            assert beat is not None
            beating.add(worker.worker_id)
            events[worker.worker_id] = beat.events
            if self.is_gone(worker, now_mono):
                gone.add(worker.worker_id)
            elif beat.state is WorkerState.DEPARTING:
                departing.add(worker.worker_id)
        for worker_id in set(self._seen) - present:
            del self._seen[worker_id]
        return LivenessView(
            departing=frozenset(departing), gone=frozenset(gone), heartbeating=frozenset(beating), events=events
        )

    def still_gone(self, worker: WorkerMetricStats | None, now_mono: float, now_wall: float) -> bool:
        """The confirmation: ``worker`` is a consistent read taken after the leases to move were read. A worker whose
        item vanished or that stopped heartbeating is not confirmed (its leases are judged per lease instead)."""
        if worker is None or worker.heartbeat is None:
            return False
        self._note(worker, now_mono, now_wall)
        return self.is_gone(worker, now_mono)

    def seconds_silent(self, worker_id: str, now_mono: float) -> float | None:
        seen = self._seen.get(worker_id)
        return None if seen is None else now_mono - seen.since
