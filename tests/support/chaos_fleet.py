"""The process fleet of the chaos suite: ``shardlease worker`` (and ``leader``) processes that journal with the
chaos processor (tests/support/chaos.py), on :class:`~worker_lib.testing.ProcessFleet`.

A worker id may be started again after a kill (a restart under the same id): each process gets a name of its own
(``w1``, then ``w1.4``), :attr:`ChaosFleet.latest` maps the worker id to its latest process. The fleet remembers
what it killed or froze (``abnormal_pids()``, ``cut_at()``), which the journal invariants need.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.support.chaos import (
    PROCESSOR,
    Line,
    Timings,
    Verdict,
    check_journal,
    fenced_after_stop,
    holding,
    journal_key,
    read_lines,
    record_figures,
)
from tests.support.processes import PROCESS_START_S, REPO, repo_env
from tests.support.stalls import eventually, hang_bound_s
from worker_lib.processing.config import ConsumerConfig
from worker_lib.testing.processes import ProcessFleet
from worker_lib.testing.producers import Producer


class ChaosFleet(ProcessFleet):
    """Processes of one chaos scenario. ``args``: the ``--app … --stream … --endpoint-url …`` every process gets;
    ``env``: the environment of every process (over :data:`~tests.support.processes.FAST_ENV`); ``worker_env``:
    what workers get on top (e.g. ``SHARDLEASE_LEADER_MODE=none`` when leaders run apart); ``labels``: what the
    scenario's figures say about it (:meth:`record`)."""

    def __init__(
        self,
        log_dir: Path,
        *,
        args: list[str],
        env: Mapping[str, str],
        journal: Path,
        worker_env: Mapping[str, str] | None = None,
        labels: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(log_dir, env=repo_env(env), cwd=REPO)
        self.args, self.journal = args, journal
        self.labels = dict(labels or {})  # figures every record() of the scenario starts with (mode, seed, …)
        self.started = time.monotonic()
        self.worker_env = dict(worker_env or {})
        self.latest: dict[str, str] = {}  # worker id -> name of its latest process
        self.starts = 0  # worker processes started so far
        self.timings = Timings.of({**self.env, **self.worker_env})
        """What the workers are configured with: the fleet's liveness bounds are derived from it."""
        consumer = ConsumerConfig.from_env({**self.env, **self.worker_env})
        self.parallelism = consumer.parallelism
        """The workers' ``SHARDLEASE_PARALLELISM``: more than one, they run lanes and the journal is judged per key."""
        self.key_of: Callable[[str], str] | None = journal_key(consumer.key_of) if self.parallelism > 1 else None
        """A journaled record's lane key (the workers' ``SHARDLEASE_LANE_KEY``), with lanes; None: one lane."""
        self.processor = PROCESSOR
        """What :meth:`start_chaos_worker` runs unless told otherwise."""

    def start_chaos_worker(
        self, worker_id: str, *, processor: str | None = None, env: Mapping[str, str] | None = None
    ) -> int:
        """``shardlease worker --worker-id worker_id`` with ``processor`` (default :attr:`processor`); its pid."""
        processor = processor or self.processor
        self.starts += 1
        name = worker_id if worker_id not in self.processes else f"{worker_id}.{self.starts}"
        argv = ["worker", *self.args, "--processor", processor, "--worker-id", worker_id]
        started = self.start_shardlease(name, *argv, env={**self.worker_env, **(env or {})})
        self.latest[worker_id] = name
        return started.pid

    def start_leader_process(self, owner: str) -> int:
        """``shardlease leader`` holding the lock as ``owner`` (TRIM_HORIZON for new leases); its pid."""
        argv = ["leader", *self.args, "--initial-position", "TRIM_HORIZON", "--worker-id", owner]
        return self.start_shardlease(owner, *argv).pid

    def wait_started(self, worker_id: str) -> None:
        """Wait until the worker id's latest process says it started (it then handles SIGTERM: a signal before
        its first lines kills a process still importing) — at most the liveness bound of a process start."""
        name = self.latest[worker_id]
        eventually(
            lambda: "worker started id=" in self.log(name),
            bound_s=hang_bound_s(PROCESS_START_S),
            what=f"{name} did not start",
        )

    def pid(self, worker_id: str) -> int:
        """The pid of the worker id's latest process."""
        return self.processes[self.latest[worker_id]].pid

    def live_workers(self) -> list[str]:
        """Worker ids whose latest process runs (frozen counts as running) and was not sent SIGKILL."""
        return sorted(
            worker_id
            for worker_id, name in self.latest.items()
            if self.processes[name].alive() and self.processes[name].sent("SIGKILL") is None
        )

    def lines(self) -> list[Line]:
        return read_lines(self.journal)

    def holding(self, worker_id: str) -> set[str]:
        """Shards the worker id's latest process has an open session on (journal)."""
        return holding(self.lines(), self.pid(worker_id))

    def busy(self, candidates: Iterable[str] | None = None, *, bound_s: float | None = None) -> list[str]:
        """The live workers among ``candidates`` (default: every live worker) that process at least one shard,
        sorted; waits until there is one — at most ``bound_s``, by default the liveness bound of a silent worker's
        shards landing in another worker's sessions (a kill just before may have left every shard in transit)."""
        found: list[str] = []

        def any_busy() -> bool:
            pool = self.live_workers() if candidates is None else [w for w in candidates if w in self.live_workers()]
            found[:] = sorted(w for w in pool if self.holding(w))
            return bool(found)

        bound = hang_bound_s(self.timings.silent_worker_s) if bound_s is None else bound_s
        eventually(any_busy, bound_s=bound, what=f"none of {candidates or 'the workers'} processes a shard")
        return found

    def stop_bound_s(self) -> float:
        """The liveness bound of a graceful stop: a SIGTERM'd worker has ended by its shutdown timeout at the
        latest (it then fences what is left), whatever its consumers do."""
        return hang_bound_s(self.timings.shutdown_s)

    def stop_workers(self, worker_ids: Iterable[str] | None = None) -> dict[str, int | None]:
        """SIGTERM the latest process of each worker id (default: every live one); exit codes by worker id (``None``:
        still running after :meth:`stop_bound_s`)."""
        chosen = self.live_workers() if worker_ids is None else list(worker_ids)
        codes = self.stop([self.latest[w] for w in chosen], timeout_s=self.stop_bound_s())
        return {w: codes[self.latest[w]] for w in chosen}

    def processed_all(self, produced: Iterable[str]) -> bool:
        """Every one of ``produced`` has a REC line."""
        return {x.c for x in self.lines() if x.kind == "REC"} >= set(produced)

    def shards_processed(self) -> int:
        """How many shards have a REC line."""
        return len({x.shard for x in self.lines() if x.kind == "REC"})

    def verdict(
        self,
        produced: list[str],
        *,
        parents: dict[str, list[str]] | None = None,
    ) -> Verdict:
        """The suite's journal invariants (tests/support/chaos.py, ``check_journal``); duplicates are allowed only
        after what this fleet killed or froze (with lanes: also past the watermark a graceful stop left)."""
        return check_journal(
            self.lines(),
            produced,
            abnormal_pids=self.abnormal_pids(),
            parents=parents,
            key_of=self.key_of,
            parallelism=self.parallelism,
        )

    def fenced_after_stop(self, pid: int, stopped_at: float) -> list[str]:
        """Violations of the fence of ``pid``, frozen at ``stopped_at`` (``fenced_after_stop``, judged per lane when
        the workers run lanes)."""
        return fenced_after_stop(self.lines(), pid, stopped_at, key_of=self.key_of, parallelism=self.parallelism)

    def record(self, scenario: str, verdict: Verdict, producer: Producer, **figures: Any) -> None:
        """Record the scenario's figures (``record_figures``): its labels, ``figures``, its runtime since the fleet
        was made, the producer's errors and the verdict's figures."""
        runtime = round(time.monotonic() - self.started, 1)
        extra = {"runtime_s": runtime, "producer_errors": producer.errors, **verdict.figures()}
        record_figures(scenario, {**self.labels, **figures, **extra})
