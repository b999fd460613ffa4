"""Reading the workers' journals while they grow (see :mod:`.processor` for the line format)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rec:
    """One record processed by one worker process."""

    wall: float
    pid: int
    worker: str
    shard: str
    sequence: str
    record_id: str


@dataclass(frozen=True)
class Event:
    """One lifecycle call of a processor (INIT, LOST, END, SHUTDOWN)."""

    wall: float
    pid: int
    worker: str
    shard: str
    kind: str


class JournalTail:
    """Incrementally reads every ``*.jnl`` file of a directory; keeps each shard's processing times sorted."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offsets: dict[Path, int] = {}
        self.records: list[Rec] = []
        self.events: list[Event] = []
        self._times: dict[str, list[float]] = defaultdict(list)  # shard -> sorted processing times
        self._pids: dict[str, list[int]] = defaultdict(list)  # shard -> pid of each time, same order

    def refresh(self) -> int:
        """Read what was appended since the last call; returns the number of new record lines."""
        added = 0
        for path in sorted(self.directory.glob("*.jnl")):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            end = chunk.rfind(b"\n")
            if end < 0:
                continue
            self._offsets[path] = offset + end + 1
            for raw in chunk[: end + 1].decode("utf-8", errors="replace").splitlines():
                added += self._parse(raw)
        return added

    def _parse(self, raw: str) -> int:
        parts = raw.split()
        if len(parts) != 6:
            return 0
        try:
            wall, pid = float(parts[0]), int(parts[1])
        except ValueError:
            return 0
        worker, shard, sequence, record_id = parts[2], parts[3], parts[4], parts[5]
        if not sequence.isdigit():
            self.events.append(Event(wall, pid, worker, shard, sequence))
            return 0
        self.records.append(Rec(wall, pid, worker, shard, sequence, record_id))
        times, pids = self._times[shard], self._pids[shard]
        at = bisect.bisect_right(times, wall)
        times.insert(at, wall)
        pids.insert(at, pid)
        return 1

    # --- queries (call refresh() first) ------------------------------------------------------------------------

    def last_time(self, shard: str) -> float | None:
        times = self._times.get(shard)
        return times[-1] if times else None

    def first_after(self, shard: str, after: float, *, exclude: set[int]) -> tuple[float, int] | None:
        """The first processing of ``shard`` at or after ``after`` by a process not in ``exclude``."""
        times, pids = self._times.get(shard, []), self._pids.get(shard, [])
        for i in range(bisect.bisect_left(times, after), len(times)):
            if pids[i] not in exclude:
                return times[i], pids[i]
        return None

    def times_between(self, shard: str, start: float, end: float) -> list[float]:
        """Processing times of ``shard`` within [start, end], preceded by the last one before ``start``."""
        times = self._times.get(shard, [])
        lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
        return times[max(0, lo - 1) : hi]

    def shards(self) -> list[str]:
        return sorted(self._times)
