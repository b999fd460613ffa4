"""Which former streams of a multi-stream application lose their leases now (pure; no AWS calls).

KCL 3.x's ``FormerStreamsLeasesDeletionStrategy`` in the form this project runs it (docs/multi-stream.md):

- a stream **deleted in Kinesis** (the service answers "not found" for its name, or the name now belongs to a
  stream created later, i.e. another creation epoch) can never be read again: its leases go at once, as KCL's
  ``DeletedStreamListProvider`` path deletes them;
- a stream that still exists but is **no longer tracked** keeps its leases (and its workers keep reading it) for a
  grace period counted from the first shard sync that found it untracked, then its leases go (KCL's
  ``AutoDetectionAndDeferredDeletionStrategy``): a tracker answer that briefly misses a stream, or a deploy rolled
  back within the period, costs nothing. A negative grace period never deletes them (KCL's
  ``NoLeaseDeletionStrategy``).

The "untracked since" times are wall-clock milliseconds kept in the CoordinatorState table by the caller, because
a Lambda leader is built afresh for every invocation and a new leader must count on from where the last stopped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class FormerStreamPlan:
    """delete_now: serialized identifiers whose leases go now, with ``reasons``; waiting: the identifiers in their
    grace period with the wall-clock millisecond they were first found untracked (what the caller stores)."""

    delete_now: tuple[str, ...] = ()
    waiting: Mapping[str, int] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)


def plan_former_streams(
    *,
    leased: Iterable[str],
    tracked: Iterable[str],
    deleted: Iterable[str],
    undecided: Iterable[str] = (),
    untracked_since: Mapping[str, int],
    now_ms: int,
    grace_ms: int,
) -> FormerStreamPlan:
    """The plan for every stream that has leases (``leased``) but is not ``tracked``.

    deleted: those of them Kinesis reports gone; undecided: those whose state could not be learnt this time (a
    throttled or failed call): they are left exactly as they were, neither deleted nor their clock restarted.
    """
    tracked_set, deleted_set, undecided_set = set(tracked), set(deleted), set(undecided)
    delete_now: list[str] = []
    waiting: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for stream in sorted(set(leased) - tracked_set):
        since = untracked_since.get(stream)
        if stream in undecided_set:
            if since is not None:
                waiting[stream] = since
            continue
        if stream in deleted_set:
            delete_now.append(stream)
            reasons[stream] = "the stream was deleted in Kinesis"
            continue
        since = now_ms if since is None else min(since, now_ms)
        if grace_ms >= 0 and now_ms - since >= grace_ms:
            delete_now.append(stream)
            reasons[stream] = f"not tracked for {(now_ms - since) / 1000:.0f} s (grace period {grace_ms / 1000:.0f} s)"
        else:
            waiting[stream] = since
    return FormerStreamPlan(delete_now=tuple(delete_now), waiting=waiting, reasons=reasons)
