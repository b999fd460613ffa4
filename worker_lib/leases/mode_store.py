"""The ``LivenessMode`` item of ``<app>-CoordinatorState`` (docs/liveness-modes.md; rules in :mod:`.mode`).

Read by every worker at start and then every ``SHARDLEASE_LIVENESS_MODE_CHECK_MS`` (60 s), and by the leader at
every full cycle; recorded once by the first leader (``attribute_not_exists``); a switch is requested by
``shardlease liveness --set`` and completed by the leader, each write conditioned on the item as it was read.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import CorruptItemError, DependencyError
from worker_lib.leases.mode import LEASE_MODE, LivenessMode, StoredMode, check_start, refusal
from worker_lib.tables.coordinator_items import LIVENESS_MODE_KEY, LivenessModeAttr
from worker_lib.tables.state_store import CoordinatorStateStore

log = logging.getLogger(__name__)
A = LivenessModeAttr


class LivenessModeSource(Protocol):
    def read(self) -> StoredMode | None: ...


def parse_stored_mode(attrs: dict[str, Any]) -> StoredMode:
    """The item's plain values as a :class:`StoredMode`; a missing or unknown ``mode`` is a
    :class:`CorruptItemError` (a mode nobody can judge by must not be guessed)."""
    try:
        mode = LivenessMode(attrs.get(A.MODE))
        raw_target = attrs.get(A.TARGET)
        target = None if raw_target is None else LivenessMode(raw_target)
    except ValueError as exc:
        reason = f"mode={attrs.get(A.MODE)!r} target={attrs.get(A.TARGET)!r} (expected lease or worker)"
        raise CorruptItemError(LIVENESS_MODE_KEY, reason) from exc
    return StoredMode(mode=mode, target=target)


class LivenessModeStore:
    """Reads and conditional writes of the ``LivenessMode`` item; losing a condition is ``False``."""

    def __init__(self, store: CoordinatorStateStore, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._store = store
        self._clock = clock

    @property
    def table_name(self) -> str:
        return self._store.table_name

    def read(self) -> StoredMode | None:
        """The stored mode (strongly consistent), or ``None`` if none was recorded yet."""
        attrs = self._store.get(LIVENESS_MODE_KEY)
        return None if attrs is None else parse_stored_mode(attrs)

    def _stamp(self, by: str) -> dict[str, Any]:
        return {A.UPDATED: int(self._clock.wall() * 1000), A.UPDATED_BY: by}

    def record_if_absent(self, mode: LivenessMode, *, by: str) -> StoredMode:
        """Record ``mode`` if nothing is stored; return what is stored afterwards (ours or the earlier one)."""
        if self._store.put_if_absent(LIVENESS_MODE_KEY, {A.MODE: mode.value, **self._stamp(by)}):
            log.info("liveness mode recorded: %s (by %s)", mode.value, by)
            return StoredMode(mode=mode)
        stored = self.read()
        return stored if stored is not None else StoredMode(mode=mode)

    def request(self, target: LivenessMode, *, expected: StoredMode, by: str) -> bool:
        """Ask for ``target`` (``shardlease liveness --set``): a target equal to the mode cancels a switch."""
        value = None if target is expected.mode else target.value
        return self._store.update_if(
            LIVENESS_MODE_KEY,
            {A.TARGET: value, **self._stamp(by)},
            {A.MODE: expected.mode.value, A.TARGET: None if expected.target is None else expected.target.value},
        )

    def complete(self, expected: StoredMode, *, by: str) -> bool:
        """The leader: the switch ``expected`` describes is done (``mode = target``, target removed)."""
        if expected.target is None:
            raise ValueError("no switch to complete")
        return self._store.update_if(
            LIVENESS_MODE_KEY,
            {A.MODE: expected.target.value, A.TARGET: None, **self._stamp(by)},
            {A.MODE: expected.mode.value, A.TARGET: expected.target.value},
        )


class ModeFollower:
    """A worker's view of the stored liveness mode: read at start (a configured mode that disagrees refuses to
    start), then re-read every check interval so that a switch is followed (docs/liveness-modes.md).

    While nothing is stored — no leader has run yet — the worker behaves as in ``lease`` mode: renewing is safe
    under either of the leader's rules. A failed re-read keeps the last known mode (logged once per failure run)."""

    def __init__(
        self,
        source: LivenessModeSource | None,
        *,
        setting: str,
        check_interval_s: float,
        who: str,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._source = source
        self._setting = setting
        self._interval_s = check_interval_s
        self._who = who
        self._clock = clock
        self._current = LEASE_MODE
        self._next_check: float | None = None
        self._failing = False
        self._warned_for: StoredMode | None = None

    @property
    def current(self) -> StoredMode:
        return self._current

    def start(self) -> StoredMode:
        """The first read; raises :class:`LivenessModeMismatchError` on a mismatch. A read that fails leaves the
        ``lease`` mode in force — renewing is safe under either mode — and the next :meth:`poll` reads again."""
        try:
            stored = self._source.read() if self._source is not None else None
        except DependencyError as exc:
            log.warning("%s could not read the liveness mode (renewing until it can): %s", self._who, exc)
            return self._current
        check_start(self._setting, stored, who=self._who)
        self._current = stored or LEASE_MODE
        self._next_check = self._clock.monotonic() + self._interval_s
        log.info("%s runs in liveness mode %s", self._who, self._current.describe())
        return self._current

    def poll(self) -> StoredMode | None:
        """Re-read if due; the new mode if it changed, else ``None``."""
        now = self._clock.monotonic()
        if self._source is None or (self._next_check is not None and now < self._next_check):
            return None
        self._next_check = now + self._interval_s
        try:
            stored = self._source.read()
        except (DependencyError, CorruptItemError) as exc:
            if not self._failing:
                log.warning(
                    "%s could not re-read the liveness mode (keeping %s): %s", self._who, self._current.describe(), exc
                )
            self._failing = True
            return None
        self._failing = False
        if stored is None or stored == self._current:
            return None
        log.info("%s follows the liveness mode: %s -> %s", self._who, self._current.describe(), stored.describe())
        self._current = stored
        if refusal(self._setting, stored, who=self._who) is not None and self._warned_for != stored:
            self._warned_for = stored
            log.warning(
                "%s is configured for liveness mode %r but the application is now %s: following it; set "
                "SHARDLEASE_LIVENESS_MODE=%s (or auto) before the next restart",
                self._who,
                self._setting,
                stored.describe(),
                stored.intended.value,
            )
        return stored
