"""Reading settings from the environment: the public helpers every ``from_env()`` uses.

Every configuration class reads the environment only in its ``from_env(env=None)`` class method, through these
helpers, so that one variable is parsed the same way wherever it is read, and a bad value is one
:class:`~worker_lib.core.errors.ConfigError` line naming the variable (docs/api.md lists every variable).
An empty value counts as unset: ``FOO=`` in a shell or a container definition means "use the default".

:func:`read_settings` builds a configuration dataclass whose fields name their variables (:func:`setting`); a
variable left unset means the field's default, so that each default is written once, on the field. A process reads
its environment once, at its edge (the top-level ``from_env()``), and hands that mapping down to the nested
``from_env(env)``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from worker_lib.core.errors import ConfigError

if TYPE_CHECKING:
    from typing import Self  # Python 3.11; annotations only, so 3.10 runs this module

    from _typeshed import DataclassInstance

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
_ACCEPTED = "1/0, true/false, yes/no or on/off"
_NO_LIMIT = ("0", "none")

_T = TypeVar("_T")
_N = TypeVar("_N", int, float)
_C = TypeVar("_C", bound="DataclassInstance")

Reader = Callable[[Mapping[str, str], str, Any], Any]
"""How one variable is read: ``reader(env, variable, default)``, ``default`` being the field's declared default."""


def environ(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """``env`` if given (tests, the Lambda handler), else the process environment."""
    return os.environ if env is None else env


def _raw(env: Mapping[str, str], name: str) -> str | None:
    """The stripped value of ``name``; ``None`` when it is unset or blank."""
    raw = env.get(name)
    return raw.strip() if raw is not None and raw.strip() else None


def env_str(env: Mapping[str, str], name: str, default: str = "") -> str:
    """The stripped value of ``name``, or ``default`` when it is unset or blank."""
    raw = _raw(env, name)
    return default if raw is None else raw


def env_lower(env: Mapping[str, str], name: str, default: str = "") -> str:
    """As :func:`env_str`, in lower case (a mode's name)."""
    return env_str(env, name, default).lower()


def _number(env: Mapping[str, str], name: str, default: _N, convert: Callable[[str], _N], what: str) -> _N:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        return convert(raw)
    except ValueError:
        raise ConfigError(f"{name}={env[name]!r} is not {what}") from None


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """A whole number, or ``default`` when unset or blank."""
    return _number(env, name, default, int, "a whole number")


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    """A number, or ``default`` when unset or blank."""
    return _number(env, name, default, float, "a number")


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


def env_optional_bool(env: Mapping[str, str], name: str, default: bool | None = None) -> bool | None:
    """A boolean where unset or blank is ``default`` (``None``: "decide by the other settings")."""
    return default if _raw(env, name) is None else env_bool(env, name, False)


def _limit(env: Mapping[str, str], name: str, default: _N | None, read: Callable[..., _N]) -> _N | None:
    raw = _raw(env, name)
    if raw is None:
        return default
    return None if raw.lower() in _NO_LIMIT else read(env, name, 0)


def env_optional_int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    """A limit where ``0`` or ``none`` mean "no limit" (``None``); unset or blank is ``default`` (no limit)."""
    return _limit(env, name, default, env_int)


def env_optional_float(env: Mapping[str, str], name: str, default: float | None = None) -> float | None:
    """As :func:`env_optional_int`, for a number."""
    return _limit(env, name, default, env_float)


def env_parsed(parse: Callable[[str, str], _T]) -> Callable[[Mapping[str, str], str, _T], _T]:
    """A reader of a variable that ``parse(value, variable)`` turns into a value (an enum, a timestamp); unset or
    blank is the default."""

    def read(env: Mapping[str, str], name: str, default: _T) -> _T:
        raw = _raw(env, name)
        return default if raw is None else parse(raw, name)

    return read


_VARIABLE = "shardlease.variable"  # the field metadata key of a setting's variable and reader


def _reader_for(default: object) -> Reader:
    if isinstance(default, bool):
        return env_bool
    if isinstance(default, int):
        return env_int
    if isinstance(default, float):
        return env_float
    if isinstance(default, str):
        return env_str
    raise TypeError(f"a setting whose default is {default!r} needs its reader")


def setting(default: Any, variable: str, read: Reader | None = None) -> Any:
    """A dataclass field that :func:`read_settings` reads from ``variable``: ``read(env, variable, default)``, by
    default the reader of the default's type (bool, int, float, str). The default is written here only."""
    return dataclasses.field(default=default, metadata={_VARIABLE: (variable, read or _reader_for(default))})


class EnvSettings:
    """Base of a config class whose fields are :func:`setting` fields: :meth:`from_env` reads them all."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """Every setting from ``env`` (default: the process environment); unset or blank: the field's default."""
        return cast("Self", read_settings(cast(Any, cls), env))


def read_settings(cls: type[_C], env: Mapping[str, str] | None, /, **given: Any) -> _C:
    """``cls`` with each of its :func:`setting` fields read from its variable (unset or blank: the field's default);
    ``given`` values that are not ``None`` win, and their variables are not read. ``env``: the caller's mapping
    (default: the process environment)."""
    e = environ(env)
    values = {name: value for name, value in given.items() if value is not None}
    for f in dataclasses.fields(cls):
        if _VARIABLE in f.metadata and f.name not in values:
            variable, read = f.metadata[_VARIABLE]
            values[f.name] = read(e, variable, f.default)
    return cls(**values)


_Choice = TypeVar("_Choice", bound=enum.Enum)


def parse_choice(
    kind: type[_Choice], value: str | _Choice, *, name: str, aliases: Mapping[str, _Choice] | None = None
) -> _Choice:
    """One of an enum's values, by value (any case, ``_`` read as ``-``) or an older alias; a bad one is a
    :class:`ConfigError` naming ``name`` and every value accepted."""
    if isinstance(value, kind):
        return value
    text = str(value).strip().lower().replace("_", "-")
    if aliases and text in aliases:
        return aliases[text]
    try:
        return kind(text)
    except ValueError:
        values = [str(member.value) for member in kind]
        expected = values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"
        raise ConfigError(f"invalid {name} {value!r}: expected {expected}") from None


__all__ = [
    "FALSE_WORDS",
    "TRUE_WORDS",
    "EnvSettings",
    "Reader",
    "env_bool",
    "env_float",
    "env_int",
    "env_lower",
    "env_optional_bool",
    "env_optional_float",
    "env_optional_int",
    "env_parsed",
    "env_str",
    "environ",
    "parse_bool",
    "parse_choice",
    "read_settings",
    "setting",
]
