"""From the measured window to every scale: how each call's rate and units grow with leases and workers
(:data:`FORMULAS`, printed with the report), the totals, the ``lease`` ÷ ``worker`` comparison and the checks of
the window.

Pure functions of the measured results, so the formulas can be read (and changed) without running a fleet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from worker_lib.leader.assigner import PARALLEL_SCAN_SEGMENTS, PARALLEL_SCAN_THRESHOLD
from worker_lib.leases.mode import LivenessMode
from worker_lib.tables.schema import WorkerMetricsAttr
from worker_lib.workermetrics.stats_store import MAX_NOTICE_KEYS

from .configs import CONFIG_TITLE
from .counting import Key, label
from .measure import ConfigResult
from .prices import LAMBDA_GB, MINUTES_PER_MONTH, PRICE_PER_GB_S, PRICE_PER_REQUEST, PRICE_PER_RRU, PRICE_PER_WRU
from .scale import ScaleInputs
from .sizes import PAGE_BYTES, READS, WRITES, read_units, write_units


def verb(key: Key) -> str:
    return key[2].split()[0]


def consistent(key: Key) -> bool:
    return key[2].endswith(" SC")


def rule(key: Key) -> str:
    """How a call's rate and units scale with L leases and W workers (see :data:`FORMULAS`)."""
    role, table, _, purpose = key
    kind = verb(key)
    if table in ("kinesis", "other") or kind not in READS | WRITES:
        return "not DynamoDB data" if table == "kinesis" else "per minute"
    if role == "worker":
        if table == "lease GSI":
            return "GSI query"
        if table == "lease":
            return "per lease"
        return "row write" if table == "metrics" and kind in WRITES else "per worker"
    if table == "lease":
        return "lease scan" if kind == "Scan" else "per lease"
    if table == "metrics":
        if kind == "Scan":
            return "row scan"
        return "row write" if kind in WRITES else "per worker"
    if table == "state" and purpose.startswith("expiry obs"):
        return "observations"
    return "per minute"


FORMULAS = """\
Extrapolation to L leases / W workers (L0, W0 = measured; c = calls/min measured; u = RRU or WRU per call measured):
  per lease     calls = c·L/L0,  units/call = u (lease writes: ⌈b_l/1 KB⌉ WRU)  (renewals, throughput updates)
  per worker    calls = c·W/W0,  units/call = u  (a worker's mode re-read: one consistent GetItem a minute)
  row write     calls = c·W/W0,  WRU/call = ⌈b_w/1 KB⌉  (heartbeat, metrics report, hand-off request: a worker's row)
  GSI query     calls = c·W/W0,  RRU/call = ½·⌈(L/W)·b_k/4 KB⌉  (eventually consistent, KEYS_ONLY entries)
  lease scan    calls = c·s·⌈L·b_l/(s·1 MB)⌉,  RRU/scan = ½·s·⌈L·b_l/(s·4 KB)⌉ (eventually consistent, as KCL's);
                s = 4 segments for the assignment scan when L > 1 000, else 1 (shard sync always 1)
  row scan      calls = c,  RRU/call = ½·⌈W·b_w/4 KB⌉  (eventually consistent Scan of the worker rows)
  observations  calls = c,  PutItem ⌈o(L)/1 KB⌉ WRU, GetItem ⌈o(L)/4 KB⌉ RRU  (o(L): expiry-observation item)
  per minute    calls = c,  units = measured  (leader lock, lease-cap and mode items, takeover polls: independent
                of L, W)
  b_l: lease item, b_k: GSI entry, o(L): measured at scale on moto; b_w: the config's largest worker row measured
  at the end of the run, at its steady size (full metric histories, 36-character worker id, 7-digit counters; no
  notice list or hand-off requests: the beat after either removes it).
Throughput updates (worker mode) follow the traffic: as measured (none without records; rare under steady traffic),
  and in the worst case L·60 000/T calls of ⌈b_l/1 KB⌉ WRU (every lease's throughput moving by more than a fifth
  every T = throughput update interval, 60 s), in place of the measured ones.
Monthly: units/min × 43 200 min × price; Lambda: 43 200 invocations × billed s × 0.25 GB × $/GB-s + requests."""


def notice_list_bytes(keys: int) -> int:
    """The ``asl`` attribute naming ``keys`` lease keys of 20 characters (``shardId-000000000123``)."""
    return len(WorkerMetricsAttr.ASSIGNED_KEYS) + 3 + keys * (20 + 1)


def worker_row_bytes(result: ConfigResult) -> int:
    """``b_w``: the largest row of the run at its steady size; the same at every scale (a row holds only its own
    worker's figures, and no notice list between a notice and the beat that consumes it)."""
    return max(result.worker_row_bytes_steady or [0])


def notice_burst_wru(result: ConfigResult, leases: int, workers: int) -> float:
    """The one-off cost, per worker, of a notice naming its whole share at once (a fleet that started together,
    at most ``MAX_NOTICE_KEYS`` keys): the notice's UpdateItem and the beat that consumes it, each charged on the row
    with the list."""
    keys = min(leases // max(1, workers), MAX_NOTICE_KEYS)
    return 2 * write_units(worker_row_bytes(result) + notice_list_bytes(keys))


@dataclass(frozen=True)
class Scaled:
    calls: float
    units: float


def extrapolate(result: ConfigResult, key: Key, leases: int, workers: int, inputs: ScaleInputs) -> Scaled:
    calls, units = result.per_minute(key)
    per_call = units / calls if calls else 0.0
    kind = rule(key)
    lease_ratio, worker_ratio = leases / result.leases, workers / result.workers
    if kind == "per lease":
        if verb(key) in WRITES:
            per_call = write_units(int(inputs.lease_bytes))
        return Scaled(calls * lease_ratio, calls * lease_ratio * per_call)
    if kind == "per worker":
        return Scaled(calls * worker_ratio, calls * worker_ratio * per_call)
    if kind == "row write":  # heartbeat, metrics report (and a stopped-row delete): the worker's row
        return Scaled(calls * worker_ratio, calls * worker_ratio * write_units(worker_row_bytes(result)))
    if kind == "GSI query":
        entries = leases / workers * inputs.gsi_entry_bytes
        return Scaled(calls * worker_ratio, calls * worker_ratio * read_units(math.ceil(entries), consistent=False))
    if kind == "lease scan":
        segments = PARALLEL_SCAN_SEGMENTS if leases > PARALLEL_SCAN_THRESHOLD and key[3] != "shard sync" else 1
        segment_bytes = leases * inputs.lease_bytes / segments
        pages = segments * max(1, math.ceil(segment_bytes / PAGE_BYTES))
        scan_units = segments * read_units(math.ceil(segment_bytes), consistent=consistent(key))
        return Scaled(calls * pages, calls * scan_units)
    if kind == "row scan":
        nbytes = workers * worker_row_bytes(result)
        return Scaled(calls, calls * read_units(nbytes, consistent=consistent(key)))
    if kind == "observations":
        size = inputs.observation_bytes[leases]
        per_obs = write_units(size) if verb(key) in WRITES else read_units(size, consistent=consistent(key))
        return Scaled(calls, calls * per_obs)
    return Scaled(calls, units)


@dataclass
class Totals:
    read_calls: float = 0.0
    read_units: float = 0.0
    write_calls: float = 0.0
    write_units: float = 0.0

    def add(self, key: Key, calls: float, units: float) -> None:
        if verb(key) in READS:
            self.read_calls += calls
            self.read_units += units
        elif verb(key) in WRITES:
            self.write_calls += calls
            self.write_units += units

    @property
    def dynamodb_month(self) -> float:
        return (self.read_units * PRICE_PER_RRU + self.write_units * PRICE_PER_WRU) * MINUTES_PER_MONTH


def lambda_month(result: ConfigResult) -> float:
    return MINUTES_PER_MONTH * (result.billed_invocation_s * LAMBDA_GB * PRICE_PER_GB_S + PRICE_PER_REQUEST)


def scaled_totals(result: ConfigResult, leases: int, workers: int, inputs: ScaleInputs) -> Totals:
    totals = Totals()
    for key in result.tallies:
        if rule(key) != "not DynamoDB data":
            scaled = extrapolate(result, key, leases, workers, inputs)
            totals.add(key, scaled.calls, scaled.units)
    return totals


def measured_totals(result: ConfigResult) -> Totals:
    totals = Totals()
    for key in result.tallies:
        totals.add(key, *result.per_minute(key))
    return totals


THROUGHPUT = "throughput update"


def worst_case_totals(result: ConfigResult, leases: int, workers: int, inputs: ScaleInputs) -> Totals:
    """``worker`` mode with every lease's throughput rewritten as often as allowed (its value moving by more than a
    fifth every interval), in place of the throughput updates measured; other configurations as scaled."""
    totals = Totals()
    for key in result.tallies:
        if rule(key) != "not DynamoDB data" and key[3] != THROUGHPUT:
            scaled = extrapolate(result, key, leases, workers, inputs)
            totals.add(key, scaled.calls, scaled.units)
    if result.mode == LivenessMode.WORKER.value and result.heartbeat_ms:
        calls = leases * 60_000 / result.throughput_interval_ms
        totals.write_calls += calls
        totals.write_units += calls * write_units(int(inputs.lease_bytes))
    return totals


def timed_sources(result: ConfigResult, key: Key) -> int:
    """The timed loops that make ``key``'s calls: one per worker (per lease for a lease's calls), one per leader
    invocation that ran in the window."""
    kind = rule(key)
    if kind == "per lease":
        return result.leases
    if key[0] == "worker" or kind in ("per worker", "row write", "GSI query"):
        return result.workers
    return max(1, result.invocations_in_window)


def granularity(result: ConfigResult, key: Key, leases: int, workers: int, inputs: ScaleInputs) -> Scaled:
    """What one more call per timed source in the window would add at scale: the difference two runs of the same
    code can show, since their loops start at slightly different moments against the window's edges."""
    calls, _ = result.per_minute(key)
    if not calls:
        return Scaled(0.0, 0.0)
    scaled = extrapolate(result, key, leases, workers, inputs)  # linear in the measured calls
    factor = timed_sources(result, key) / result.minutes / calls
    return Scaled(scaled.calls * factor, scaled.units * factor)


@dataclass(frozen=True)
class ReadExcess:
    """A call that reads more in ``worker`` mode than in ``lease`` mode, at one scale."""

    key: Key
    lease: Scaled
    worker: Scaled
    allowance: Scaled

    @property
    def explained(self) -> bool:
        tiny = 1e-9
        return (
            self.worker.calls - self.lease.calls <= self.allowance.calls + tiny
            and self.worker.units - self.lease.units <= self.allowance.units + tiny
        )


@dataclass(frozen=True)
class Comparison:
    """``lease`` against ``worker`` mode at one scale."""

    leases: int
    workers: int
    lease: Totals
    worker: Totals
    worker_worst: Totals  # throughput of every lease rewritten every interval
    excesses: tuple[ReadExcess, ...]  # calls that read more in worker mode

    @property
    def ratio(self) -> float:
        return self.lease.write_calls / self.worker.write_calls if self.worker.write_calls else math.inf

    @property
    def unit_ratio(self) -> float:
        return self.lease.write_units / self.worker.write_units if self.worker.write_units else math.inf

    @property
    def worst_ratio(self) -> float:
        return self.lease.write_calls / self.worker_worst.write_calls if self.worker_worst.write_calls else math.inf

    @property
    def reads_more(self) -> bool:
        """Worker mode reads more calls or units in total (before asking whether the window's granularity explains
        it)."""
        tiny = 1e-9
        return (
            self.worker.read_calls > self.lease.read_calls + tiny
            or self.worker.read_units > self.lease.read_units + tiny
        )

    @property
    def unexplained(self) -> tuple[ReadExcess, ...]:
        return tuple(e for e in self.excesses if not e.explained)

    @property
    def reads_fail(self) -> bool:
        return self.reads_more and bool(self.unexplained)

    def reads_verdict(self) -> str:
        lt, wt = self.lease, self.worker
        figures = (
            f"worker mode {wt.read_calls:.1f} reads/min ({wt.read_units:.1f} RRU), lease mode {lt.read_calls:.1f} "
            f"({lt.read_units:.1f} RRU)"
        )
        if not self.reads_more:
            return f"reads OK: {figures}"
        if not self.unexplained:
            return (
                f"reads OK: {figures}; the difference is within one call per timed source in the window: "
                + ", ".join(f"{e.key[3]} +{e.worker.calls - e.lease.calls:.1f}" for e in self.excesses)
            )
        return f"READS HIGHER in worker mode: {figures}; " + "; ".join(
            f"{label(e.key)} {e.worker.calls:.1f} calls/{e.worker.units:.1f} RRU against {e.lease.calls:.1f}/"
            f"{e.lease.units:.1f} (one call more per timed source: +{e.allowance.calls:.1f}/+{e.allowance.units:.1f})"
            for e in self.unexplained
        )


def compare(lease: ConfigResult, worker: ConfigResult, leases: int, workers: int, inputs: ScaleInputs) -> Comparison:
    excesses = []
    for key in ordered_keys([lease, worker]):
        if verb(key) not in READS:
            continue
        in_lease = key in lease.tallies
        l_scaled = extrapolate(lease, key, leases, workers, inputs) if in_lease else Scaled(0.0, 0.0)
        w_scaled = extrapolate(worker, key, leases, workers, inputs) if key in worker.tallies else Scaled(0.0, 0.0)
        if w_scaled.calls > l_scaled.calls or w_scaled.units > l_scaled.units:
            # A call lease mode does not make at all is never explained by the window's granularity.
            allowance = granularity(lease, key, leases, workers, inputs) if in_lease else Scaled(0.0, 0.0)
            excesses.append(ReadExcess(key, l_scaled, w_scaled, allowance))
    return Comparison(
        leases=leases,
        workers=workers,
        lease=scaled_totals(lease, leases, workers, inputs),
        worker=scaled_totals(worker, leases, workers, inputs),
        worker_worst=worst_case_totals(worker, leases, workers, inputs),
        excesses=tuple(excesses),
    )


def calls_of(result: ConfigResult, *, role: str, op: str, purpose: str) -> int:
    return sum(t.calls for k, t in result.tallies.items() if k[0] == role and verb(k) == op and k[3] == purpose)


def window_checks(result: ConfigResult) -> tuple[list[str], list[str]]:
    """What the window shows about the mode the configuration ran in: (lines to print, failures)."""
    title = CONFIG_TITLE[result.name]
    lines: list[str] = []
    failures: list[str] = []
    renewals = calls_of(result, role="worker", op="UpdateItem", purpose="renewal")
    beats = calls_of(result, role="worker", op="UpdateItem", purpose="heartbeat")
    throughput = calls_of(result, role="worker", op="UpdateItem", purpose=THROUGHPUT)
    per_lease = renewals / result.leases / result.minutes
    per_worker = beats / result.workers / result.minutes
    lines.append(
        f"{title:<12} stored mode {result.stored_mode!r}; worker rows say {result.row_modes}; renewals "
        f"{renewals} ({per_lease:.2f} per lease per min); heartbeats {beats} ({per_worker:.2f} per worker per min"
        + (f", one every {60 / per_worker:.2f} s" if per_worker else "")
        + f"); throughput updates {throughput}"
    )
    if result.stored_mode != result.mode:
        failures.append(f"{title}: the LivenessMode item says {result.stored_mode!r}, not {result.mode!r}")
    if result.mode == LivenessMode.WORKER.value and renewals:
        failures.append(f"{title}: {renewals} renewal UpdateItems in the window (none expected in worker mode)")
    if result.heartbeat_ms:
        expected = 60_000 / result.heartbeat_ms
        # A beat more or less per worker at the window's edges, and 5 % for the loop's drift.
        tolerance = 1 / result.minutes + 0.05 * expected
        if abs(per_worker - expected) > tolerance:
            failures.append(
                f"{title}: {per_worker:.2f} heartbeats per worker per minute, expected {expected:.0f} (one every "
                f"{result.heartbeat_ms / 1000:g} s)"
            )
        if len(result.row_modes) < result.workers or any(m != result.mode for m in result.row_modes):
            failures.append(f"{title}: worker rows say {result.row_modes}, not all {result.mode!r}")
    return lines, failures


def headline(comparison: Comparison) -> str:
    """The run's summary line at one scale (the last line of the output at 1 000/20)."""
    return (
        f"writes per minute at {comparison.leases} leases/{comparison.workers} workers: lease "
        f"{round(comparison.lease.write_calls)}, worker {round(comparison.worker.write_calls)}, ratio "
        f"{comparison.ratio:.1f}×"
    )


def ordered_keys(results: list[ConfigResult], *, dynamodb: bool = True) -> list[Key]:
    keys = {key for result in results for key in result.tallies}
    keys = {key for key in keys if (rule(key) != "not DynamoDB data") == dynamodb}
    return sorted(keys, key=lambda k: (k[0] != "leader", k[1], k[2], k[3]))
