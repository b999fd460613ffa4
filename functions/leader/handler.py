"""The leader Lambda from a clone of this repository: a re-export of the packaged handler.

The CDK construct deploys :func:`worker_lib.leader.lambda_handler.handler` from the installed package; this module
keeps ``functions.leader.handler.handler`` working for scripts and tests that load the handler from here.
"""

from __future__ import annotations

from worker_lib.leader.lambda_handler import handler, observer, warm_clients

__all__ = ["handler", "observer", "warm_clients"]
