"""``python -m bench.cost_model`` (from the repository root) or ``python bench/cost_model``: run the cost model.

Either way ``bench/`` goes first on the import path, as it is for a script in ``bench/``: the configurations import
:mod:`kcl3_timings` (shared with bench/failover.py), and the package is then imported as ``cost_model`` whichever
way it was started, so its modules exist once.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parent.parent)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from cost_model.cli import main  # noqa: E402  (after bench/ is on the path)

if __name__ == "__main__":
    raise SystemExit(main())
