"""The deciders by name: the one table the leader (:func:`make_decider`) and ``shardlease simulate`` both use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.count import CountDecider
from worker_lib.assignment.plan import Decider
from worker_lib.assignment.variance import VarianceDecider

DeciderFactory = Callable[[AssignmentConfig], Decider]
"""Builds a decider from an :class:`AssignmentConfig` (its ``strategy`` and ``kcl_compatible`` are overridden)."""


def _variance(config: AssignmentConfig) -> Decider:
    return VarianceDecider(replace(config, strategy="variance", kcl_compatible=False))


def _variance_kcl(config: AssignmentConfig) -> Decider:
    return VarianceDecider(replace(config, strategy="variance", kcl_compatible=True))


def _count(config: AssignmentConfig) -> Decider:
    return CountDecider(replace(config, strategy="count", kcl_compatible=False))


def _count_kcl(config: AssignmentConfig) -> Decider:
    return CountDecider(replace(config, strategy="count", kcl_compatible=True))


DECIDERS: Mapping[str, DeciderFactory] = MappingProxyType(
    {
        "variance": _variance,
        "variance-kcl": _variance_kcl,
        "count": _count,
        "count-kcl": _count_kcl,
    }
)
"""``variance`` (ours, default), ``variance-kcl`` (KCL 3.x's decisions), ``count`` (ours, lease count),
``count-kcl`` (KCL 3.4.3's lease-count decider)."""


def decider_name(config: AssignmentConfig) -> str:
    """The :data:`DECIDERS` entry ``config`` selects: its strategy, with ``-kcl`` when ``kcl_compatible``."""
    return f"{config.strategy}-kcl" if config.kcl_compatible else config.strategy


def make_decider(config: AssignmentConfig) -> Decider:
    """The decider ``config`` selects (``strategy`` and ``kcl_compatible``)."""
    return DECIDERS[decider_name(config)](config)
