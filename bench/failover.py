"""End-to-end hand-over benchmark: how long shards stay unserved when workers or the leader die or stop.

Real processes on local emulators (moto for DynamoDB, kinesalite for Kinesis), production timings. Per fleet: an
8-shard stream fed with one record per shard every 200 ms, four ``shardlease worker`` processes journaling every
record (bench/failover_support/processor.py), and a leader host — ``shardlease leader`` (``cli``) or the real Lambda
handler invoked on a local 1-minute schedule (``lambda``). A *gap* is, for each shard held by the victim, the wall
time of the first record of that shard processed by another process minus the wall time of the signal.

    .venv/bin/python bench/failover.py [--configs ours,kcl] [--hosts cli,lambda] [--trials 10]
        [--scenarios kill,term,deploy,leader,stop,lambda-kill,lambda-term] [--liveness lease|worker]
        [--retrieval polling|fanout] [--seed 1]
        [--json PATH] [--plot PATH.png] [--keep-logs DIR]

``--retrieval fanout`` runs every process with enhanced fan-out (``SHARDLEASE_RETRIEVAL=fanout``): Kinesis is then
kinesis-local (the one emulator serving SubscribeToShard) behind ``worker_lib.testing.FanOutProxy``.

Configurations: ``ours`` = the code's defaults; ``kcl`` = KCL's timings and behaviour (:data:`KCL_ENV`, Lambda
timeout 60 s). ``--liveness`` is the liveness mode of ``ours`` (docs/liveness-modes.md): every one of its processes
runs with ``SHARDLEASE_LIVENESS_MODE`` set to it, and the mode is recorded for the application with
``shardlease liveness --set`` before any process starts (as an operator would); ``lease`` (the default) is the mode
the leader would record anyway. The ``kcl`` baseline is unaffected (KCL has only ``lease``).

Scenarios (each ``--trials`` times in a running fleet, waiting for a steady fleet in between):

* ``kill``   SIGKILL a worker holding ≥ 1 shard, then start a replacement with a fresh id;
* ``term``   SIGTERM a worker (it must exit 0 within 30 s), then start a replacement;
* ``deploy`` rolling restart: for each worker, start its replacement, SIGTERM it, wait until it exited and its
  shards are served again; the figure is each shard's longest idle interval in the deploy window;
* ``leader`` SIGKILL the leader and a worker together, start a new leader at once; also the lock takeover time;
* ``stop``   SIGSTOP a worker for 15 s, then SIGCONT; here the gap ends at the first record by *any* process (when
  nobody took the leases before it woke, the stopped worker serves them again itself); also the overlaps:
  records the stopped worker processed on a shard after its new owner's first one (expected 0);
* ``hang``   SIGTERM a worker whose processor then hangs in ``shutdown_requested`` (a flush that never returns): it
  says DEPARTING and keeps its leases until its shutdown timeout (``SHARDLEASE_SHUTDOWN_TIMEOUT_MS``, 30 s), then
  fences itself; the gap counts from the SIGTERM, and how long after the shutdown timeout the shards were served
  again is printed apart (then the hung worker is SIGKILLed and replaced);
* ``lambda-kill`` / ``lambda-term``: kill / term with the leader on the 1-minute schedule, the signals spread over
  the minute.

Prints a table (mode, gaps median / p90 / max, timeouts, records lost and duplicated by reason, kcl ÷ ours), the
machine load and the duration; the last line sums up ``ours`` with the ``cli`` host (lost and duplicates over its
whole fleet, start-up and drain included; ``(worker mode)`` after ``failover p90/max s`` in that mode). Exits 1
if a record was lost. A wait that times out (gap timeout 120 s, 200 s with the lambda host) counts as a gap of the
timeout, flagged.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from failover_support.fleet import CHILDREN, LAMBDA_PERIOD_S, Fleet, FleetSpec, cut_signals
from failover_support.processor import HANG_MARKER_PREFIX
from failover_support.report import (
    Fate,
    Gap,
    ScenarioResult,
    classify_records,
    dump_json,
    final_line,
    plot_cdf,
    table,
)
from kcl3_timings import KCL_ENV  # KCL's timings and behaviour, for every process of the `kcl` configuration

from worker_lib.testing.processes import FleetProcess

CONFIG_ENV: dict[str, dict[str, str]] = {"ours": {}, "kcl": KCL_ENV}
LIVENESS_MODES = ("lease", "worker")


def config_env(config: str, liveness: str) -> dict[str, str]:
    """The SHARDLEASE_* settings of every process of ``config``; ``ours`` runs in the chosen liveness mode."""
    if config != "ours":
        return dict(CONFIG_ENV[config])
    return {**CONFIG_ENV[config], "SHARDLEASE_LIVENESS_MODE": liveness}


def liveness_of(config: str, liveness: str) -> str:
    """The liveness mode a fleet of ``config`` runs in (the KCL baseline renews every lease: ``lease``)."""
    return liveness if config == "ours" else "lease"


LAMBDA_TIMEOUT_S = {"ours": 80.0, "kcl": 60.0}

CLI_SCENARIOS = ("kill", "term", "deploy", "leader", "stop", "hang")
LAMBDA_SCENARIOS = ("lambda-kill", "lambda-term")
ALL_SCENARIOS = CLI_SCENARIOS + LAMBDA_SCENARIOS

STEADY_WINDOW_S = 3.0  # steady: every shard processed something within this many seconds
STEADY_TIMEOUT_S = 120.0
START_TIMEOUT_S = 240.0  # the first steady fleet (tables, leader's first cycles, TRIM_HORIZON catch-up)
GAP_TIMEOUT_S = {"cli": 120.0, "lambda": 200.0}
TERM_EXIT_S = 30.0
STOP_S = 15.0
DRAIN_S = 30.0
POLL_S = 0.1

# Rough seconds per trial, for the estimate printed at the start (measured on a 2-core machine).
EST_TRIAL_S = {
    "ours": {
        "kill": 17,
        "term": 6,
        "deploy": 15,
        "leader": 17,
        "stop": 22,
        "hang": 40,
        "lambda-kill": 45,
        "lambda-term": 35,
    },
    "kcl": {
        "kill": 45,
        "term": 40,
        "deploy": 210,
        "leader": 55,
        "stop": 35,
        "hang": 75,
        "lambda-kill": 85,
        "lambda-term": 90,
    },
}
EST_FLEET_S = 40

Say = Callable[[str], None]


class Interrupted(BaseException):
    """SIGINT or SIGTERM to the benchmark: stop, clean up, exit."""


class NoVictim(Exception):
    """A trial found nothing to act on; it is skipped with a note."""


# --- measuring -------------------------------------------------------------------------------------------------


@dataclass
class ExitWatch:
    """Notices (while polling) when a SIGTERMed process exits."""

    proc: FleetProcess
    at: float
    limit_s: float = TERM_EXIT_S
    exited_at: float | None = None

    def tick(self) -> bool:
        """True once it exited or the limit passed."""
        if self.exited_at is None and self.proc.process.poll() is not None:
            self.exited_at = time.time()
        return self.exited_at is not None or time.time() > self.at + self.limit_s


@dataclass
class Resumption:
    seconds: float
    timed_out: bool
    pid: int | None


@dataclass
class Trials:
    """Runs the trials of one fleet."""

    fleet: Fleet
    rng: random.Random
    say: Say
    trials: int
    results: list[ScenarioResult] = field(default_factory=list)

    @property
    def config(self) -> str:
        return self.fleet.spec.config

    @property
    def host(self) -> str:
        return self.fleet.spec.host

    @property
    def gap_timeout_s(self) -> float:
        return GAP_TIMEOUT_S[self.host]

    # --- waits ---------------------------------------------------------------------------------------------

    def steady(self) -> bool:
        self.fleet.journal.refresh()
        now = time.time()
        for shard in self.fleet.shard_ids:
            last = self.fleet.journal.last_time(shard)
            if last is None or last < now - STEADY_WINDOW_S:
                return False
        return True

    def wait_steady(self, timeout_s: float = STEADY_TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.steady():
                return True
            time.sleep(0.25)
        return self.steady()

    def pick_victim(self) -> tuple[FleetProcess, list[str]]:
        """A live worker holding at least one shard (seeded choice), and the shards it holds."""
        deadline = time.monotonic() + 30
        while True:
            owners = self.fleet.lease_owners()
            workers = sorted(self.fleet.workers(), key=lambda p: p.started_at)
            candidates = [w for w in workers if any(o == w.name for o in owners.values())]
            if candidates or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if not candidates:
            raise NoVictim("no live worker held a shard for 30 s")
        victim = self.rng.choice(candidates)
        return victim, sorted(s for s, o in owners.items() if o == victim.name)

    def shards_of(self, proc: FleetProcess) -> list[str]:
        return sorted(s for s, o in self.fleet.lease_owners().items() if o == proc.name)

    def await_resumption(
        self,
        shards: Sequence[str],
        at: float,
        exclude: set[int],
        *,
        tick: Callable[[], bool] | None = None,
    ) -> dict[str, Resumption]:
        """Wait until each shard was processed by a process not in ``exclude`` at or after ``at`` (bounded).

        ``tick`` runs every poll; the wait also lasts until it returns True (or the same timeout)."""
        out: dict[str, Resumption] = {}
        deadline = at + self.gap_timeout_s
        tick_done = tick is None
        journal = self.fleet.journal
        while True:
            journal.refresh()
            for shard in shards:
                if shard not in out and (first := journal.first_after(shard, at, exclude=exclude)) is not None:
                    out[shard] = Resumption(first[0] - at, False, first[1])
            if tick is not None and not tick_done:
                tick_done = tick()
            if (len(out) == len(shards) and tick_done) or time.time() > deadline:
                break
            time.sleep(POLL_S)
        for shard in shards:
            out.setdefault(shard, Resumption(self.gap_timeout_s, True, None))
        return out

    def record(
        self,
        result: ScenarioResult,
        trial: int,
        victim: FleetProcess,
        at: float,
        resumed: dict[str, Resumption],
        **extra: object,
    ) -> list[float]:
        names = {p.pid: p.name for p in self.fleet.procs}
        for shard, r in sorted(resumed.items()):
            result.gaps.append(
                Gap(
                    config=self.config,
                    host=self.host,
                    liveness=self.fleet.spec.liveness,
                    scenario=result.scenario,
                    trial=trial,
                    shard=shard,
                    seconds=round(r.seconds, 3),
                    timed_out=r.timed_out,
                    victim=victim.name,
                    signal_wall=at,
                    resumed_by=names.get(r.pid) if r.pid is not None else None,
                    extra=dict(extra),
                )
            )
        return [r.seconds for r in resumed.values()]

    def _gaps_text(self, resumed: dict[str, Resumption], *, victim: FleetProcess | None = None) -> str:
        if not resumed:
            return "no shards"
        return ", ".join(
            f"{r.seconds:.1f}{' (TIMEOUT)' if r.timed_out else ''}"
            f"{' (itself)' if victim is not None and r.pid == victim.pid else ''}"
            for _, r in sorted(resumed.items())
        )

    def _before_trial(self, result: ScenarioResult, trial: int) -> None:
        if not self.wait_steady():
            result.steady_timeouts += 1
            result.notes.append(f"trial {trial}: fleet not steady after {STEADY_TIMEOUT_S:.0f} s, went on")

    def _verdict(self, watch: ExitWatch) -> str:
        """How a SIGTERMed process ended: ``exit <code> after <s> s`` or killed after the limit."""
        if watch.exited_at is None:
            try:
                watch.proc.process.wait(timeout=max(0.1, watch.at + watch.limit_s - time.time()))
                watch.exited_at = time.time()
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(watch.proc.pid, signal.SIGKILL)
                watch.proc.process.wait(timeout=10)
                return f"no exit within {watch.limit_s:.0f} s (killed)"
        return f"exit {watch.proc.process.returncode} after {watch.exited_at - watch.at:.1f} s"

    # --- scenarios -----------------------------------------------------------------------------------------

    def run(self, scenario: str) -> ScenarioResult:
        result = ScenarioResult(
            config=self.config, host=self.host, scenario=scenario, liveness=self.fleet.spec.liveness, start=time.time()
        )
        self.results.append(result)
        offsets = [(i + self.rng.random()) * LAMBDA_PERIOD_S / self.trials for i in range(self.trials)]
        self.rng.shuffle(offsets)
        for trial in range(self.trials):
            try:
                if scenario in ("kill", "term"):
                    self.signal_trial(result, trial, signal.SIGKILL if scenario == "kill" else signal.SIGTERM)
                elif scenario in LAMBDA_SCENARIOS:
                    sig = signal.SIGKILL if scenario == "lambda-kill" else signal.SIGTERM
                    self.signal_trial(result, trial, sig, offset_s=offsets[trial])
                elif scenario == "deploy":
                    self.deploy_trial(result, trial)
                elif scenario == "leader":
                    self.leader_trial(result, trial)
                elif scenario == "stop":
                    self.stop_trial(result, trial)
                elif scenario == "hang":
                    self.hang_trial(result, trial)
            except NoVictim as exc:
                result.notes.append(f"trial {trial} skipped: {exc}")
                self.say(f"    {scenario} #{trial + 1}: skipped ({exc})")
        result.end = time.time()
        return result

    def _align(self, offset_s: float) -> float:
        """Sleep until ``offset_s`` into a scheduled invocation period (at least 2 s from now); returns the time."""
        starts = self.fleet.invocation_starts()
        if not starts:
            return time.time()
        t0 = starts[0]
        k = math.ceil((time.time() + 2.0 - t0 - offset_s) / LAMBDA_PERIOD_S)
        target = t0 + k * LAMBDA_PERIOD_S + offset_s
        time.sleep(max(0.0, target - 0.3 - time.time()))
        return target

    def signal_trial(
        self, result: ScenarioResult, trial: int, sig: signal.Signals, *, offset_s: float | None = None
    ) -> None:
        self._before_trial(result, trial)
        extra: dict[str, object] = {}
        if offset_s is not None:
            target = self._align(offset_s)
            victim, shards = self.pick_victim()
            time.sleep(max(0.0, target - time.time()))
        else:
            victim, shards = self.pick_victim()
        at = self.fleet.signal(victim, sig)
        if offset_s is not None:
            starts = self.fleet.invocation_starts()
            extra["offset_s"] = round((at - starts[0]) % LAMBDA_PERIOD_S, 2) if starts else None
        watch = ExitWatch(victim, at) if sig == signal.SIGTERM else None
        resumed = self.await_resumption(shards, at, {victim.pid}, tick=watch.tick if watch else None)
        exit_text = ""
        if watch is not None:
            exit_text = self._verdict(watch)
            result.term_exits.append(exit_text)
            extra["exit"] = exit_text
            if not exit_text.startswith("exit 0 "):
                result.notes.append(f"trial {trial}: {victim.name} {exit_text}")
        else:
            victim.process.wait(timeout=10)
        self.record(result, trial, victim, at, resumed, **extra)
        where = f" at {extra['offset_s']} s into the minute" if "offset_s" in extra else ""
        self.say(
            f"    {result.scenario} #{trial + 1}: {sig.name} {victim.name}{where} ({len(shards)} shards): "
            f"gaps {self._gaps_text(resumed)} s{'; ' + exit_text if exit_text else ''}"
        )
        self.fleet.start_worker()

    def deploy_trial(self, result: ScenarioResult, trial: int) -> None:
        self._before_trial(result, trial)
        window_start = time.time()
        old = sorted(self.fleet.workers(), key=lambda p: p.started_at)
        timed_out: set[str] = set()
        steps = []
        for proc in old:
            new = self.fleet.start_worker()
            self._wait_started(new)
            shards = self.shards_of(proc)
            at = self.fleet.signal(proc, signal.SIGTERM)
            watch = ExitWatch(proc, at)
            resumed = self.await_resumption(shards, at, {proc.pid}, tick=watch.tick)
            exit_text = self._verdict(watch)
            if not exit_text.startswith("exit 0 "):
                result.notes.append(f"deploy {trial}: {proc.name} {exit_text}")
            timed_out.update(s for s, r in resumed.items() if r.timed_out)
            worst = max((r.seconds for r in resumed.values()), default=0.0)
            steps.append(f"{proc.name}→{new.name} {worst:.1f}")
        window_end = time.time()
        self.fleet.journal.refresh()
        idles = []
        for shard in self.fleet.shard_ids:
            times = self.fleet.journal.times_between(shard, window_start, window_end)
            points = [*times, window_end] if times else [window_start, window_end]
            longest = max((b - a for a, b in itertools.pairwise(points)), default=0.0)
            idles.append(longest)
            result.gaps.append(
                Gap(
                    config=self.config,
                    host=self.host,
                    liveness=self.fleet.spec.liveness,
                    scenario="deploy",
                    trial=trial,
                    shard=shard,
                    seconds=round(longest, 3),
                    timed_out=shard in timed_out,
                    victim="all",
                    signal_wall=window_start,
                    extra={"window_s": round(window_end - window_start, 1)},
                )
            )
        self.say(
            f"    deploy #{trial + 1}: {len(old)} workers in {window_end - window_start:.0f} s "
            f"(worst resumption per step: {', '.join(steps)}); longest idle per shard max {max(idles):.1f} s"
        )

    def _wait_started(self, proc: FleetProcess, timeout_s: float = 30.0) -> None:
        """The replacement is up (its log says so), as a deployment waits for the new task to run."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.alive():
            with contextlib.suppress(OSError):
                if b"worker started" in proc.log_path.read_bytes():
                    return
            time.sleep(0.2)

    def leader_trial(self, result: ScenarioResult, trial: int) -> None:
        self._before_trial(result, trial)
        victim, shards = self.pick_victim()
        old_leader = self.fleet.leader
        assert old_leader is not None
        at = self.fleet.signal(old_leader, signal.SIGKILL)
        self.fleet.signal(victim, signal.SIGKILL)
        new_leader = self.fleet.start_leader()
        takeover: list[float] = []
        next_read = 0.0

        def poll_lock() -> bool:
            nonlocal next_read
            if takeover:
                return True
            now = time.time()
            if now >= next_read:
                next_read = now + 0.25
                with contextlib.suppress(Exception):
                    if self.fleet.lock_owner() == new_leader.name:
                        takeover.append(time.time() - at)
            return bool(takeover)

        resumed = self.await_resumption(shards, at, {victim.pid}, tick=poll_lock)
        victim.process.wait(timeout=10)
        old_leader.process.wait(timeout=10)
        took = round(takeover[0], 2) if takeover else None
        result.takeovers_s.append(took)
        self.record(result, trial, victim, at, resumed, lock_takeover_s=took)
        self.say(
            f"    leader #{trial + 1}: SIGKILL {old_leader.name} + {victim.name} ({len(shards)} shards): gaps "
            f"{self._gaps_text(resumed)} s; lock taken by {new_leader.name} after "
            f"{f'{took:.1f} s' if took is not None else 'TIMEOUT'}"
        )
        self.fleet.start_worker()

    def stop_trial(self, result: ScenarioResult, trial: int) -> None:
        self._before_trial(result, trial)
        victim, shards = self.pick_victim()
        at = self.fleet.signal(victim, signal.SIGSTOP)
        continued: list[float] = []

        def resume_victim() -> bool:
            if not continued and time.time() >= at + STOP_S:
                continued.append(self.fleet.signal(victim, signal.SIGCONT))
            return bool(continued)

        # Any process may end the gap, the stopped one included: it cannot process while stopped, and when nobody
        # took its leases before it woke (KCL's pace) it renews or takes them again and serves them itself.
        # Whether it processed anything after a new owner had started is the separate overlap check.
        resumed = self.await_resumption(shards, at, set(), tick=resume_victim)
        if not continued:
            time.sleep(max(0.0, at + STOP_S - time.time()))
            continued.append(self.fleet.signal(victim, signal.SIGCONT))
        time.sleep(5.0)  # the woken worker notices what it lost (or journals what it should not have)
        self.fleet.journal.refresh()
        overlaps = self._overlaps(victim, shards, at)
        result.overlaps += len(overlaps)
        result.overlap_details.extend(overlaps[:20])
        self.record(result, trial, victim, at, resumed, overlaps=len(overlaps))
        self.say(
            f"    stop #{trial + 1}: SIGSTOP {victim.name} ({len(shards)} shards) for {continued[0] - at:.0f} s: "
            f"gaps {self._gaps_text(resumed, victim=victim)} s; overlaps {len(overlaps)}"
        )

    def hang_trial(self, result: ScenarioResult, trial: int) -> None:
        self._before_trial(result, trial)
        victim, shards = self.pick_victim()
        marker = self.fleet.journal_dir / f"{HANG_MARKER_PREFIX}{victim.pid}"
        marker.touch()  # its processors hang in shutdown_requested from now on
        try:
            at = self.fleet.signal(victim, signal.SIGTERM)
            resumed = self.await_resumption(shards, at, {victim.pid})
            self.fleet.signal(victim, signal.SIGKILL)  # it would hang on: it never finished its shutdown
            victim.process.wait(timeout=10)
        finally:
            marker.unlink(missing_ok=True)
        timeout_s = int(self.fleet.env.get("SHARDLEASE_SHUTDOWN_TIMEOUT_MS") or 30_000) / 1000
        past = [round(r.seconds - timeout_s, 3) for r in resumed.values() if not r.timed_out]
        result.past_timeout_s.extend(past)
        self.record(result, trial, victim, at, resumed, shutdown_timeout_s=timeout_s)
        self.say(
            f"    hang #{trial + 1}: SIGTERM {victim.name} ({len(shards)} shards), its processors hang: gaps "
            f"{self._gaps_text(resumed)} s (shutdown timeout {timeout_s:.0f} s)"
        )
        self.fleet.start_worker()

    def _overlaps(self, victim: FleetProcess, shards: Sequence[str], at: float) -> list[str]:
        """Records the stopped worker processed on a shard after its new owner's first one (before it was given
        the shard again, i.e. before its own next INIT on it)."""
        out: list[str] = []
        journal = self.fleet.journal
        for shard in shards:
            other = journal.first_after(shard, at, exclude={victim.pid})
            if other is None:
                continue  # nobody else took it (it rejoined, or the wait timed out)
            first_other = other[0]
            regained = min(
                (
                    e.wall
                    for e in journal.events
                    if e.pid == victim.pid and e.shard == shard and e.kind == "INIT" and e.wall > at
                ),
                default=math.inf,
            )
            out.extend(
                f"{victim.name} processed {rec.record_id} at +{rec.wall - at:.2f} s, new owner from "
                f"+{first_other - at:.2f} s"
                for rec in journal.records
                if rec.pid == victim.pid and rec.shard == shard and first_other < rec.wall < regained
            )
        return out


# --- a fleet ---------------------------------------------------------------------------------------------------


@dataclass
class FleetOutcome:
    config: str
    host: str
    results: list[ScenarioResult]
    liveness: str = "lease"
    lost: int = 0
    lost_ids: list[str] = field(default_factory=list)
    duplicates: Counter[str] = field(default_factory=Counter)
    produced: int = 0
    processed: int = 0
    notes: list[str] = field(default_factory=list)
    invocations: list[str] = field(default_factory=list)


def run_fleet(
    outcome: FleetOutcome,
    *,
    scenarios: Sequence[str],
    trials: int,
    rng: random.Random,
    workdir: Path,
    say: Say,
    retrieval: str = "polling",
) -> None:
    """Run one fleet's scenarios; ``outcome`` fills in as trials finish (partial figures survive an interrupt)."""
    config, host = outcome.config, outcome.host
    spec = FleetSpec(
        config=config,
        host=host,
        env=config_env(config, outcome.liveness),
        lambda_timeout_s=LAMBDA_TIMEOUT_S[config],
        liveness=outcome.liveness,
        record_liveness=config == "ours",
        retrieval=retrieval,
    )
    fleet = Fleet(spec, workdir, say)
    try:
        fleet.start()
        runner = Trials(fleet=fleet, rng=rng, say=say, trials=trials, results=outcome.results)
        started = time.monotonic()
        if not runner.wait_steady(START_TIMEOUT_S):
            raise RuntimeError(f"the fleet did not serve every shard within {START_TIMEOUT_S:.0f} s of its start")
        say(f"  steady after {time.monotonic() - started:.0f} s")
        if spec.record_liveness:
            check_liveness(fleet, outcome, say)
        for scenario in scenarios:
            say(f"  {scenario}:")
            runner.run(scenario)
        missing, notes = fleet.stop(drain_s=DRAIN_S)
        outcome.notes.extend(notes)
        if missing:
            outcome.notes.append(f"{missing} records still unprocessed after the {DRAIN_S:.0f} s drain")
        produced = fleet.produced()
        misrouted = fleet.misrouted()
        if misrouted:
            outcome.notes.append(f"{misrouted} records landed on another shard than aimed at")
        fates: dict[int, list[Fate]] = {}
        for proc in fleet.procs:
            for wall, sig in cut_signals(proc):
                fates.setdefault(proc.pid, []).append(
                    Fate(proc.name, "killed" if sig == "SIGKILL" else "stopped", wall)
                )
        windows = [(r.scenario, r.start, r.end) for r in outcome.results]
        lost, duplicates, lost_ids = classify_records(fleet.journal.records, produced, fates, windows)
        for r in outcome.results:
            r.lost = lost.get(r.scenario, 0)
            r.duplicates = duplicates.get(r.scenario, Counter())
        outcome.lost = sum(lost.values())
        outcome.lost_ids = lost_ids
        for counter in duplicates.values():
            outcome.duplicates.update(counter)
        outcome.produced = len(produced)
        outcome.processed = len(fleet.journal.records)
        if lost.get("-") or duplicates.get("-"):
            outcome.notes.append(
                f"outside the scenarios (start-up, drain): lost {lost.get('-', 0)}, "
                f"duplicates {sum(duplicates.get('-', Counter()).values())}"
            )
        outcome.invocations = fleet.invocation_lines()
    except Exception as exc:  # one broken fleet must not cost the others (Interrupted is not an Exception)
        outcome.notes.append(f"fleet aborted: {type(exc).__name__}: {exc}")
        say(f"  ABORTED: {exc}")
    finally:
        fleet.close()


def check_liveness(fleet: Fleet, outcome: FleetOutcome, say: Say) -> None:
    """Say which liveness mode the application and each worker run in (the figures are only worth their mode):
    a worker whose beat says another mode than the fleet's is noted."""
    stored = fleet.stored_liveness()
    said = fleet.worker_liveness()
    counts = Counter(said.values())
    described = ", ".join(f"{n} in {mode}" for mode, n in sorted(counts.items())) or "none heartbeating"
    say(f"  liveness mode stored: {stored}; workers: {described}")
    if stored != outcome.liveness:
        outcome.notes.append(f"the stored liveness mode is {stored!r}, not {outcome.liveness!r}")
    others = sorted(w for w, mode in said.items() if mode != outcome.liveness)
    if others:
        outcome.notes.append(f"workers not in {outcome.liveness} mode once steady: {', '.join(others)}")


# --- main ------------------------------------------------------------------------------------------------------


def _csv(text: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in items if x not in allowed]
    if unknown or not items:
        raise argparse.ArgumentTypeError(f"unknown {what}: {','.join(unknown) or '(none)'}; use {','.join(allowed)}")
    return items


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--configs", default="ours,kcl", type=lambda t: _csv(t, ("ours", "kcl"), "config"))
    parser.add_argument("--hosts", default="cli,lambda", type=lambda t: _csv(t, ("cli", "lambda"), "host"))
    parser.add_argument(
        "--scenarios", default=",".join(ALL_SCENARIOS), type=lambda t: _csv(t, ALL_SCENARIOS, "scenario")
    )
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument(
        "--liveness",
        choices=LIVENESS_MODES,
        default="lease",
        help="liveness mode of every process of the ours configuration (default lease; kcl is unaffected)",
    )
    parser.add_argument(
        "--baseline-trials",
        type=int,
        default=None,
        metavar="N",
        help="trials per scenario for the kcl baseline (default: --trials); its fleets take ~4x as long",
    )
    parser.add_argument(
        "--retrieval",
        choices=["polling", "fanout"],
        default="polling",
        help="how every process reads (fanout: Kinesis on kinesis-local behind the fan-out proxy)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, metavar="PATH", help="dump every raw gap and the summary")
    parser.add_argument("--plot", type=Path, metavar="PATH.png", help="CDF plot of the gaps")
    parser.add_argument("--keep-logs", type=Path, metavar="DIR", help="keep journals and process logs here")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if args.baseline_trials is None:
        args.baseline_trials = args.trials
    if args.baseline_trials < 1:
        parser.error("--baseline-trials must be at least 1")
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """(config, host, scenarios) per fleet; the lambda host runs only the lambda-* scenarios, cli the others."""
    fleets: list[tuple[str, str, list[str]]] = []
    for host in ("cli", "lambda"):
        if host not in args.hosts:
            continue
        wanted = [s for s in args.scenarios if (s in LAMBDA_SCENARIOS) == (host == "lambda")]
        if not wanted:
            continue
        fleets.extend((config, host, wanted) for config in args.configs)
    return fleets


def estimate_s(fleets: Sequence[tuple[str, str, list[str]]], trials: dict[str, int]) -> float:
    return sum(EST_FLEET_S + trials[c] * sum(EST_TRIAL_S[c][s] for s in scenarios) for c, _, scenarios in fleets)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()

    def say(text: str) -> None:
        elapsed = int(time.monotonic() - began)
        print(f"[{elapsed // 60:3d}:{elapsed % 60:02d}] {text}", flush=True)

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    fleets = plan(args)
    if not fleets:
        print("nothing to run: no scenario of the chosen hosts (lambda-* need --hosts lambda)", file=sys.stderr)
        return 2
    inherited = sorted(k for k in os.environ if k.startswith("SHARDLEASE_"))
    load_before = os.getloadavg()
    trials = {"ours": args.trials, "kcl": args.baseline_trials}
    estimate = estimate_s(fleets, trials)
    described = ", ".join(f"{c}/{h} [{' '.join(s)}]" for c, h, s in fleets)
    say(
        f"failover benchmark: {len(fleets)} fleet(s) {described}, trials ours {trials['ours']} / kcl "
        f"{trials['kcl']} per scenario, ours in liveness mode {args.liveness}, seed {args.seed}; estimated "
        f"{estimate / 60:.0f} min"
    )
    if inherited:
        say(f"  ignoring inherited {', '.join(inherited)} (children get only the benchmark's settings)")
    keep = args.keep_logs
    root = Path(tempfile.mkdtemp(prefix="shardlease-failover-", dir=keep)) if keep else None
    outcomes: list[FleetOutcome] = []
    code = 0
    try:
        for index, (config, host, scenarios) in enumerate(fleets):
            workdir = (root / f"{config}-{host}") if root else Path(tempfile.mkdtemp(prefix=f"failover-{config}-"))
            workdir.mkdir(parents=True, exist_ok=True)
            rng = random.Random(f"{args.seed}:{config}:{host}")
            liveness = liveness_of(config, args.liveness)
            say(f"fleet {index + 1}/{len(fleets)}: {config} config, {host} leader host, liveness mode {liveness}")
            try:
                outcome = FleetOutcome(config=config, host=host, results=[], liveness=liveness)
                outcomes.append(outcome)
                run_fleet(
                    outcome,
                    scenarios=scenarios,
                    trials=trials[config],
                    rng=rng,
                    workdir=workdir,
                    say=say,
                    retrieval=args.retrieval,
                )
            finally:
                if root is None:
                    shutil.rmtree(workdir, ignore_errors=True)
    except Interrupted as exc:
        say(f"interrupted ({exc}): stopping every process")
        code = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        CHILDREN.kill_all()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    load_after = os.getloadavg()
    results = [r for o in outcomes for r in o.results]
    print()
    for line in table(results):
        print(line)
    for o in outcomes:
        print(
            f"\n{o.config}/{o.host} ({o.liveness} mode): produced {o.produced}, processed {o.processed} "
            f"(with repeats), lost {o.lost}"
        )
        if o.lost_ids:
            print(f"  lost ids, e.g. {', '.join(o.lost_ids[:10])}")
        for reason, count in sorted(o.duplicates.items()):
            print(f"  {count:>6}  {reason}")
        for r in o.results:
            for note in r.notes:
                print(f"  {r.scenario}: {note}")
            if r.takeovers_s:
                takeovers = ", ".join("-" if t is None else f"{t:.1f}" for t in r.takeovers_s)
                print(f"  {r.scenario}: lock takeover s: {takeovers}")
            if r.scenario == "stop":
                itself = sum(1 for g in r.gaps if g.resumed_by == g.victim)
                print(
                    f"  stop: {itself} of {len(r.gaps)} shards served again by the stopped worker itself (nobody else"
                    f" took them); overlaps {r.overlaps}{' e.g. ' + r.overlap_details[0] if r.overlap_details else ''}"
                )
            if r.term_exits:
                print(f"  {r.scenario}: exits {Counter(t.split(' after')[0] for t in r.term_exits)}")
            if r.past_timeout_s:
                past = sorted(r.past_timeout_s)
                print(
                    f"  hang: shards served again {statistics.median(past):.1f} s (median), {past[-1]:.1f} s (max) "
                    f"after the departing worker's shutdown timeout ran out"
                )
        for note in o.notes:
            print(f"  {note}")
        if o.invocations:
            overran = [line for line in o.invocations if "OVERRAN" in line]
            errors = [line for line in o.invocations if line.startswith("END") and "error=-" not in line]
            ends = [line for line in o.invocations if line.startswith("END")]
            print(
                f"  lambda: {len(ends)} invocations ended, {sum('leader=1' in e for e in ends)} led, "
                f"{len(overran)} overran the timeout, {len(errors)} failed"
            )
    duration = time.monotonic() - began
    meta = {
        "argv": sys.argv[1:],
        "seed": args.seed,
        "liveness": args.liveness,
        "trials": trials,
        "kcl_env": KCL_ENV,
        "lambda_timeout_s": LAMBDA_TIMEOUT_S,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "duration_s": round(duration, 1),
        "cpus": os.cpu_count(),
        "fleets": [
            {
                "config": o.config,
                "host": o.host,
                "liveness": o.liveness,
                "produced": o.produced,
                "lost": o.lost,
                "notes": o.notes,
            }
            for o in outcomes
        ],
    }
    if args.json:
        dump_json(args.json, results, meta)
        print(f"\nraw gaps: {args.json}")
    if args.plot:
        problem = plot_cdf(args.plot, results)
        print(f"plot: {problem}" if problem else f"plot: {args.plot}")
    if root is not None:
        print(f"logs kept in {root}")
    print(
        f"\nmachine: {os.cpu_count()} CPUs, load average {load_before[0]:.2f}/{load_before[1]:.2f}/"
        f"{load_before[2]:.2f} before, {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f} after; "
        f"took {duration / 60:.1f} min (estimated {estimate / 60:.0f} min)"
    )
    ours_cli = [o for o in outcomes if o.config == "ours" and o.host == "cli"]
    lost_total = sum(o.lost for o in ours_cli)
    duplicates_total = sum(sum(o.duplicates.values()) for o in ours_cli)
    print(final_line(results, lost_total, duplicates_total, liveness=args.liveness, retrieval=args.retrieval))
    if any(o.lost for o in outcomes):
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
