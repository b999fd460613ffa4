"""Measure the DynamoDB calls and request units of both liveness modes, for the cost model in docs/deploy.md §5.

For each configuration (``--liveness lease|worker|both`` or ``lease,worker``, default both; ``--configs kcl`` adds
the KCL-timings baseline), run one after the other on one moto server at production timings, each on its own
application: W in-process workers (``--workers``, 2) holding the L leases of an L-shard stream (``--shards``, 8),
and the leader through the real Lambda handler, one invocation started every 60 s in its own thread as EventBridge
would (``lease``/``worker``: 80 s budget, 65 s term, so consecutive invocations overlap and hand over; ``kcl``: 60 s
budget, 50 s term). Configurations:

* ``lease`` — liveness mode ``lease``, the code's defaults (``SHARDLEASE_LIVENESS_MODE=lease``): every held lease
  renewed every 3.308 s; a worker heartbeat every second (an UpdateItem on the worker's own
  ``<app>-WorkerMetricStats`` row that returns the row as it was and removes the notice's key list, so it brings
  back the leader's assignment notice and consumes it in one step); GSI discovery as a 60 s safety net once a notice
  was seen; the mode re-read once a minute per worker; the leader's liveness tick (an eventually consistent Scan of
  the worker rows every second), fast assignment passes, notices, gone-worker confirmation reads, expiry
  observations kept in ``CoordinatorState``, the mode read at every full cycle, leader lock 10 s / 3 s heartbeat,
  the takeover wait of an overlapping invocation (one lock read every 0.5 s).
* ``worker`` — liveness mode ``worker`` (``SHARDLEASE_LIVENESS_MODE=worker`` for every worker and the leader; the
  bench records the mode before the fleet starts, as ``shardlease liveness --set worker`` does for a new
  application): no renewals — the heartbeat, every 2 s, is the only liveness write; a lease's ``throughputKBps`` is
  written only when it changed by more than a fifth (and 1 KBps), at most once a minute; hand-off requests go on the
  old owner's row; the leader judges heartbeating owners per owner. Everything else as ``lease``.
* ``kcl`` (not in the default run) — KCL timings in ``lease`` mode: the same code with
  :data:`kcl3_timings.KCL_ENV` (shared with bench/failover.py) for every worker and the leader (no heartbeat, no fast
  tick, GSI discovery every 9 975 ms per worker, lock 30 s / 10 s, no takeover wait; the 60 s Lambda timeout less the
  10 s margin makes a 50 s term): KCL 3.x's read pattern (leader scans every 20 s, per-worker GSI discovery), not
  KCL's Java code.

Lease-table scans are eventually consistent in all (as KCL 3.x's ``DynamoDBLeaseRefresher``, whose scans set no
``consistentRead``). No records flow: checkpoints are the user's rate, the same in both modes, and left out.

After a warm-up (``--warmup``, 70 s: past the first invocation, which leads its whole term without waiting for a
predecessor — every later one starts with the hand-over — all leases held and every worker row saying the mode it
runs in), every DynamoDB call in ``--minutes`` is counted per (configuration, role, table, operation, purpose) by
botocore hooks (``before-parameter-build`` keeps the request, ``after-call`` sees the parsed reply, also for
conditional-check failures, which are charged like writes). Request units are estimated from item sizes with
DynamoDB's rules: reads ⌈bytes/4 KB⌉ per call (strongly consistent; half for eventually consistent; at least one
unit), Scan/Query on the summed size of the items returned by the call; writes ⌈item size/1 KB⌉, for an UpdateItem
the larger of the item before and after the write (after: from ``ReturnValues=ALL_NEW``, or a consistent GetItem by
an uncounted client; before: from ``ReturnValues=ALL_OLD``, as the heartbeat returns). The window is then checked:
in ``worker`` mode no renewal at all and a heartbeat every 2 s per worker (1 s in ``lease``), and, read at the end,
the stored ``LivenessMode`` item and every worker row's ``lvm`` say the configuration's mode; a failed check fails
the run.

Rates per lease, per worker and per minute are extrapolated to every combination of 100 / 1 000 / 10 000 leases and
20 / 100 workers with the formulas printed by the script (and in docs/deploy.md), with lease items, GSI entries and
expiry-observation items measured at those sizes on moto, and worker rows as measured at the end of the run,
completed to their steady size (full metric histories, KCL-style 36-character worker ids, 7-digit counters).
Throughput updates (``worker`` mode) follow the traffic: none were measured without records, and steady traffic
keeps them rare; the worst case — every lease's throughput moving by more than a fifth every minute — adds one write
per lease per minute, and that ratio is printed beside the measured one.

Reads: ``worker`` mode must read no more than ``lease`` mode at every scale. The two configurations run one after
the other, so the leader's timed loops (liveness tick, takeover polls, cycles) can land one call more or less in the
window: a difference is flagged when some call reads more in ``worker`` mode than one more call per timed source in
the window explains (a call ``lease`` mode does not make at all is never explained so).

    .venv/bin/python -m bench.cost_model [--liveness lease|worker|both] [--configs kcl] [--workers 2] [--shards 8]
        [--minutes 2] [--warmup 70] [--json P]

from the repository root (``python bench/cost_model`` with the same flags runs it too).

The last two lines read ``writes per minute at 10000 leases/100 workers: lease A, worker B, ratio R×`` and
``writes per minute at 1000 leases/20 workers: lease A, worker B, ratio R×`` (A, B: calls per minute, whole;
R = A/B). Exit status 1 when R < 10 at 1 000/20 or < 50 at 10 000/100, when ``worker`` mode reads more than ``lease``
mode at some scale, or when a check of the window failed (each said on its own line before the last two).

The package, one module per part of the run, each importing only the ones listed before it: :mod:`.configs` (what
each configuration sets), :mod:`.prices` (prices and scales), :mod:`.sizes` (DynamoDB's size and unit rules),
:mod:`.counting` (the botocore hooks and the purpose of a call), :mod:`.schedule` (the leader Lambda on its
schedule), :mod:`.scale` (item sizes at scale), :mod:`.measure` (one configuration, measured),
:mod:`.extrapolation` (formulas, totals, comparison, checks), :mod:`.report` (printing and ``--json``) and
:mod:`.cli` (``main``); ``__main__`` runs it. Constants of the library it models (the parallel-scan threshold and
segments, the notice's key limit) are imported from ``worker_lib``, never copied.
"""
