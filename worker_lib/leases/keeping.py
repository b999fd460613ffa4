"""What every holder of leases does the same way — a worker's :class:`~worker_lib.worker.coordinator.LeaseCoordinator`
and the Spark source's driver: run in the stored liveness mode, collect the leader's notices from the heartbeat
thread, tell the new owner of a hand-off, and hand back leases assigned but never taken."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from worker_lib.core.clock import Clock
from worker_lib.core.errors import DependencyError
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.heartbeat import HeartbeatLoop, HeartbeatSink, NoticeCallback
from worker_lib.leases.mode import LivenessMode, StoredMode
from worker_lib.leases.mode_store import LivenessModeSource, ModeFollower
from worker_lib.leases.renewer import LeaseDiscoverer, LeaseHolder
from worker_lib.leases.store import LeaseStore

log = logging.getLogger(__name__)


class AssignmentNotices(Protocol):
    def notify_assigned(self, worker_id: str, lease_keys: list[str]) -> bool: ...


def heartbeat_loop(
    config: LeaseConfig,
    sink: HeartbeatSink,
    worker_id: str,
    *,
    holder: LeaseHolder,
    on_notice: NoticeCallback,
    clock: Clock,
    on_superseded: Callable[[], None] | None = None,
) -> HeartbeatLoop | None:
    """The heartbeat of a lease holder, fenced by ``holder``; ``None`` when the configuration turns it off. It starts
    at the ``lease`` mode's interval; :func:`apply_liveness_mode` sets the mode's own."""
    if not config.heartbeat_enabled:
        return None
    return HeartbeatLoop(
        sink,
        worker_id,
        interval_ms=config.heartbeat_interval_for(LivenessMode.LEASE),
        fence=holder,
        on_notice=on_notice,
        # in worker mode, silent for longer than the failover time once fenced (see HeartbeatLoop)
        quiet_after_lapse_ms=config.quiet_after_lapse_ms,
        on_superseded=on_superseded,
        clock=clock,
    )


def mode_follower(config: LeaseConfig, source: LivenessModeSource | None, *, who: str, clock: Clock) -> ModeFollower:
    """The holder's view of the stored liveness mode, with the configured setting and re-read interval."""
    return ModeFollower(
        source,
        setting=config.liveness_mode,
        check_interval_s=config.mode_check_interval_ms / 1000,
        who=who,
        clock=clock,
    )


def apply_liveness_mode(
    stored: StoredMode, holder: LeaseHolder, heartbeat: HeartbeatLoop | None, config: LeaseConfig
) -> bool:
    """Renew or not, and beat at the mode's interval saying which (docs/liveness-modes.md); True if renewals
    (re)started and are due at once. Without a heartbeat only renewing is safe."""
    renew = stored.workers_renew or heartbeat is None
    started = renew and not holder.renewing
    holder.set_renewing(renew)
    if heartbeat is not None:
        mode = LivenessMode.LEASE if renew else LivenessMode.WORKER
        heartbeat.set_interval_ms(config.heartbeat_interval_for(mode))
        heartbeat.liveness = mode.value  # after set_renewing: a beat saying "lease" comes after it
    return started


class NoticeBox:
    """The leader's notices, from the heartbeat thread to the thread that discovers leases."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._keys: set[str] = set()
        self._full = False

    def put(self, keys: tuple[str, ...] | None) -> None:
        """The leader assigned us leases (``None``: announced without keys — ask the index which)."""
        with self._guard:
            if keys is None:
                self._full = True
            else:
                self._keys.update(keys)

    def take(self) -> list[str] | None:
        """What to discover now: keys, ``[]`` for a full discovery, ``None`` for nothing."""
        with self._guard:
            if self._full:
                self._full = False
                self._keys.clear()
                return []
            if not self._keys:
                return None
            keys = sorted(self._keys)
            self._keys.clear()
            return keys


def released(
    lease_key: str, new_owner: str | None, *, notices: AssignmentNotices, heartbeat: HeartbeatLoop | None
) -> None:
    """A lease left us: after a graceful hand-off the new owner may start now — it gets the notice directly; either
    way our next beat (``evc``) wakes the leader, which moves the lease on if its receiver left meanwhile."""
    if heartbeat is None:
        return
    if new_owner is not None:
        try:
            notices.notify_assigned(new_owner, [lease_key])
        except DependencyError as exc:
            log.warning("could not notify %s of lease %s: %s", new_owner, lease_key, exc)
    heartbeat.note_event()


def give_up_undiscovered(holder: LeaseHolder, discoverer: LeaseDiscoverer, store: LeaseStore, worker_id: str) -> None:
    """Leases the leader assigned to us that we never took: hand them back now rather than let them expire (the
    eviction is conditional on the owner still being us, so it cannot take anything away)."""
    try:
        leases = discoverer.discover(set(holder.held_keys()))
    except DependencyError as exc:
        log.warning("could not list leases assigned to %s at shutdown: %s", worker_id, exc)
        return
    for lease in leases:
        try:
            store.evict_lease(lease, worker_id)
        except DependencyError as exc:
            log.warning("could not give up lease=%s at shutdown: %s", lease.lease_key, exc)
