"""The demo's closing report: every record produced is found in the workers' journals; duplicates are explained;
failover and hand-over times are measured from the signal to the first record processed elsewhere."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from worker_lib.tools.demo.fleet import DemoState, Fleet


@dataclass(frozen=True)
class Processed:
    pid: int
    shard: str
    sequence: int
    record_id: str
    wall: float


def read_journals(directory: Path) -> list[Processed]:
    out: list[Processed] = []
    for path in sorted(directory.glob("*.log")):
        pid = int(path.stem)
        with path.open(encoding="utf-8") as journal:
            for line in journal:
                parts = line.split()
                if len(parts) == 5 and parts[1].isdigit():
                    out.append(Processed(pid, parts[0], int(parts[1]), parts[3], float(parts[4])))
    return out


@dataclass
class Report:
    produced: int
    processed_unique: int
    lost: list[str]
    duplicates: int
    duplicate_reasons: Counter[str]
    failover_s: dict[str, float]
    handover_s: dict[str, float]
    imbalance_before: float | None
    imbalance_after: float | None
    records_per_worker: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.lost

    def lines(self) -> list[str]:
        out = [
            "",
            "closing report",
            f"  records produced   {self.produced}",
            f"  records processed  {self.processed_unique} distinct"
            f" ({'none lost' if not self.lost else f'{len(self.lost)} LOST'})",
            f"  duplicates         {self.duplicates}",
        ]
        for reason, count in sorted(self.duplicate_reasons.items()):
            out.append(f"    {count:>6}  {reason}")
        for name, seconds in self.failover_s.items():
            out.append(f"  failover           {name}: its shards resumed on other workers after {seconds:.1f} s")
        for name, seconds in self.handover_s.items():
            out.append(
                f"  hand-over          {name} (SIGTERM): its shards resumed on other workers after {seconds:.1f} s"
            )
        if self.imbalance_before is not None and self.imbalance_after is not None:
            out.append(
                f"  load max/mean      {self.imbalance_before:.2f} at first balancing → "
                f"{self.imbalance_after:.2f} at the end"
            )
        out.append("  records per worker " + ", ".join(f"{k}={v}" for k, v in sorted(self.records_per_worker.items())))
        return out


def build_report(fleet: Fleet, state: DemoState) -> Report:
    processed = read_journals(fleet.journal_dir)
    produced = state.produced()
    with state.lock:
        leader_reports = list(state.leader_reports)
    seen = Counter(p.record_id for p in processed)
    lost = sorted(set(produced) - set(seen))
    pid_name = {w.pid: w for w in fleet.workers}
    duplicate_reasons: Counter[str] = Counter()
    first_pid: dict[str, int] = {}
    for p in sorted(processed, key=lambda x: x.wall):
        if p.record_id in first_pid and first_pid[p.record_id] != p.pid:
            first = pid_name.get(first_pid[p.record_id])
            if first is not None and fleet.killed_at(first) is not None:
                duplicate_reasons[f"re-read after {first.name} was killed before checkpointing them"] += 1
            else:
                duplicate_reasons["re-read after a lease moved before its checkpoint"] += 1
        elif p.record_id in first_pid:
            duplicate_reasons["re-read by the same worker (a retried batch)"] += 1
        else:
            first_pid[p.record_id] = p.pid
    failover: dict[str, float] = {}
    handover: dict[str, float] = {}
    for worker in fleet.workers:
        for signalled_at, figures in ((fleet.killed_at(worker), failover), (fleet.terminated_at(worker), handover)):
            if signalled_at is None:
                continue
            # the shards it was processing when signalled; each one's first record processed elsewhere afterwards
            shards = {p.shard for p in processed if p.pid == worker.pid and p.wall <= signalled_at}
            resumed = []
            for shard in shards:
                after = [
                    p.wall for p in processed if p.shard == shard and p.pid != worker.pid and p.wall > signalled_at
                ]
                if after:
                    resumed.append(min(after) - signalled_at)
            if resumed:
                figures[worker.name] = max(resumed)
    ratios = []
    for report in leader_reports:
        for cycle in report.get("cycles", []):
            assignment = cycle.get("assignment") or {}
            if assignment.get("balancing_ran") and assignment.get("workers_assignable", 0) > 1:
                ratios.append(float(assignment.get("max_over_mean", 1.0)))
    per_worker: Counter[str] = Counter()
    for p in processed:
        name = pid_name[p.pid].name if p.pid in pid_name else str(p.pid)
        per_worker[name] += 1
    return Report(
        produced=len(produced),
        processed_unique=len(set(seen) & set(produced)),
        lost=lost,
        duplicates=sum(n - 1 for n in seen.values() if n > 1),
        duplicate_reasons=duplicate_reasons,
        failover_s=failover,
        handover_s=handover,
        imbalance_before=ratios[0] if ratios else None,
        imbalance_after=ratios[-1] if ratios else None,
        records_per_worker=dict(per_worker),
    )
