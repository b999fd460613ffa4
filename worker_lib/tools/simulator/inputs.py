"""The inputs of a simulation (``shardlease simulate``, ``bench/assignment.py``, the autoscale simulation): the
strategies, shard rate distributions (:class:`Skew`), events at a cycle (:class:`Event`) and the fleet
(:class:`FleetSpec`), each parsed from its command-line form."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from worker_lib.assignment.config import AssignmentConfig
from worker_lib.assignment.deciders import DECIDERS, DeciderFactory
from worker_lib.assignment.plan import Decider
from worker_lib.core.errors import ConfigError
from worker_lib.tools.kcl2_baseline import KCL2, kcl2_decider

STRATEGY_FACTORIES: Mapping[str, DeciderFactory] = {**DECIDERS, KCL2: kcl2_decider}
"""The leader's deciders (:data:`worker_lib.assignment.deciders.DECIDERS`) plus ``kcl2``, KCL 2.x lease takers
stealing one lease at a time (``worker_lib/tools/kcl2_baseline.py``)."""

STRATEGIES: tuple[str, ...] = tuple(STRATEGY_FACTORIES)

STRATEGY_LABELS: Mapping[str, str] = {
    "variance": "ours (variance)",
    "variance-kcl": "KCL 3.x variance",
    "count": "lease count (ours)",
    "count-kcl": "KCL 3.4 lease count",
    "kcl2": "KCL 2.x stealing",
}

EventKind = Literal["join", "kill", "split"]
EVENT_KINDS: tuple[str, ...] = ("join", "kill", "split")


@dataclass(frozen=True)
class Skew:
    """How shard rates are distributed (see :func:`parse_skew`)."""

    kind: Literal["uniform", "zipf", "hot"] = "zipf"
    s: float = 1.2
    hot_count: int = 1
    hot_factor: float = 10.0

    def label(self) -> str:
        if self.kind == "zipf":
            return f"zipf s={self.s:g}"
        if self.kind == "hot":
            return f"hot {self.hot_count}×{self.hot_factor:g}"
        return "uniform"


def parse_skew(text: str) -> Skew:
    """``uniform``, ``zipf`` / ``zipf:S`` (S > 0, default 1.2), ``hot`` / ``hot:K`` / ``hot:K:F`` (default: one
    shard 10× hotter)."""
    parts = [p.strip() for p in text.strip().lower().split(":")]
    kind = parts[0]
    usage = f"invalid skew {text!r}: expected uniform, zipf[:S] or hot[:K[:F]] (e.g. zipf:1.2, hot:2:20)"
    try:
        numbers = [float(p) for p in parts[1:]]
    except ValueError:
        raise ConfigError(usage) from None
    if kind == "uniform" and not numbers:
        return Skew("uniform")
    if kind == "zipf" and len(numbers) <= 1:
        s = numbers[0] if numbers else 1.2
        if not (s > 0 and math.isfinite(s)):
            raise ConfigError(f"skew {text!r}: the Zipf exponent must be a positive number")
        return Skew("zipf", s=s)
    if kind == "hot" and len(numbers) <= 2:
        count = numbers[0] if numbers else 1.0
        factor = numbers[1] if len(numbers) == 2 else 10.0
        if count < 1 or count != int(count) or not (factor > 0 and math.isfinite(factor)):
            raise ConfigError(f"skew {text!r}: hot:K:F needs a whole number K ≥ 1 of hot shards and a factor F > 0")
        return Skew("hot", hot_count=int(count), hot_factor=factor)
    raise ConfigError(usage)


def shard_rates(count: int, skew: Skew, rng: random.Random) -> list[float]:
    """True rates (KBps) of ``count`` shards; Zipf ranks and hot shards land at random (seeded) positions."""
    if skew.kind == "uniform":
        return [100.0] * count
    if skew.kind == "zipf":
        rates = [1000.0 / (rank**skew.s) for rank in range(1, count + 1)]
        rng.shuffle(rates)
        return rates
    rates = [100.0] * count
    for index in rng.sample(range(count), min(skew.hot_count, count)):
        rates[index] = 100.0 * skew.hot_factor
    return rates


@dataclass(frozen=True)
class Event:
    """Something that happens at the start of a cycle: ``count`` workers join or die, or shards split."""

    cycle: int
    kind: EventKind
    count: int = 1

    def label(self) -> str:
        return f"{self.kind} {self.count}" if self.count != 1 else self.kind


def parse_event(kind: str, text: str | Event) -> Event:
    """``CYCLE`` or ``CYCLE:COUNT`` (e.g. ``--kill 8``, ``--join 10:2``, ``--split 6``)."""
    if isinstance(text, Event):
        return text
    if kind not in EVENT_KINDS:
        raise ConfigError(f"unknown event {kind!r}: expected join, kill or split")
    cycle_text, _, count_text = str(text).strip().partition(":")
    try:
        cycle = int(cycle_text)
        count = int(count_text) if count_text else 1
    except ValueError:
        raise ConfigError(f"--{kind} {text!r}: expected CYCLE or CYCLE:COUNT (whole numbers)") from None
    if cycle < 1 or count < 1:
        raise ConfigError(f"--{kind} {text!r}: the cycle and the count must be at least 1")
    return Event(cycle=cycle, kind=kind, count=count)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class FleetSpec:
    """The simulated fleet. See the module docstring for the CPU model."""

    workers: int = 8
    shards: int = 64
    skew: Skew = field(default_factory=Skew)
    seed: int = 1
    base_cpu: float = 5.0
    target_cpu: float = 40.0
    noise_pct: float = 1.0
    cost_factors: tuple[float, ...] = ()
    interval_s: float = 20.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"workers={self.workers} must be at least 1")
        if self.shards < 1:
            raise ConfigError(f"shards={self.shards} must be at least 1")
        if not 0 <= self.base_cpu < 100:
            raise ConfigError(f"base_cpu={self.base_cpu} must be within 0..100")
        if not self.base_cpu < self.target_cpu <= 100:
            raise ConfigError(f"target_cpu={self.target_cpu} must be above base_cpu ({self.base_cpu}) and ≤ 100")
        if not (self.noise_pct >= 0 and math.isfinite(self.noise_pct)):
            raise ConfigError(f"noise={self.noise_pct} must be a non-negative number (CPU percentage points)")
        if any(not (f > 0 and math.isfinite(f)) for f in self.cost_factors):
            raise ConfigError(f"cost factors {list(self.cost_factors)} must all be positive numbers")
        if not self.interval_s > 0:
            raise ConfigError(f"interval_s={self.interval_s} must be positive")


def make_strategy(strategy: str, config: AssignmentConfig | None = None) -> Decider:
    """The decider a strategy name stands for (see :data:`STRATEGIES`); ``config`` overrides the defaults."""
    if strategy not in STRATEGY_FACTORIES:
        raise ConfigError(f"invalid strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    return STRATEGY_FACTORIES[strategy](config or AssignmentConfig())
