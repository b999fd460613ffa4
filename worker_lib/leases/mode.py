"""The application's liveness mode (docs/liveness-modes.md): what proves a worker alive to the leader (pure).

* ``lease`` (the default, KCL-compatible): every held lease is renewed every renewer interval, and the leader
  expires a lease whose counter stood still for the failover time — plus the worker heartbeat where there is one.
* ``worker``: one heartbeat per worker carries liveness; lease items are written only on ownership change,
  checkpoint, hand-off and throughput change. The leader expires the leases of a heartbeating worker only when the
  worker is gone (per owner, :class:`~worker_lib.assignment.heartbeats.HeartbeatTracker`).

The mode is an application property, stored once in ``<app>-CoordinatorState`` (item ``LivenessMode``). A switch
is a *target* written beside the current mode and completed by the leader, in an order that never leaves a lease
unprotected:

* ``lease → worker``: the leader judges heartbeating owners per owner as soon as it sees the target (their leases
  are still renewed, so nothing changes for them), then writes ``mode = worker``; workers stop renewing only once
  they read that.
* ``worker → lease``: workers start renewing as soon as they see the target; the leader keeps judging per owner
  until it has watched the counter of every lease held by a heartbeating worker move since it saw the target, and
  only then writes ``mode = lease``.

A process configured for one mode (``SHARDLEASE_LIVENESS_MODE=lease|worker``) refuses to start when the
application is in (or moving to) the other; ``auto`` follows whatever is stored. Once running, every process
follows the stored mode (that is what keeps a switch safe) and says so in a warning when it differs from its
configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from worker_lib.core.errors import ConfigError


class LivenessMode(str, Enum):
    LEASE = "lease"
    WORKER = "worker"


AUTO = "auto"
"""The configuration value that follows the stored mode (and records ``lease`` when none is stored)."""

SETTINGS = (LivenessMode.LEASE.value, LivenessMode.WORKER.value, AUTO)


class LivenessModeMismatchError(ConfigError):
    """This process is configured for one liveness mode and the application runs (or is moving to) the other."""


def parse_setting(value: str) -> str:
    """``lease``, ``worker`` or ``auto`` (case-insensitive); anything else is a :class:`ConfigError`."""
    setting = value.strip().lower()
    if setting not in SETTINGS:
        raise ConfigError(f"invalid liveness mode {value!r}: expected lease, worker or auto")
    return setting


@dataclass(frozen=True, kw_only=True)
class StoredMode:
    """The ``LivenessMode`` item: the mode in force and, during a switch, the mode asked for."""

    mode: LivenessMode
    target: LivenessMode | None = None

    def __post_init__(self) -> None:
        if self.target is self.mode:
            object.__setattr__(self, "target", None)

    @property
    def intended(self) -> LivenessMode:
        """Where the application is going: the target during a switch, else the mode."""
        return self.target or self.mode

    @property
    def switching(self) -> bool:
        return self.target is not None

    @property
    def workers_renew(self) -> bool:
        """Workers renew their leases unless the application is in ``worker`` mode and not moving back."""
        return not (self.mode is LivenessMode.WORKER and self.target is None)

    @property
    def leader_judges_per_owner(self) -> bool:
        """The leader expires a heartbeating worker's leases only when the worker is gone (not by lease counter)."""
        return self.mode is LivenessMode.WORKER or self.target is LivenessMode.WORKER

    def describe(self) -> str:
        if self.target is None:
            return self.mode.value
        return f"{self.mode.value}, switching to {self.target.value}"


# --- hand-off requests (``hrq`` on the old owner's worker-metrics item) ---------------------------------------------


def handoff_request(lease_key: str, timeout_ms: int) -> str:
    """One element of ``hrq``: the leader asks the worker to hand ``lease_key`` over within ``timeout_ms``."""
    return f"{int(timeout_ms)}:{lease_key}"


def parse_handoff_request(element: str) -> tuple[str, int] | None:
    """``(lease key, timeout ms)`` of one ``hrq`` element, or ``None`` if it is not one of ours."""
    timeout, sep, lease_key = element.partition(":")
    if not sep or not lease_key or not timeout.isdigit():
        return None
    return lease_key, int(timeout)


LEASE_MODE = StoredMode(mode=LivenessMode.LEASE)
"""What a process assumes while nothing is stored: renewing is safe under either leader rule."""


def initial_mode(setting: str) -> LivenessMode:
    """The mode the first process records: its configured one (``auto`` records ``lease``)."""
    return LivenessMode.WORKER if setting == LivenessMode.WORKER.value else LivenessMode.LEASE


def refusal(setting: str, stored: StoredMode | None, *, who: str) -> str | None:
    """The one-line reason a process configured with ``setting`` must not start, or ``None``."""
    if stored is None or setting in (AUTO, stored.intended.value):
        return None
    return (
        f"{who} is configured for liveness mode {setting!r} (SHARDLEASE_LIVENESS_MODE) but the application runs in "
        f"{stored.describe()!r}: set SHARDLEASE_LIVENESS_MODE={stored.intended.value} (or auto), or switch the "
        f"application with `shardlease liveness --set {setting}`"
    )


def check_start(setting: str, stored: StoredMode | None, *, who: str) -> None:
    """Raise :class:`LivenessModeMismatchError` when :func:`refusal` says so."""
    reason = refusal(setting, stored, who=who)
    if reason is not None:
        raise LivenessModeMismatchError(reason)


def switched_to_lease_everywhere(*, since: float, owned_by_heartbeating: Mapping[str, float | None]) -> bool:
    """During ``worker → lease``: has the counter of every lease held by a heartbeating worker been seen to move
    after ``since`` (the leader's monotonic time when it first saw the target)? ``owned_by_heartbeating`` maps each
    such lease to the monotonic time its counter last moved (``None``: never seen moving)."""
    return all(moved is not None and moved > since for moved in owned_by_heartbeating.values())
