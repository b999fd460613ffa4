"""The leader's side of the liveness mode (docs/liveness-modes.md; the rules are in :mod:`worker_lib.leases.mode`).

At every full run the leader reads the ``LivenessMode`` item (recording its configured mode first if none is stored)
and judges by it: per lease counter (``lease``) or, for heartbeating owners, per owner (``worker``, or a switch
either way). After the run it completes a switch when that is safe:

* ``lease → worker`` at once: this run already judged per owner, and workers stop renewing only once they read
  ``mode = worker``;
* ``worker → lease`` once every live heartbeating worker says (``lvm``) that it renews. The leader then forgets
  its counter observations first — every lease gets a full failover time from now, longer than any worker's
  validity from the moment it started renewing — and only then writes ``mode = lease``.

A failed read fails the run (``DependencyError``): a leader that does not know the mode must not judge leases by
their counters. Until the mode has been read in the current term (a fast pass between a failed first run and the
next one), :attr:`LeaderModeKeeper.judging` is per owner: safe in both modes, because a heartbeating worker fences
itself by its heartbeat in both (docs/failover.md) — at worst a lease whose renewals fail waits for the next run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from worker_lib.core.errors import CorruptItemError, DependencyError
from worker_lib.core.models import WorkerMetricStats
from worker_lib.leases.mode import LEASE_MODE, LivenessMode, StoredMode, initial_mode

log = logging.getLogger(__name__)

UNKNOWN_MODE = StoredMode(mode=LivenessMode.LEASE, target=LivenessMode.WORKER)
"""Judged as during a switch to ``worker``: heartbeating owners per owner (safe in either mode), others by counter."""


class LivenessModeRecords(Protocol):
    def read(self) -> StoredMode | None: ...

    def record_if_absent(self, mode: LivenessMode, *, by: str) -> StoredMode: ...

    def complete(self, expected: StoredMode, *, by: str) -> bool: ...


def workers_still_not_renewing(workers: Iterable[WorkerMetricStats], gone: frozenset[str]) -> list[str]:
    """Live heartbeating workers that say they run in ``worker`` mode (do not renew)."""
    return sorted(
        w.worker_id for w in workers if w.heartbeat is not None and w.worker_id not in gone and not w.heartbeat.renews
    )


class LeaderModeKeeper:
    """Reads, records and completes the liveness mode for one leader."""

    def __init__(self, records: LivenessModeRecords | None, *, setting: str, owner: str = "leader") -> None:
        self._records = records
        self._setting = setting
        self._owner = owner
        self.current = LEASE_MODE
        self._known = records is None

    @property
    def judging(self) -> StoredMode:
        """What to judge by now: the mode read in this term, or — not read yet — per owner."""
        return self.current if self._known else UNKNOWN_MODE

    def new_term(self) -> None:
        """A new leadership term: the mode must be read again before leases are judged by counter."""
        self._known = self._records is None

    def begin_run(self) -> StoredMode:
        """Read the stored mode before judging (record ours if none is stored)."""
        if self._records is None:
            return self.current
        try:
            stored = self._records.read()
            if stored is None:
                stored = self._records.record_if_absent(initial_mode(self._setting), by=self._owner)
        except CorruptItemError as exc:
            raise DependencyError(f"cannot judge leases: {exc}") from exc
        if stored != self.current:
            log.info("liveness mode: %s", stored.describe())
        self.current = stored
        self._known = True
        return stored

    def after_run(
        self, workers: Iterable[WorkerMetricStats], gone: frozenset[str], *, forget: Callable[[], None]
    ) -> None:
        """Complete a switch that is safe to complete (``forget``: drop the counter observations first)."""
        stored = self.current
        if self._records is None or stored.target is None:
            return
        if stored.target is LivenessMode.LEASE:
            waiting = workers_still_not_renewing(workers, gone)
            if waiting:
                log.info(
                    "switch to lease mode: waiting for %d worker(s) to renew: %s", len(waiting), ", ".join(waiting[:5])
                )
                return
            forget()
        try:
            done = self._records.complete(stored, by=self._owner)
        except DependencyError as exc:
            log.warning("could not complete the switch to liveness mode %s: %s", stored.target.value, exc)
            return
        if done:
            self.current = StoredMode(mode=stored.target)
            log.info("liveness mode switched to %s", stored.target.value)
