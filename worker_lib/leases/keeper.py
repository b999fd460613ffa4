"""The one lease keeper: what every holder of leases does — a worker's
:class:`~worker_lib.worker.coordinator.LeaseCoordinator` and the Spark source's driver alike.

A :class:`LeaseKeeper` owns the holder's :class:`~worker_lib.leases.renewer.LeaseHolder` (every conditional write to a
held lease, the self-fence), its heartbeat (docs/failover.md), its view of the stored liveness mode
(docs/liveness-modes.md) and one thread that, in a loop on the injected clock:

* follows the stored liveness mode (renewing in ``lease`` mode, not in ``worker`` mode);
* takes nothing before the first heartbeat landed, and nothing while the heartbeat fence has run out;
* renews every held lease each renewer interval (``lease`` mode), or writes a lease's throughput only when it
  changed (``worker`` mode);
* discovers leases assigned to it: at once for the keys a heartbeat brought in the leader's notice, else every
  discovery interval (an index query), and hands each lease it took to the owner (``on_taken``);
* once :meth:`depart` was called, takes nothing more but keeps renewing what is still held, until :meth:`stop`.

Departure is the owner's sequence of :meth:`depart` (``DEPARTING``: the leader assigns nothing more), giving leases
up (:meth:`give_up`, :meth:`give_up_undiscovered`), :meth:`stop` and :meth:`leave` (fence, then ``STOPPED``).

Where the worker and the driver differ, it is a :class:`KeeperOptions` field, chosen and documented there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from worker_lib.core.clock import Clock
from worker_lib.core.errors import DependencyError
from worker_lib.core.models import Lease, WorkerState
from worker_lib.core.streams import stream_name_of
from worker_lib.leases.config import LeaseConfig
from worker_lib.leases.heartbeat import HeartbeatLoop, HeartbeatSink
from worker_lib.leases.mode import LivenessMode, StoredMode
from worker_lib.leases.mode_store import LivenessModeSource, ModeFollower
from worker_lib.leases.renewer import LeaseDiscoverer, LeaseHolder, RenewalReport
from worker_lib.leases.store import LeaseStore

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.2
"""The longest the keeper's thread sleeps between looks (a stop, a notice or a mode change is seen within it)."""

GATED_WAIT_S = 0.05
"""The sleep while waiting for the first beat, or for a beat after the fence ran out."""


class AssignmentNotices(Protocol):
    def notify_assigned(self, worker_id: str, lease_keys: list[str]) -> bool: ...


class WorkerRow(HeartbeatSink, AssignmentNotices, Protocol):
    """The holder's own worker-metrics row: its heartbeat, and the notices it sends a hand-off's new owner."""


class ThroughputTracker(Protocol):
    """Per-lease throughput for the leader (KCL's throughputKBps, docs/kcl-compatibility.md): bytes in, KBps out at
    each renewal."""

    def record(self, lease_key: str, nbytes: int) -> None: ...

    def renewal_value(self, lease_key: str) -> float | None: ...

    def seed(self, lease_key: str, kbps: float | None) -> None: ...

    def forget(self, lease_key: str) -> None: ...


@dataclass(frozen=True, kw_only=True)
class KeeperOptions:
    """Where a worker and the Spark driver keep leases differently, on purpose.

    discovery_interval_s: seconds between index queries for leases assigned to us, given whether the leader's
      notices are known to arrive. A worker: its configured interval, else KCL's 9.975 s until a notice was seen
      and a 60 s safety net from then on (``WorkerConfig.discovery_interval_s``); the driver: its fixed
      ``discovery_interval_ms`` option (a query's batches should see a new lease at the next trigger, not a minute
      later).
    max_parallel_takes: how many leases found at once are taken in parallel (each take is one conditional write;
      at a start every lease is found at once). 8 for both.
    on_superseded: what the owner does once a newer process under its worker id beat (the heartbeat has already
      fenced it and stopped beating): the driver stops coordinating, a worker shuts down (its ``run()`` returns).
    """

    discovery_interval_s: Callable[[bool], float]
    max_parallel_takes: int = 8
    on_superseded: Callable[[], None] | None = None


def heartbeat_loop(
    config: LeaseConfig,
    sink: HeartbeatSink,
    worker_id: str,
    *,
    holder: LeaseHolder,
    on_notice: Callable[[tuple[str, ...] | None], None],
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


class LeaseKeeper:
    """Renewal, discovery, notices, the fence and the departure of one holder of leases (see the module)."""

    def __init__(
        self,
        store: LeaseStore,
        row: WorkerRow,
        worker_id: str,
        *,
        config: LeaseConfig,
        options: KeeperOptions,
        modes: LivenessModeSource | None,
        who: str,
        default_stream: str,
        clock: Clock,
        throughput: ThroughputTracker | None = None,
        on_taken: Callable[[Lease], None] | None = None,
        on_renewed: Callable[[RenewalReport | None], None] | None = None,
        on_tick: Callable[[], None] | None = None,
        in_use: Callable[[str], bool] | None = None,
    ) -> None:
        """``row``: the holder's worker-metrics row (heartbeat, notices); ``who`` names the holder in log lines;
        ``default_stream``: the stream of a lease whose key names none (``""`` when the application has several:
        such a lease is not taken); ``on_taken``: a lease was taken (start working on it); ``on_renewed``: every
        renewer interval, with the renewal's report (``None`` in ``worker`` mode, where nothing is renewed);
        ``on_tick``: every pass of the loop while leases may be held and taken, fenced or not (the owner's own
        upkeep: reaping ended work, flushing metrics); ``in_use``: whether the owner still works on a
        lease it no longer holds (it is neither taken again nor handed over until that ends)."""
        self.worker_id = worker_id
        self._store = store
        self._row = row
        self._config = config
        self._options = options
        self._clock = clock
        self._default_stream = default_stream
        self._throughput = throughput
        self._on_taken = on_taken
        self._on_renewed = on_renewed
        self._on_tick = on_tick
        self._in_use = in_use
        self._notices = NoticeBox()
        self.holder = LeaseHolder(
            store,
            worker_id,
            config=config,
            clock=clock,
            throughput=throughput.renewal_value if throughput is not None else None,
            on_release=self._released,
            in_use=in_use,
        )
        self.heartbeat = heartbeat_loop(
            config,
            row,
            worker_id,
            holder=self.holder,
            on_notice=self._notices.put,
            clock=clock,
            on_superseded=options.on_superseded,
        )
        self._modes = ModeFollower(
            modes,
            setting=config.liveness_mode,
            check_interval_s=config.mode_check_interval_ms / 1000,
            who=who,
            clock=clock,
        )
        self._discoverer = LeaseDiscoverer(store, worker_id)
        self._taking = threading.Event()
        self._taking.set()
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._discovered_at: float | None = None  # monotonic time of the last index query
        self.renewal_failures = 0

    # --- state ------------------------------------------------------------------------------------------------

    @property
    def liveness(self) -> StoredMode:
        """The liveness mode followed (``lease`` until one was read)."""
        return self._modes.current

    @property
    def started(self) -> bool:
        """Whether :meth:`start` ran (a departure is then announced)."""
        return self._started

    def held_keys(self) -> list[str]:
        return self.holder.held_keys()

    @property
    def may_take(self) -> bool:
        """Whether a lease may be taken now: the first beat landed, the fence holds and no departure began."""
        if not self._taking.is_set() or self.holder.fenced:
            return False
        return self.heartbeat is None or self.heartbeat.established.is_set()

    def wait_to_take(self) -> bool:
        """Wait (on the injected clock) while leases may not be taken only because the first beat has not landed or a
        predecessor under our worker id may still hold leases — at most until our beats must have found it stood
        down (its two beats and a margin, :class:`~worker_lib.leases.heartbeat.HeartbeatLoop`, then one of ours).
        True if leases may be taken now."""
        heartbeat = self.heartbeat
        if heartbeat is None or not self._taking.is_set():
            return self.may_take
        deadline = self._clock.monotonic() + 3 * heartbeat.interval_ms / 1000 + 1.0
        while not heartbeat.established.is_set() and not heartbeat.superseded.is_set():
            if self._clock.monotonic() >= deadline:
                break
            self._clock.sleep(GATED_WAIT_S)
        return self.may_take

    # --- lifecycle --------------------------------------------------------------------------------------------

    def start_heartbeat(self, *, beat_now: bool = False) -> None:
        """Read the liveness mode (a configured one that disagrees raises
        :class:`~worker_lib.leases.mode.LivenessModeMismatchError`), then beat — once from this thread first if
        ``beat_now`` (the caller wants to take leases before returning) — and on the heartbeat's own thread."""
        apply_liveness_mode(self._modes.start(), self.holder, self.heartbeat, self._config)
        if self.heartbeat is not None:
            if beat_now:
                self.heartbeat.beat()
            self.heartbeat.start()

    def start(self, *, name: str) -> None:
        """Start the keeper's thread (renewals are first due one renewer interval from now: a lease is renewed by
        its take)."""
        self._started = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def depart(self) -> None:
        """Say ``DEPARTING`` (the leader assigns nothing more to us) and take nothing more; what is held keeps
        being renewed until :meth:`stop`."""
        self._taking.clear()
        if self.heartbeat is not None and self.started:
            self.heartbeat.announce(WorkerState.DEPARTING)

    def give_up(self, keys: Iterable[str]) -> None:
        """Give these held leases up at once (conditional on the counter we hold: a successor's take is never
        undone)."""
        for key in keys:
            self.holder.evict(key)

    def give_up_undiscovered(self) -> None:
        """Leases the leader assigned to us that we never took: hand them back now rather than let them expire (the
        eviction is conditional on the owner still being us, so it cannot take anything away)."""
        try:
            leases = self._discoverer.discover(set(self.holder.held_keys()))
        except DependencyError as exc:
            log.warning("could not list leases assigned to %s at shutdown: %s", self.worker_id, exc)
            return
        for lease in leases:
            try:
                self._store.evict_lease(lease, self.worker_id)
            except DependencyError as exc:
                log.warning("could not give up lease=%s at shutdown: %s", lease.lease_key, exc)

    def stop(self, timeout_s: float) -> None:
        """End the keeper's thread (renewals stop)."""
        self._ended.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(max(0.0, timeout_s))

    def leave(self, reason: str) -> None:
        """Fence first, then say so: whatever is still held may move at once once the leader reads ``STOPPED``."""
        if self.heartbeat is not None and self.started:
            self.holder.fence_all(reason)
            self.heartbeat.stop()
            self.heartbeat.announce(WorkerState.STOPPED)

    def close(self) -> None:
        self.holder.close()

    def note_event(self) -> None:
        """Something the leader should look at soon (child leases created): the next beat bumps ``evc``."""
        if self.heartbeat is not None:
            self.heartbeat.note_event()

    def notice(self) -> None:
        """Look again at what the table assigns us (a full discovery at the next pass)."""
        self._notices.put(None)

    # --- taking -----------------------------------------------------------------------------------------------

    def discover(self, keys: Sequence[str] | None = None) -> None:
        """Take the leases assigned to us: ``keys`` (the leader's notice named them), else the index's answer."""
        if not self.may_take:
            return
        held = set(self.holder.held_keys())
        if keys is None:
            candidates: Sequence[str] = self._store.list_lease_keys_for_owner(self.worker_id)
            self._discovered_at = self._clock.monotonic()
        else:
            candidates = keys
        if self._in_use is not None:
            held |= {key for key in candidates if self._in_use(key)}
        found = [lease for lease in self._discoverer.discover_keys(candidates, held) if self._takeable(lease)]
        if len(found) > 1 and self._options.max_parallel_takes > 1:
            workers = min(self._options.max_parallel_takes, len(found))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"take-{self.worker_id}") as pool:
                list(pool.map(self._take, found))
        else:
            for lease in found:
                self._take(lease)

    def _takeable(self, lease: Lease) -> bool:
        if stream_name_of(lease.lease_key, self._default_stream):
            return True
        # A bare shard-id key in an application of several streams: no way to tell which stream it reads.
        log.warning("lease %s names no stream and %s reads several: not taken", lease.lease_key, self.worker_id)
        return False

    def _take(self, lease: Lease) -> None:
        if not self._taking.is_set():
            return
        if self._throughput is not None:
            self._throughput.seed(lease.lease_key, lease.throughput_kbps)
        if self.holder.take(lease) and self._on_taken is not None:
            self._on_taken(lease)

    def _released(self, lease_key: str, new_owner: str | None) -> None:
        """A lease left us: after a graceful hand-off the new owner may start now — it gets the notice directly;
        either way our next beat (``evc``) wakes the leader, which moves the lease on if its receiver left
        meanwhile."""
        if self.heartbeat is None:
            return
        if new_owner is not None:
            try:
                self._row.notify_assigned(new_owner, [lease_key])
            except DependencyError as exc:
                log.warning("could not notify %s of lease %s: %s", new_owner, lease_key, exc)
        self.heartbeat.note_event()

    # --- the thread -------------------------------------------------------------------------------------------

    def _run(self) -> None:
        config = self._config
        renew_s = config.renewer_interval_ms / 1000
        throughput_s = config.throughput_update_interval_ms / 1000
        now = self._clock.monotonic()
        next_renewal, next_throughput = now + renew_s, now + throughput_s
        # An owner that took its leases before starting the thread (the driver) has just queried the index.
        next_discovery = now if self._discovered_at is None else self._discovered_at + self._discovery_interval_s()
        while not self._ended.is_set():
            now = self._clock.monotonic()
            wait, upkeep = IDLE_WAIT_S, True
            try:
                changed = self._modes.poll()
                if changed is not None and apply_liveness_mode(changed, self.holder, self.heartbeat, config):
                    next_renewal = now
                if not self._taking.is_set():
                    # Departing: nothing new, but what is held keeps being renewed (in worker mode: the heartbeat
                    # keeps it), so that a slow final checkpoint is not lost to expiry.
                    if now >= next_renewal and self.holder.renewing:
                        next_renewal = now + renew_s
                        self._renew()
                    wait, upkeep = next_renewal - now, False
                elif self.heartbeat is not None and not self.heartbeat.established.is_set():
                    next_discovery = now  # nothing is taken before the first beat landed; look as soon as one has
                    wait, upkeep = GATED_WAIT_S, False
                elif self.holder.fenced:
                    # Every lease is invalid and nothing may be taken until a beat lands (the heartbeat loop then
                    # asks for a look at what is still ours).
                    wait = GATED_WAIT_S
                else:
                    if now >= next_renewal:
                        next_renewal = now + renew_s
                        if self.holder.renewing:
                            self._renew()
                        elif self._on_renewed is not None:
                            self._on_renewed(None)
                    if now >= next_throughput:
                        next_throughput = now + throughput_s
                        if not self.holder.renewing:  # worker mode: throughput rides on no renewal
                            self.holder.refresh_throughput()
                    noticed = self._notices.take()
                    if noticed is not None and now < next_discovery:
                        if noticed:
                            self.discover(keys=noticed)
                        else:
                            next_discovery = now
                    if now >= next_discovery:
                        next_discovery = now + self._discovery_interval_s()
                        self.discover()
                    wait = min(next_renewal, next_discovery) - self._clock.monotonic()
            except DependencyError as exc:
                log.warning("lease keeping of %s failed a step: %s", self.worker_id, exc)
            except Exception:
                log.exception("lease keeping of %s raised", self.worker_id)
            if upkeep and self._on_tick is not None:
                try:
                    self._on_tick()
                except Exception:
                    log.exception("upkeep of %s raised", self.worker_id)
            self._clock.sleep(min(max(0.0, wait), IDLE_WAIT_S))

    def _discovery_interval_s(self) -> float:
        return self._options.discovery_interval_s(self.heartbeat is not None and self.heartbeat.notices_seen)

    def _renew(self) -> None:
        try:
            report = self.holder.renew_all()
        except DependencyError as exc:
            log.warning("renewals of %s failed: %s", self.worker_id, exc)
            return
        self.renewal_failures += len(report.failed)
        if self._on_renewed is not None:
            self._on_renewed(report)
