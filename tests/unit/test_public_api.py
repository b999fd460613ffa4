"""The public API: ``worker_lib`` exports what docs/api.md lists, lazily, without importing boto3."""

from __future__ import annotations

import subprocess
import sys

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
    "RecordProcessor",
    "Checkpointer",
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
