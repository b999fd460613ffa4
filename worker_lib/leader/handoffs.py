"""The leader's graceful hand-offs in progress, and their deadlines (step 3 of a run of
:class:`~worker_lib.leader.assigner.LeaseAssigner`).

A rebalancing move is a graceful hand-off (``leaseOwner`` = new, ``checkpointOwner`` = old, docs/design.md): the old
owner checkpoints and lets go, and only if it never does does the leader complete the hand-off itself — KCL's rule,
after the hand-off timeout plus the failover time (40 s). That deadline needs a start, and the lease item holds none
(the counter is untouched by a hand-off), so the leader dates each hand-off on its own monotonic clock: from the
write that started it, or from the run that first saw it (a new term, or a hand-off started by another leader). The
dates live for one leadership term (:meth:`HandoffTracker.reset`).

In ``worker`` liveness mode (docs/liveness-modes.md, rule 3) a heartbeating old owner does not renew, so it learns
of the hand-off only from a request on its own worker-metrics item (``hrq``); the deadline then runs from the moment
that request landed, and a hand-off this leader has not requested yet (a new term, a request that failed) is
requested first. This module keeps that state apart from the eight steps of the run, which only ask it to force
what is overdue and to date what it started.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Protocol

from worker_lib.core.clock import Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Lease
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.mode import handoff_request

log = logging.getLogger(__name__)

StartedHandoff = tuple[str, str | None, str | None]
"""``(lease key, new owner, old owner)`` of a hand-off the leader started or has yet to request."""


class HandoffCompleter(Protocol):
    """The one lease-store write the tracker makes (:meth:`~worker_lib.leases.store.LeaseStore.complete_handoff`)."""

    def complete_handoff(self, lease: Lease, old_owner: str) -> Lease | None: ...


class HandoffRequester(Protocol):
    """Where hand-off requests go in ``worker`` mode: the old owner's worker-metrics item
    (:meth:`~worker_lib.workermetrics.stats_store.WorkerMetricsStore.request_handoff`)."""

    def request_handoff(self, worker_id: str, elements: Sequence[str]) -> bool: ...


class HandoffTracker:
    """Dates every graceful hand-off in progress and forces those past the deadline.

    ``decisions`` is the leader's decision log (:data:`~worker_lib.leader.assigner.DECISION_LOGGER`): a forced
    hand-off is a decision like any other and is logged beside the run's writes."""

    def __init__(
        self,
        store: HandoffCompleter,
        requester: HandoffRequester | None,
        *,
        config: LeaseConfig,
        clock: Clock,
        decisions: logging.Logger,
    ) -> None:
        self._store = store
        self._requester = requester
        self._deadline_s = config.handoff_deadline_ms / 1000  # KCL's: the hand-off timeout plus the failover time
        self._timeout_ms = config.graceful_handoff_timeout_ms  # what a request gives the old owner to let go
        self._clock = clock
        self._decisions = decisions
        # lease key → (new owner, old owner, monotonic time the deadline runs from)
        self._seen: dict[str, tuple[str | None, str | None, float]] = {}

    def reset(self) -> None:
        """A new leadership term: another term's dates are not ours to trust (every hand-off is seen afresh)."""
        self._seen.clear()

    def force_overdue(
        self, leases: Sequence[Lease], now: float, *, requested_from: frozenset[str] | None = None
    ) -> list[Lease]:
        """Complete handoffs older than the deadline (the old owner never let go): the new owner starts from the
        last checkpoint. Returns the leases as they are after forcing (to keep the snapshot current).

        ``requested_from`` (``worker`` mode: the heartbeating workers): a hand-off away from one of them counts
        from the moment its request landed on the old owner's item; one this leader has not requested yet is
        requested now (a new term, or a request that failed)."""
        deadline_s = self._deadline_s
        in_progress: dict[str, tuple[str | None, str | None, float]] = {}
        forced: list[Lease] = []
        unrequested: list[StartedHandoff] = []
        for lease in leases:
            if not lease.is_handoff_in_progress:
                continue
            identity = (lease.lease_owner, lease.checkpoint_owner)
            seen = self._seen.get(lease.lease_key)
            if (
                requested_from is not None
                and lease.checkpoint_owner in requested_from
                and (seen is None or seen[:2] != identity)
            ):
                unrequested.append((lease.lease_key, lease.lease_owner, lease.checkpoint_owner))
                continue
            first = seen[2] if seen is not None and seen[:2] == identity else now
            in_progress[lease.lease_key] = (*identity, first)
            if now - first <= deadline_s:
                continue
            old_owner = lease.checkpoint_owner
            assert old_owner is not None
            done = self._store.complete_handoff(lease, old_owner)
            self._decisions.info(
                json.dumps(
                    {
                        "lease": lease.lease_key,
                        "from": old_owner,
                        "to": lease.lease_owner,
                        "kind": "force_handoff",
                        "reason": f"graceful handoff not completed within {deadline_s:.0f} s",
                        "written": done is not None,
                    },
                    sort_keys=True,
                )
            )
            if done is not None:
                forced.append(done)
                in_progress.pop(lease.lease_key, None)
        self._seen = in_progress
        self.started(unrequested, requested_from=requested_from)
        return forced

    def started(self, handoffs: Sequence[StartedHandoff], *, requested_from: frozenset[str] | None) -> None:
        """Date each started hand-off ``(lease, new owner, old owner)`` for the deadline. In ``worker`` mode a
        heartbeating old owner is asked on its own item first, and the deadline runs from that write: its worker
        keeps the lease at most the request's timeout after the first beat that sees it, and that beat comes
        within the failover time (or the worker has fenced itself) — so forcing after timeout + failover is safe.
        A request that fails is retried by the next run."""
        by_old_owner: dict[str, list[tuple[str, str | None]]] = {}
        for lease_key, new_owner, old_owner in handoffs:
            if requested_from is not None and old_owner is not None and old_owner in requested_from:
                by_old_owner.setdefault(old_owner, []).append((lease_key, new_owner))
            else:
                self._seen[lease_key] = (new_owner, old_owner, self._clock.monotonic())
        timeout_ms = self._timeout_ms
        for old_owner, items in sorted(by_old_owner.items()):
            elements = [handoff_request(lease_key, timeout_ms) for lease_key, _ in items]
            try:
                requested = self._requester is not None and self._requester.request_handoff(old_owner, elements)
            except DependencyError as exc:
                log.warning("could not ask %s for %d hand-off(s): %s", old_owner, len(items), exc)
                continue
            if not requested:
                log.warning("could not ask %s for %d hand-off(s): it has no item", old_owner, len(items))
                continue
            landed = self._clock.monotonic()
            for lease_key, new_owner in items:
                self._seen[lease_key] = (new_owner, old_owner, landed)
