"""Optional features without their extra: one error line naming the extra to install, never a ModuleNotFoundError."""

from __future__ import annotations

import sys

import pytest

from worker_lib.core.errors import MissingExtraError
from worker_lib.core.extras import require


def test_require_names_the_extra_when_the_module_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a module that cannot be imported
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    # WHEN a feature requires it THEN the error is one line naming the extra, and still an ImportError
    with pytest.raises(MissingExtraError) as caught:
        require("matplotlib", extra="plot", what="simulate --plot")
    assert str(caught.value) == "simulate --plot needs the 'plot' extra: pip install 'shardlease[plot]'"
    assert isinstance(caught.value, ImportError)
    assert "\n" not in str(caught.value)


def test_the_spark_source_without_pyspark_names_the_spark_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN pyspark is not installed
    monkeypatch.setitem(sys.modules, "pyspark.sql.datasource", None)
    from worker_lib.spark import register

    # WHEN a Spark application registers the source THEN it is told which extra to install
    with pytest.raises(MissingExtraError, match=r"the Spark source needs the 'spark' extra"):
        register(object())
