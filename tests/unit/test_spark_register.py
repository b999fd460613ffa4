"""register()'s Spark version check (pure: no Spark needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from worker_lib.core.errors import ConfigError
from worker_lib.spark import register, spark_version_problem


@pytest.mark.parametrize("version", ["4.2.0", "4.3.0", "4.2.0.dev1", "5.0.0", "4.10.1"])
def test_spark_4_2_and_later_are_accepted(version: str) -> None:
    # GIVEN a Spark 4.2 or later THEN there is nothing to say
    assert spark_version_problem(version) is None


@pytest.mark.parametrize("version", ["3.5.1", "3.5.1-amzn-0", "4.1.0", "4.0.0"])
def test_an_older_spark_gets_one_line_naming_both_versions(version: str) -> None:
    # GIVEN a Spark older than 4.2 THEN one line says what is needed and what this is
    problem = spark_version_problem(version)
    assert problem is not None and "\n" not in problem
    assert "Spark >= 4.2" in problem and version in problem


def test_an_unreadable_version_is_refused_with_the_requirement() -> None:
    assert "Spark >= 4.2" in (spark_version_problem("unknown") or "")


def test_register_refuses_an_older_session_before_registering() -> None:
    # GIVEN a session whose Spark is 3.5 (the installed pyspark is new enough)
    registered: list[object] = []
    session = SimpleNamespace(version="3.5.1", dataSource=SimpleNamespace(register=registered.append))
    # WHEN the source is registered THEN one ConfigError line says why, and nothing was registered
    with pytest.raises(ConfigError, match=r"needs Spark >= 4\.2 \(this is 3\.5\.1\)"):
        register(session)
    assert registered == []
