"""Typed leader reports for tests that need one without running an assignment pass."""

from __future__ import annotations

from typing import Any

from worker_lib.leader.assignment_report import AssignmentReport


def assignment_report(run_number: int = 1, **overrides: Any) -> AssignmentReport:
    """A plausible report of one assignment run: 4 leases on two workers; any field can be overridden."""
    fields: dict[str, Any] = {
        "run_number": run_number,
        "strategy": "variance",
        "leases": 4,
        "finished_leases": 0,
        "workers_total": 2,
        "workers_assignable": 2,
        "expired": 1,
        "assigned": 1,
        "reassigned_expired": 1,
        "moved": 2,
        "handoffs_forced": 0,
        "unassigned": 0,
        "write_conflicts": 0,
        "balancing_ran": True,
        "effective_cap": None,
        "metric": "C",
        "max_over_mean": 1.05,
        "leases_per_worker": {"w1": 2, "w2": 2},
        "throughput_per_worker_kbps": {"w1": 10.5, "w2": 3.0},
    }
    return AssignmentReport(**{**fields, **overrides})
