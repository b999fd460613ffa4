"""``python -m worker_lib.cli``: the same as the ``shardlease`` command."""

from __future__ import annotations

import sys

from worker_lib.cli.main import main

sys.exit(main())
