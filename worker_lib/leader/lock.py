"""The leader lock: one item ``key = "Leader"`` in ``<app>-CoordinatorState``, in the format of KCL's DynamoDB lock
client (``ownerName``, ``leaseDuration`` (S, ms), ``recordVersionNumber`` (a new UUID on every write), and
``isReleased = "1"`` only once released) plus our ``expiresAtMillis``, ``lastUpdatedMillis`` and, for a holder that
will release at a known time (a Lambda invocation), ``releaseAtMillis`` — so that the next invocation can wait for
it instead of leaving a gap.

Rules (docs/leader-lock.md explains the choices):

* **Acquire** reads the item and writes a new one conditioned on exactly what it read (``attribute_not_exists``
  or ``recordVersionNumber = :observed``), so among any number of contenders exactly one write lands.
  A held lock may be taken only when it is *expired*: released, or ``now > expiresAtMillis + max_clock_skew`` on
  the contender's wall clock, or — for an item KCL wrote, which has no ``expiresAtMillis`` — when the contender has
  watched the same ``recordVersionNumber`` for a full ``leaseDuration`` on its own monotonic clock (KCL's rule).
* **Heartbeat** and **release** are conditional on ``ownerName = me AND recordVersionNumber = my last``; a paused
  holder that wakes after being replaced fails both and changes nothing. A write whose reply was lost is
  recognised by re-reading (the item then carries the version we sent).
* **is_leader()** is local and conservative: true until ``sent + leaseDuration − max_clock_skew`` on this host's
  monotonic clock, where ``sent`` is when the last successful acquire/heartbeat was *sent*. With wall clocks within
  ``max_clock_skew`` of each other, a holder stops acting as leader before any contender can take the lock.

Nothing here is the last line of defence: every lease write the leader makes is conditional anyway.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import botocore.exceptions

from worker_lib.core import aws
from worker_lib.core.clock import wall_millis
from worker_lib.leader.config import LeaderLockConfig
from worker_lib.tables.coordinator_items import (
    KEY,
    LOCK_KEY,
    LockRecord,
    lock_acquire_condition,
    lock_item,
    lock_update,
    parse_lock,
)
from worker_lib.tables.schema import ItemPlace, TableLayout
from worker_lib.tables.store import StoreOptions, TableStore

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; annotations only, so 3.10 runs this module

    pass

log = logging.getLogger(__name__)

_BOTO_ERRORS = (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)


@runtime_checkable
class LeaderLock(Protocol):
    owner: str

    def try_acquire(self) -> bool:
        """One attempt: True if this host holds the lock afterwards."""

    def acquire(self, timeout_s: float) -> bool:
        """Attempt every poll interval until held or ``timeout_s`` passed."""

    def heartbeat(self) -> bool:
        """Extend the lock; False if it is no longer ours."""

    def release(self) -> bool:
        """Give the lock up so that the next contender takes it at once."""

    def is_leader(self) -> bool:
        """Local judgement, no I/O: may this host act as leader now?"""

    def current_leader(self) -> str | None:
        """Who holds an unexpired lock (one read), or None."""

    def last_seen_holder(self) -> str | None:
        """The holder of an unexpired lock as the last read saw it (no I/O); None if free or never read."""

    def holder_is_foreign(self) -> bool:
        """Whether that holder wrote the lock in the lock client's own format (a KCL worker), not ours (no I/O)."""

    def plan_release(self, wall_ms: int | None) -> None:
        """Announce (with the next acquire or heartbeat) when this holder will release the lock; None: unknown."""

    def takeover_eta_s(self) -> float | None:
        """Seconds until the current holder releases the lock or its lock expires (one read); 0 when it is free
        now; None when that cannot be told (an item written by KCL)."""


class DynamoDBLeaderLock(TableStore):
    @classmethod
    def place(cls, app: str, layout: TableLayout) -> ItemPlace:
        # KCL 3.5's single-table mode keeps the lock in the lease table (leaseKey = "Leader", entityType LEADER).
        return layout.coordinator(app)

    def __init__(
        self,
        app: str,
        owner: str,
        *,
        config: LeaderLockConfig | None = None,
        **store: Unpack[StoreOptions],
    ) -> None:
        if not owner:
            raise ValueError("a lock owner name is required")
        super().__init__(app, **store)
        self.owner = owner
        self._config = config or LeaderLockConfig()
        self._version: str | None = None  # the recordVersionNumber of our last successful write
        self._sent_at: float | None = None  # monotonic send time of that write
        self._watched: tuple[str, float] | None = None  # (version, first seen) for KCL-format items
        self._skew_warned = False
        self._release_at_ms: int | None = None
        self._last_holder: str | None = None
        self._last_holder_foreign = False

    # --- reading --------------------------------------------------------------------------------------------

    def _read(self) -> LockRecord | None:
        with aws.translated("dynamodb GetItem", self.table_name):
            response = self._client.get_item(
                TableName=self.table_name, Key=self._place.key(LOCK_KEY), ConsistentRead=True
            )
        item = response.get("Item")
        return parse_lock(self._place.as_read(item, KEY)) if item else None

    def _check_skew(self, item: LockRecord) -> None:
        """Warn (once) when the item was stamped ahead of our wall clock by more than the skew bound: the writer's
        clock or ours is off, and the bound the lock relies on does not hold."""
        updated = item.updated_ms
        if updated is None or self._skew_warned:
            return
        ahead_ms = updated - wall_millis(self._clock)
        if ahead_ms > self._config.max_clock_skew_ms:
            self._skew_warned = True
            log.warning(
                "leader lock item written %d ms ahead of this host's wall clock (bound %d ms): check NTP / "
                "Amazon Time Sync on owner=%s and writer=%s",
                ahead_ms,
                self._config.max_clock_skew_ms,
                self.owner,
                item.owner,
            )

    def _duration_ms(self, item: LockRecord) -> int:
        return self._config.lease_duration_ms if item.duration_ms is None else item.duration_ms

    def _expired_by_record(self, item: LockRecord) -> bool:
        """Released, or past its written expiry + skew: what one read can tell (no KCL-style watching)."""
        if item.released:
            return True
        expires = item.expires_ms
        return expires is not None and wall_millis(self._clock) > expires + self._config.max_clock_skew_ms

    def _expired(self, item: LockRecord) -> bool:
        if item.released:
            return True
        expires = item.expires_ms
        if expires is not None:
            return wall_millis(self._clock) > expires + self._config.max_clock_skew_ms
        # A KCL-written item (or an unreadable expiry): KCL's rule, on our own monotonic clock.
        version = item.version or ""
        now = self._clock.monotonic()
        if self._watched is None or self._watched[0] != version:
            self._watched = (version, now)
        return now - self._watched[1] >= self._duration_ms(item) / 1000

    def is_leader(self) -> bool:
        if self._sent_at is None:
            return False
        validity_s = (self._config.lease_duration_ms - self._config.max_clock_skew_ms) / 1000
        return self._clock.monotonic() < self._sent_at + validity_s

    def current_leader(self) -> str | None:
        """The owner of the lock item unless it is released or past its written expiry (+ skew); one read. A KCL
        item (no expiry written) is reported as held: only watching its version over time could tell otherwise."""
        item = self._read()
        if item is None or self._expired_by_record(item):
            return None
        return item.owner

    def plan_release(self, wall_ms: int | None) -> None:
        self._release_at_ms = wall_ms

    def last_seen_holder(self) -> str | None:
        return self._last_holder

    def holder_is_foreign(self) -> bool:
        return self._last_holder_foreign

    def takeover_eta_s(self) -> float | None:
        item = self._read()
        if item is None or item.released:
            return 0.0
        expires = item.expires_ms
        if expires is None:
            return None
        now_ms = wall_millis(self._clock)
        eta_ms = expires + self._config.max_clock_skew_ms - now_ms
        release_at = item.release_at_ms
        if release_at is not None:
            eta_ms = min(eta_ms, release_at - now_ms)
        return max(0.0, eta_ms / 1000)

    # --- writing --------------------------------------------------------------------------------------------

    def _new_item(self, version: str) -> dict[str, Any]:
        item = lock_item(
            owner=self.owner,
            version=version,
            duration_ms=self._config.lease_duration_ms,
            now_ms=wall_millis(self._clock),
            release_at_ms=self._release_at_ms,
        )
        return self._place.as_stored(item, KEY)

    def _placed(self, request: dict[str, Any]) -> dict[str, Any]:
        """Request arguments built for the three-table key, with this layout's key attribute."""
        names = request.get("ExpressionAttributeNames")
        if names and names.get("#k") == KEY:
            request = {**request, "ExpressionAttributeNames": {**names, "#k": self._place.key_attr}}
        if "Key" in request:
            request = {**request, "Key": self._place.key(LOCK_KEY)}
        return request

    def _applied(self, version: str) -> bool:
        """After a failed condition: was our own write applied (its reply lost)?"""
        item = self._read()
        return item is not None and item.version == version and item.owner == self.owner

    def _won(self, version: str, sent: float, what: str) -> bool:
        self._version, self._sent_at = version, sent
        log.log(logging.DEBUG if what == "heartbeat" else logging.INFO, "leader lock %s owner=%s", what, self.owner)
        return True

    def _lost(self, why: str) -> bool:
        if self._version is not None:
            log.warning("leader lock lost owner=%s (%s)", self.owner, why)
        self._version, self._sent_at = None, None
        return False

    def try_acquire(self) -> bool:
        if self._version is not None and self.is_leader():
            return self.heartbeat()
        item = self._read()
        self._last_holder = None if item is None or self._expired_by_record(item) else item.owner
        # Our items carry the expiry we write; the lock client's (a KCL worker's) do not.
        self._last_holder_foreign = self._last_holder is not None and item is not None and item.expires_ms is None
        if item is None:
            self._lost("lock item deleted")
        else:
            self._check_skew(item)
            ours = self._version is not None and item.version == self._version
            if not ours:
                self._lost(f"taken over by {item.owner}")
                if not self._expired(item):
                    return False
        kwargs = self._placed(lock_acquire_condition(item))  # exactly what we read: one contender's write lands
        version = str(uuid.uuid4())
        sent = self._clock.monotonic()
        try:
            self._client.put_item(TableName=self.table_name, Item=self._new_item(version), **kwargs)
        except _BOTO_ERRORS as exc:
            if not aws.is_conditional_check_failed(exc):
                aws.raise_translated(exc, operation="dynamodb PutItem (leader lock)", resource=self.table_name)
            if not self._applied(version):
                return self._lost("another contender won")
        previous = item.owner if item else None
        return self._won(version, sent, f"acquired (previous holder {previous or 'none'})")

    def acquire(self, timeout_s: float) -> bool:
        deadline = self._clock.monotonic() + timeout_s
        while True:
            if self.try_acquire():
                return True
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return False
            # A fixed poll, not a backoff: losing to a holder is no failure, and a free lock must be seen promptly.
            self._clock.sleep(min(self._config.poll_interval_ms / 1000, remaining))

    def _update_own(self, *, release: bool) -> bool:
        if self._version is None:
            return False
        version = str(uuid.uuid4())
        sent = self._clock.monotonic()
        try:
            self._client.update_item(
                TableName=self.table_name,
                **self._placed(
                    lock_update(
                        owner=self.owner,
                        held_version=self._version,
                        version=version,
                        duration_ms=self._config.lease_duration_ms,
                        now_ms=wall_millis(self._clock),
                        release=release,
                        release_at_ms=self._release_at_ms,
                    )
                ),
            )
        except _BOTO_ERRORS as exc:
            if not aws.is_conditional_check_failed(exc):
                aws.raise_translated(exc, operation="dynamodb UpdateItem (leader lock)", resource=self.table_name)
            if not self._applied(version):
                return self._lost("replaced by another holder")
        if release:
            self._version, self._sent_at = None, None
            log.info("leader lock released owner=%s", self.owner)
            return True
        return self._won(version, sent, "heartbeat")

    def heartbeat(self) -> bool:
        return self._update_own(release=False)

    def release(self) -> bool:
        return self._update_own(release=True)
