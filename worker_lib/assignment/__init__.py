"""Lease assignment: pure deciders over an :class:`~worker_lib.assignment.snapshot.AssignmentSnapshot`.

``plan`` (what a decider returns, the :class:`Decider` protocol), ``variance`` and ``count`` (the deciders),
``deciders`` (the name → decider table and ``make_decider``), ``state`` (working state they share), ``snapshot``,
``config`` and ``liveness``. docs/assignment.md describes them.
"""

from worker_lib.assignment.plan import AssignmentPlan, Decider, Decision

__all__ = ["AssignmentPlan", "Decider", "Decision"]
