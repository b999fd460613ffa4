"""``shardlease demo``: the whole system on local emulators (extra ``demo``). The command line's side, the only
part that prints, is worker_lib/cli/demo.py.

The bounds below are documented in the README's "Command line" section and enforced by both the command line
(exit 2) and :func:`worker_lib.tools.demo.runner.run_demo`: every worker is a Python process next to two
emulators, a producer and the leader on one machine, and 16 of them already saturate a 2-core laptop; kinesalite
serves 64 shards comfortably (the demo splits one and merges two). ``--duration`` is capped at a day.
"""

from __future__ import annotations

SCENARIOS = ("default", "shard-sync")
WORKERS_MIN, WORKERS_MAX = 1, 16
SHARDS_MIN, SHARDS_MAX = 3, 64  # at least 3: the demo splits one shard and merges two others
DURATION_MIN_DEFAULT_S = 30.0  # the default scenario's timeline needs about this long to play out
DURATION_MAX_S = 86_400.0
