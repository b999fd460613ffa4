"""Tools around the library, not needed to run it: the simulator (`shardlease simulate`), the KCL 2.x baseline for
benchmarks, and the demo (extra ``demo``). Nothing here prints: worker_lib/cli/ does."""
