"""Optional dependencies: import them where a feature needs them, or fail with one line naming the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from worker_lib.core.errors import MissingExtraError


def require(module: str, *, extra: str, what: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` ("<what> needs the '<extra>' extra: pip install ...")."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(what, extra) from exc
