"""The public API: ``worker_lib`` exports what docs/api.md lists, lazily, without importing boto3."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing

import pytest

import worker_lib
from tests.support.processes import PROCESS_START_S, REPO
from tests.support.stalls import hang_bound_s

START_BOUND_S = hang_bound_s(PROCESS_START_S)
"""A fresh interpreter importing the package."""

PROMISED = {
    "Worker",
    "WorkerConfig",
    "FunctionProcessor",
    "AsyncFunctionProcessor",
    "RecordProcessor",
    "Checkpointer",
    "AsyncCheckpointer",
    "KinesisRecord",
    "InitialPosition",
    "ShardleaseError",
    "ConfigError",
    "DependencyError",
    "EndpointUnreachableError",
    "CredentialsError",
    "ThrottledError",
    "TableMissingError",
    "TableSchemaError",
    "StreamMissingError",
    "MissingExtraError",
}


def test_every_exported_name_resolves_to_the_object_its_module_defines() -> None:
    # GIVEN the package's __all__
    exported = [name for name in worker_lib.__all__ if name != "__version__"]
    # WHEN each name is looked up on the package
    for name in exported:
        value = getattr(worker_lib, name)
        # THEN it is the very object of the defining module, and dir() lists it
        assert getattr(sys.modules[worker_lib._EXPORTS[name]], name) is value
        assert name in dir(worker_lib)
    # AND the names the README and docs/api.md promise are all there
    assert set(exported) >= PROMISED
    assert set(exported) == set(worker_lib._EXPORTS)


def test_every_error_type_in_core_errors_is_public() -> None:
    # GIVEN every exception class core/errors.py defines
    from worker_lib.core import errors

    defined = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}
    # WHEN compared with the public names THEN none is left out
    assert defined <= set(worker_lib.__all__)


def _worker_lib_types(cls: type) -> set[type]:
    """The worker_lib classes in the annotations of ``cls``'s fields (inside ``X | None``, tuples, ...), and in
    theirs, for each one that is itself a dataclass."""
    found: set[type] = set()
    pending = [cls]
    while pending:
        hints = list(typing.get_type_hints(pending.pop()).values())
        while hints:
            hint = hints.pop()
            hints.extend(typing.get_args(hint))
            if isinstance(hint, type) and hint.__module__.startswith("worker_lib.") and hint not in found:
                found.add(hint)
                if dataclasses.is_dataclass(hint):
                    pending.append(hint)
    return found


def test_the_type_of_every_worker_config_field_is_public() -> None:
    # GIVEN WorkerConfig's fields, and the fields of the configuration classes among them
    types = _worker_lib_types(worker_lib.WorkerConfig)
    # WHEN their worker_lib types are looked up on the package THEN each is exported, as the same object
    assert {"LeaseConfig", "FailureConfig", "FailureAction", "RetrievalConfig", "RetrievalMode"} <= {
        t.__name__ for t in types
    }
    for cls in types:
        assert cls.__name__ in worker_lib.__all__, f"{cls.__module__}.{cls.__name__} is not exported"
        assert getattr(worker_lib, cls.__name__) is cls


def test_what_docs_api_tells_users_to_import_is_exported() -> None:
    # GIVEN docs/api.md: its imports, the configuration classes and the errors it names
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    imported = {n.strip() for line in re.findall(r"^from worker_lib import (.+)$", text, re.M) for n in line.split(",")}
    configs = set(re.findall(r"`([A-Z]\w*Config)\b", text))
    errors = set(re.findall(r"^\| `(\w+)", text.split("## Errors", 1)[1], re.M))
    # WHEN compared with the package's exports THEN each is there, and the page imports from no internal module
    assert {"Worker", "LeaseConfig", "RecordFailedError", "ConfigError"} <= imported | configs | errors
    assert imported | configs | errors <= set(worker_lib.__all__)
    internal = re.findall(r"^from (worker_lib\.\w+)", text, re.M)
    assert set(internal) <= {"worker_lib.cdk", "worker_lib.spark", "worker_lib.testing"}


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    # GIVEN a name the package does not export
    # WHEN it is looked up THEN AttributeError names it (hasattr and getattr defaults keep working)
    with pytest.raises(AttributeError, match="no attribute 'Leader'"):
        _ = worker_lib.Leader
    assert not hasattr(worker_lib, "config")
    assert getattr(worker_lib, "nope", None) is None


def test_importing_the_package_imports_neither_boto3_nor_the_worker() -> None:
    # GIVEN a fresh interpreter
    code = (
        "import sys, worker_lib\n"
        "heavy = sorted(m for m in ('boto3', 'botocore', 'worker_lib.worker.worker') if m in sys.modules)\n"
        "print(','.join(heavy) or 'none')\n"
        "from worker_lib import ConfigError, InitialPosition\n"
        "print('boto3' in sys.modules)\n"
    )
    # WHEN it imports worker_lib, then two names that need no AWS
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=START_BOUND_S, check=False
    )
    # THEN nothing heavy was imported, before or after
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["none", "False"]


def test_docs_api_lists_every_variable_of_the_exported_configuration_classes() -> None:
    # GIVEN every SHARDLEASE_* variable a public configuration class reads (ScalingConfig's: docs/autoscaling.md)
    from worker_lib.core.env import _VARIABLE, EnvSettings

    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    classes = [getattr(worker_lib, name) for name in worker_lib.__all__ if name.endswith("Config")]
    variables = {
        field.metadata[_VARIABLE][0]
        for cls in classes
        if issubclass(cls, EnvSettings) and cls.__name__ != "ScalingConfig"
        for field in dataclasses.fields(cls)
        if _VARIABLE in field.metadata
    }
    # WHEN compared with the page THEN each is there (lanes, the failure policy, ... among them)
    assert {"SHARDLEASE_PARALLELISM", "SHARDLEASE_FAILURE_POLICY", "SHARDLEASE_FAILOVER_TIME_MS"} <= variables
    assert sorted(v for v in variables if f"`{v}`" not in text) == []
