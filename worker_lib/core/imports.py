"""Resolving ``"module:attr"`` names of user code (a record processor, a stream tracker) with one-line errors."""

from __future__ import annotations

import importlib
from typing import Any

from worker_lib.core.errors import ConfigError


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def import_attr(spec: str, *, what: str, example: str) -> Any:
    """The object ``"module:attr"`` names (dots allowed in ``attr``, e.g. ``Outer.Inner``); a :class:`ConfigError`
    beginning ``invalid {what} {spec!r}:`` with one line saying what is wrong otherwise (a missing module, a broken
    user module, a missing attribute), never a traceback."""
    module_name, sep, attr_path = spec.strip().partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(f"invalid {what} {spec!r}: expected MODULE:ATTR, e.g. {example}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(f"invalid {what} {spec!r}: no module named {exc.name!r}") from None
        raise ConfigError(f"invalid {what} {spec!r}: importing {module_name!r} failed: {_one_line(exc)}") from exc
    except Exception as exc:  # a broken user module: report it in one line, never a traceback
        raise ConfigError(f"invalid {what} {spec!r}: importing {module_name!r} failed: {_one_line(exc)}") from exc

    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(
                f"invalid {what} {spec!r}: {getattr(target, '__name__', module_name)!r} has no attribute {part!r}"
            ) from None
    return target
