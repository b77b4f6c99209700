"""``efo run``'s start (sparkbridge.app.run) in order, without Spark or AWS: the read-only checks
first, then Spark, the sink's file system and its test write, and only then the changes (a consumer
registered, a table created: Service.preflight). A check that fails stops Spark and changes nothing.
The checks themselves run on a real session and the local stack in tests/spark/test_sink_failures.py
and tests/integration/test_errors.py."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from efo import preflight
from efo.config import load_settings
from efo.errors import ConfigError, EfoError
from sparkbridge import app, session


class Started:
    """Each step of the start, in the order it happened."""

    def __init__(self) -> None:
        self.steps: list[str] = []


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Started:
    for name in list(os.environ):
        if name.upper().startswith("EFO_"):
            monkeypatch.delenv(name)
    record = Started()

    class Spark:
        def stop(self) -> None:
            record.steps.append("spark stopped")

    class Service:
        def __init__(self, settings: Any) -> None:
            pass

        def preflight(self) -> None:
            record.steps.append("changes")  # registers the consumer, creates the table
            raise EfoError("stop here: the start would go on to read")

    def step(name: str, result: Any = None) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            record.steps.append(name)
            return result

        return call

    monkeypatch.setattr(app, "configure_logging", step("logging"))
    monkeypatch.setattr(app, "make_sink", step("sink module", object()))
    monkeypatch.setattr(preflight, "inspect", step("read-only checks", preflight.Plan()))
    monkeypatch.setattr(app, "Service", Service)
    monkeypatch.setattr(app, "build_session", step("spark started", Spark()))
    monkeypatch.setattr(app, "require_filesystems", step("file system"))
    monkeypatch.setattr(app, "require_writable", step("test write"))
    return record


def settings() -> Any:
    return load_settings(stream="orders", app="lake", sink="parquet:/data/orders")


def test_the_changes_come_after_every_check_and_spark(started: Started) -> None:
    with pytest.raises(EfoError, match="stop here"):
        app.run(settings())
    assert started.steps == [
        "logging",
        "sink module",
        "read-only checks",
        "spark started",
        "file system",
        "test write",
        "changes",
        "spark stopped",
    ]


def test_a_sink_path_that_cannot_be_written_stops_spark_and_changes_nothing(
    started: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unwritable(*args: Any) -> None:
        started.steps.append("test write")
        raise ConfigError("sink (EFO_SINK) = 'parquet:/data/orders': cannot write under /data/orders")

    monkeypatch.setattr(app, "require_writable", unwritable)
    with pytest.raises(ConfigError, match="cannot write under"):
        app.run(settings())
    assert "changes" not in started.steps and started.steps[-2:] == ["test write", "spark stopped"]


def test_without_pyspark_a_spark_start_is_a_config_error_saying_what_to_install(
    started: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyspark loads only with the session (the arrow sink's start loads none): without the spark
    extra, that start says what to install, as the Spark side's import did when it loaded pyspark."""
    monkeypatch.setitem(sys.modules, "pyspark.sql", None)  # as if not installed: its import fails
    with pytest.raises(ConfigError, match=r"install efo with its spark extra \(pip install 'efo\[spark\]'\)"):
        session.build_session(settings())
