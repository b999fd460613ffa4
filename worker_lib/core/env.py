"""Reading settings from the environment: the public helpers every ``from_env()`` uses.

Every configuration class reads the environment only in its ``from_env(env=None)`` class method, through these
helpers, so that one variable is parsed the same way wherever it is read, and a bad value is one
:class:`~worker_lib.core.errors.ConfigError` line naming the variable (docs/api.md lists every variable).
An empty value counts as unset: ``FOO=`` in a shell or a container definition means "use the default".
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from worker_lib.core.errors import ConfigError

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
_ACCEPTED = "1/0, true/false, yes/no or on/off"


def environ(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """``env`` if given (tests, the Lambda handler), else the process environment."""
    return os.environ if env is None else env


def env_str(env: Mapping[str, str], name: str, default: str = "") -> str:
    """The stripped value of ``name``, or ``default`` when it is unset or blank."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    return raw.strip()


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """A whole number, or ``default`` when unset or blank."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    """A number, or ``default`` when unset or blank."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None


def parse_bool(raw: str | None, *, name: str, default: bool) -> bool:
    """The one boolean parser: 1/0, true/false, yes/no, on/off (any case); blank or ``None`` is ``default``.

    ``name`` is what the error message calls the setting (a variable, a CLI flag, a Spark option).
    """
    if raw is None or not str(raw).strip():
        return default
    value = str(raw).strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean: expected {_ACCEPTED}")


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A boolean variable, parsed by :func:`parse_bool`."""
    return parse_bool(env.get(name), name=name, default=default)


def env_optional_int(env: Mapping[str, str], name: str) -> int | None:
    """A limit where unset, blank, ``0`` or ``none`` mean "no limit" (``None``)."""
    raw = env.get(name)
    if raw is None or raw.strip().lower() in ("", "0", "none"):
        return None
    return env_int(env, name, 0)


def env_optional_float(env: Mapping[str, str], name: str) -> float | None:
    """As :func:`env_optional_int`, for a number."""
    raw = env.get(name)
    if raw is None or raw.strip().lower() in ("", "0", "none"):
        return None
    return env_float(env, name, 0.0)


__all__ = [
    "FALSE_WORDS",
    "TRUE_WORDS",
    "env_bool",
    "env_float",
    "env_int",
    "env_optional_float",
    "env_optional_int",
    "env_str",
    "environ",
    "parse_bool",
]
